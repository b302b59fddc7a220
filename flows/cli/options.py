"""Command-line options generated from a service's settings object, so each option is declared once.

A settings class (pydantic-settings, frozen) is the one declaration of a service's options: its field
descriptions are the ``--help`` text, the Prefect flow's parameter docs and the environment variables'
meaning. :func:`settings_command` turns its fields into typer options (``snake_case`` ->
``--kebab-case``; a ``json_schema_extra={"flag": "-k"}`` adds a short flag; booleans get
``--x/--no-x``) and hands the command the settings object built from what the user typed: options left
at their default are not passed, so the environment (``PRMLOOP_SAMPLE_K=16``) still applies.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import typer
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from prmloop.flows.cli.app import usage_error

__all__ = ["settings_command", "validation_message"]

S = TypeVar("S", bound=BaseSettings)


def validation_message(error: ValidationError) -> str:
    """One line for all wrong options: ``--name 'value': what is wrong`` (the value only where the
    message does not already name it, as a validator's own message does)."""
    parts = []
    for item in error.errors():
        name = ".".join(str(p) for p in item["loc"])
        flag = f"-{name}" if len(name) == 1 else f"--{name.replace('_', '-')}"
        # A validator's own message is the text; pydantic's "Value error, " prefix says nothing.
        message = str(item["msg"]).removeprefix("Value error, ")
        value = item.get("input")
        if name and item["type"] != "value_error" and isinstance(value, str | int | float):
            flag = f"{flag} {value!r}"
        parts.append(f"{flag}: {message}" if name else message)
    return "; ".join(parts)


def _choices(annotation: Any) -> tuple[str, ...] | None:
    """The values of a ``Literal[...]`` option (``None`` for any other type)."""
    if get_origin(annotation) is Literal:
        return tuple(str(v) for v in get_args(annotation))
    return None


def _parameter(name: str, field: Any) -> inspect.Parameter:
    # One-letter fields are the papers' symbols (k, m, n): a short flag alone, as people type them.
    flag = f"-{name}" if len(name) == 1 else f"--{name.replace('_', '-')}"
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    declarations = [flag]
    if field.annotation is bool:
        declarations = [f"{flag}/--no-{name.replace('_', '-')}"]
    if "flag" in extra and extra["flag"] not in declarations:
        declarations.append(str(extra["flag"]))
    default = field.get_default(call_default_factory=True)
    choices = _choices(field.annotation)
    annotation = field.annotation
    metavar = None
    if choices is not None:
        # The settings check the choice (one line, exit 2); click's own check would print a five-line box.
        annotation, metavar = str, "|".join(choices)
    option = typer.Option(*declarations, help=field.description or "", show_default=True, metavar=metavar)
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[annotation, option]
    )


def _typed(ctx: typer.Context, name: str) -> bool:
    """Did the user give option ``name`` (rather than leave it at its default)?"""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name != "DEFAULT"


def settings_command(
    app: typer.Typer,
    settings_cls: type[S],
    *,
    name: str,
    exclude: Iterable[str] = (),
) -> Callable[[Callable[[S], None]], Callable[[S], None]]:
    """Register the decorated ``run(settings)`` as command ``name`` with one option per settings field.

    The decorated function's docstring is the command's help. A value the settings refuse (an unknown
    strategy, a negative count) is a one-line usage error naming the option and the valid values (exit code
    2), raised before the command (and so any flow run) starts.
    """
    skipped = {*exclude, "api_key"}  # a secret is never a command-line option (others see argv): environment only
    own = set(settings_cls.__annotations__)
    # The service's own options first, then the shared ones (model, simulator) it inherits.
    names = sorted(settings_cls.model_fields, key=lambda n: n not in own)
    params = [_parameter(n, settings_cls.model_fields[n]) for n in names if n not in skipped]

    def decorate(run: Callable[[S], None]) -> Callable[[S], None]:
        def command(ctx: typer.Context, **kwargs: Any) -> None:
            given = {k: v for k, v in kwargs.items() if _typed(ctx, k)}
            try:
                settings = settings_cls(**given)
            except ValidationError as error:
                usage_error(validation_message(error))
            run(settings)

        context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
        command.__signature__ = inspect.Signature([context, *params])  # type: ignore[attr-defined]
        command.__annotations__ = {"ctx": typer.Context, **{p.name: p.annotation for p in params}}
        command.__doc__ = run.__doc__
        command.__name__ = run.__name__
        app.command(name)(command)
        return run

    return decorate
