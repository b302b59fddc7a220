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
from typing import Annotated, Any, TypeVar

import typer
from pydantic import ValidationError
from pydantic_settings import BaseSettings

__all__ = ["settings_command", "validation_message"]

S = TypeVar("S", bound=BaseSettings)


def validation_message(error: ValidationError) -> str:
    """One line per wrong option: ``--name: what is wrong``."""
    parts = []
    for item in error.errors():
        name = ".".join(str(p) for p in item["loc"])
        flag = f"-{name}" if len(name) == 1 else f"--{name.replace('_', '-')}"
        parts.append(f"{flag}: {item['msg']}" if name else item["msg"])
    return "; ".join(parts)


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
    option = typer.Option(*declarations, help=field.description or "", show_default=True)
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[field.annotation, option]
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
    strategy, a negative count) is a usage error naming the option (exit code 2).
    """
    skipped = set(exclude)
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
                raise typer.BadParameter(validation_message(error)) from None
            run(settings)

        context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
        command.__signature__ = inspect.Signature([context, *params])  # type: ignore[attr-defined]
        command.__annotations__ = {"ctx": typer.Context, **{p.name: p.annotation for p in params}}
        command.__doc__ = run.__doc__
        command.__name__ = run.__name__
        app.command(name)(command)
        return run

    return decorate
