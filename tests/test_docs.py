"""README.md and docs/*.md name only what exists: links resolve, every `prmloop` command and option is real.

Links: every relative link points at a file of the repository, and its ``#anchor`` at a heading of that
page (GitHub's slugs). Commands: every ``prmloop <command> [<subcommand>]`` in a code span or a code
block is a command of the CLI (read from the Typer app, not by running it), and every ``--option``
after it on the same line (up to the next ``prmloop``) is an option of that command.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

from prmloop.flows.cli import app

ROOT = Path(__file__).resolve().parents[1]
#: The folder beside the clone that the README asks for (design, papers, data): links may lead there.
SHARED = ROOT.parent / "shared"

_FENCE = re.compile(r"^\s*```")
_SPAN = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
#: ``prmloop`` as a command word: not ``prmloop.store``, ``prmloop_reader``, ``$PRMLOOP_HOME``, a path.
_COMMAND = re.compile(r"(?<![\w./$-])prmloop[ \t]+")
_WORD = re.compile(r"[a-z][a-z0-9-]*")
_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
#: A quoted argument (SQL, JSON, a path) is data: no command or option is read inside it.
_QUOTED = re.compile(r"(?<!\w)'[^']*'|(?<!\w)\"[^\"]*\"")


def pages() -> list[Path]:
    """The README and the manual beside it."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def split_page(text: str) -> tuple[list[tuple[int, str]], str]:
    """(line, code) for every code-block line and code span, and the prose with code blanked out."""
    code: list[tuple[int, str]] = []
    prose: list[str] = []
    in_block = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            in_block = not in_block
            prose.append("")
        elif in_block:
            code.append((number, line))
            prose.append("")
        else:
            prose.append(line)
    joined = "\n".join(prose)
    for span in _SPAN.finditer(joined):
        code.append((joined.count("\n", 0, span.start()) + 1, span.group(1).replace("\n", " ")))
    blanked = _SPAN.sub(lambda span: " " * len(span.group(0)), joined)
    return sorted(code), blanked


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor on a page (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    in_block = False
    for line in path.read_text().splitlines():
        if _FENCE.match(line):
            in_block = not in_block
            continue
        heading = None if in_block else _HEADING.match(line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path, text: str, root: Path = ROOT) -> Iterator[tuple[str, Path]]:
    """'file:line: why' for each relative link that leads nowhere, with the target (outside links too)."""
    _, prose = split_page(text)
    for match in _LINK.finditer(prose):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        where = f"{path.relative_to(root)}:{prose.count(chr(10), 0, match.start()) + 1}"
        file_part, _, anchor = target.partition("#")
        # normpath, not resolve: `../shared` may be a link to elsewhere and still count as the shared folder
        resolved = Path(os.path.normpath(path.parent / file_part)) if file_part else path
        if not resolved.exists():
            yield f"{where}: the link {target} leads to no file", resolved
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            yield f"{where}: the link {target} names no heading of {resolved.name}", resolved
        else:
            yield "", resolved


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def test_every_relative_link_resolves_to_a_file_and_a_heading() -> None:
    problems = []
    for page in pages():
        for problem, target in broken_links(page, page.read_text()):
            if problem and not _inside(target, SHARED):
                problems.append(problem)
            elif not _inside(target, ROOT) and not _inside(target, SHARED):
                problems.append(f"{page.name}: the link to {target} leaves the repository")
    assert not problems, "\n".join(problems)


def test_links_into_the_shared_folder_resolve() -> None:
    """`../shared` sits beside a clone (the README's first screen); without it, as the data tests, skip."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is missing: the README's links into it cannot be checked here")
    problems = [
        problem
        for page in pages()
        for problem, target in broken_links(page, page.read_text())
        if problem and _inside(target, SHARED)
    ]
    assert not problems, "\n".join(problems)


def _options(command: Any) -> set[str]:
    context = command.context_class(command)
    return {name for param in command.get_params(context) for name in (*param.opts, *param.secondary_opts)}


def command_problems(code: str, root: Any) -> Iterator[str]:
    """'why' for each `prmloop ...` in one line of code that names no command or an option it lacks."""
    text = _QUOTED.sub(" ", code)
    starts = [match.end() for match in _COMMAND.finditer(text)]
    for index, start in enumerate(starts):
        end = starts[index + 1] if index + 1 < len(starts) else len(text)
        words = [word.strip("();,") for word in text[start:end].split()]
        command, path = root, ["prmloop"]
        while hasattr(command, "commands") and words and _WORD.fullmatch(words[0]):
            if words[0] not in command.commands:
                yield f"`{' '.join(path)} {words[0]}`: no such command"
                break
            command = command.commands[words[0]]
            path.append(words.pop(0))
        else:
            known = _options(command)
            for option in _OPTION.findall(" ".join(words)):
                if option not in known:
                    yield f"`{' '.join(path)}` has no option {option}"


def _cli() -> Any:
    return typer.main.get_command(app)


def _as_command(fragment: str, root: Any) -> str:
    """A code span that starts with a command and names an option (`up --cluster`) reads as `prmloop up ...`."""
    words = fragment.split()
    if words and words[0] in root.commands and "--" in fragment:
        return f"prmloop {fragment}"
    return fragment


def test_every_prmloop_command_and_option_the_pages_name_exists() -> None:
    root = _cli()
    problems, named = [], 0
    for page in pages():
        code, _ = split_page(page.read_text())
        for line, fragment in ((line, _as_command(fragment, root)) for line, fragment in code):
            named += len(_COMMAND.findall(_QUOTED.sub(" ", fragment)))
            problems += [f"{page.relative_to(ROOT)}:{line}: {why}" for why in command_problems(fragment, root)]
    assert not problems, "\n".join(problems)
    assert named > 150, f"only {named} `prmloop` commands found in the pages: is the scan still reading them?"


def test_the_checks_find_what_is_wrong(tmp_path: Path) -> None:
    """A page with a missing command, a missing option, a dead link and a dead anchor: each is caught."""
    root = _cli()
    assert list(command_problems("prmloop sample --limit 2 --nosuch 3  # then prmloop status --json", root)) == [
        "`prmloop sample` has no option --nosuch"
    ]
    assert list(command_problems("prmloop bench nosuch --quick", root)) == ["`prmloop bench nosuch`: no such command"]
    assert list(command_problems("prmloop frobnicate", root)) == ["`prmloop frobnicate`: no such command"]
    assert list(command_problems("$(prmloop credentials nosuch)", root)) == [
        "`prmloop credentials nosuch`: no such command"
    ]
    assert list(command_problems(_as_command("up --nosuch", root), root)) == ["`prmloop up` has no option --nosuch"]
    assert _as_command("make test --jobs", root) == "make test --jobs"
    assert list(command_problems("python -m prmloop.flows.cli; prmloop_reader; $PRMLOOP_HOME", root)) == []
    assert list(command_problems('prmloop sql "SELECT 1 -- --not-an-option" --format csv', root)) == []
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n[ok](#a-page) [gone](nosuch.md) [`x`](page.md#nosuch)\n")
    problems = [problem for problem, _ in broken_links(page, page.read_text(), tmp_path) if problem]
    assert problems == [
        "page.md:3: the link nosuch.md leads to no file",
        "page.md:3: the link page.md#nosuch names no heading of page.md",
    ]
    code, _ = split_page("text `prmloop run\n--minutes 3` more\n\n```bash\nprmloop up  # `x`\n```\n")
    assert code == [(1, "prmloop run --minutes 3"), (5, "prmloop up  # `x`")]
