"""Documented commands cannot rot: README's and the tutorials' shell blocks run as written (tests/doc_commands.py
says how a page tells a server from a command), their Python is a file the same page runs, and every ``osfleet``
command line anywhere in the docs names a real command with real options."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import click
import pytest

from osfleet.cli import cli
from tests.conftest import REPO
from tests.doc_commands import SHELLS, Block, Page, Runner, parse

DOCS = REPO / "docs"
RUN_AS_WRITTEN = [REPO / "README.md", *sorted(p for p in (DOCS / "tutorials").glob("*.md") if p.name != "index.md")]
SNIPPET = re.compile(r'^\s*--8<--\s+"(?P<file>[^"]+)"\s*$')


def page_param(path: Path) -> object:
    page = parse(path)
    tier = page.tier or "vm"  # a page that does not say boots replicas, to be safe
    assert tier in ("system", "vm"), f"{path.name}: a page runs commands, so its tier is system or vm, not {tier}"
    marks = [getattr(pytest.mark, tier), pytest.mark.slow]
    if page.restores:  # a page that changes tracked files (a lab's Pulumi stack): one at a time, with the lab's tests
        marks += [pytest.mark.xdist_group("lab"), pytest.mark.machine_lab]
    return pytest.param(page, marks=marks, id=str(path.relative_to(REPO)))


def all_pages() -> list[Path]:
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]


# --- fast checks of every page -----------------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("path", RUN_AS_WRITTEN, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shell_block_says_how_it_runs(path: Path) -> None:
    """README and the tutorials are run as written, so none of their blocks may be skipped, and blocks meant for
    CI must be exactly what .ci/run runs."""
    page = parse(path)
    assert page.shell_blocks, f"{path.name} has no shell block to run"
    skipped = [f"line {b.line}: {b.directive}" for b in page.shell_blocks if b.kind == "skip"]
    assert not skipped, f"{path.name} may not skip a command: {skipped}"
    ci = {line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()}
    for block in page.shell_blocks:
        assert block.kind in ("run", "background", "stop", "cleanup", "ci"), (
            f"{path.name}:{block.line}: {block.directive}"
        )
        if block.kind == "ci":
            lines = [x for x in block.code.splitlines() if x.strip() and not x.startswith("#")]
            assert all(x.strip() in ci for x in lines), f"{path.name}:{block.line} is not what .ci/run runs"


@pytest.mark.unit
@pytest.mark.parametrize("path", RUN_AS_WRITTEN, ids=lambda p: str(p.relative_to(REPO)))
def test_python_on_a_page_is_a_file_the_page_runs(path: Path) -> None:
    """A tutorial's Python is included from a file (``--8<--``) that one of its shell blocks runs; README, which
    GitHub shows without includes, holds a file's text verbatim, and runs that file."""
    page = parse(path)
    commands = " ".join(b.code for b in page.shell_blocks)
    for block in (b for b in page.blocks if b.lang == "python"):
        includes = [SNIPPET.match(x) for x in block.code.splitlines() if x.strip()]
        if all(includes):
            files = [m.group("file") for m in includes if m]
        else:
            same = [p for p in (REPO / "docs_src").glob("*.py") if p.read_text() == block.code]
            assert same, f"{path.name}:{block.line}: inline Python that is no file of docs_src/ (include one)"
            files = [same[0].name]
        for name in files:
            found = [base / name for base in (REPO, REPO / "docs_src", REPO / "examples") if (base / name).is_file()]
            assert found, f"{path.name}:{block.line}: {name} does not exist"
            rel = str(found[0].relative_to(REPO))
            assert rel in commands, f"{path.name}:{block.line}: no shell block of the page runs {rel}"


PREFIXES = {"flock": 1, "timeout": 1, "exec": 0, "time": 0, "nohup": 0, "sudo": 0}  # words before a command


def osfleet_command_lines(text: str) -> list[list[str]]:
    """The argument lists of every ``osfleet`` invocation in shell code (continued lines joined; ``&&``, ``|``,
    ``;`` and ``$(...)`` separate commands; comments dropped)."""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        line = line.replace('"$(', " ; ").replace(')"', " ").replace("$(", " ; ").replace(")", " ")
        for part in re.split(r"&&|\|\||[|;&]", line):
            try:
                words = shlex.split(part)
            except ValueError:
                continue
            while words and (re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]) or words[0] in PREFIXES):
                words = words[1 + PREFIXES.get(words[0], 0) :]  # VAR=value, flock LOCK, timeout N, exec ...
            if words and (words[0] == "osfleet" or words[0].endswith("/osfleet")):
                found.append(words[1:])
    return found


def typed_lines(block: Block) -> str:
    """The shell code a reader types from a block: a ``console`` block's ``$ `` lines alone (the rest is what the
    commands print, such as ``osfleet mcp: serving ...``), every line of any other."""
    if block.lang != "console":
        return block.code
    joined = block.code.replace("\\\n", " ").splitlines()
    return "\n".join(line[2:] for line in joined if line.startswith("$ "))


def check_command(args: list[str]) -> str | None:
    """None when ``osfleet ARGS`` names a command and options that exist; else what is wrong."""
    command: click.Command = cli
    path = ["osfleet"]
    rest = list(args)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(click.Context(command, info_name=path[-1]), rest[0])  # the root loads lazily
        if sub is None:
            return f"{' '.join(path)} has no command {rest[0]!r}"
        command, path, rest = sub, [*path, rest[0]], rest[1:]
    if isinstance(command, click.Group) and not rest:
        return None  # a group alone prints its help
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"-h", "--help"}
    for word in rest:
        if word.startswith("--") or (word.startswith("-") and len(word) == 2 and word[1].isalpha()):
            name = word.split("=", 1)[0]
            if name not in known:
                return f"{' '.join(path)} has no option {name}"
    return None


@pytest.mark.unit
def test_every_documented_osfleet_command_exists() -> None:
    problems, seen = [], 0
    for path in all_pages():
        for block in (b for b in parse(path).blocks if b.lang in SHELLS | {"text", "console", ""}):
            for args in osfleet_command_lines(typed_lines(block)):
                seen += 1
                wrong = check_command(args)
                if wrong:
                    problems.append(f"{path.relative_to(REPO)}:{block.line}: {wrong}")
    assert seen > 20, f"only {seen} osfleet command lines found: the parser is broken"
    assert not problems, "\n".join(problems)


@pytest.mark.unit
def test_the_command_check_catches_renames() -> None:
    assert check_command(["host", "serve", "--port", "8080"]) is None
    assert check_command(["host", "serve", "--prot", "8080"]) == "osfleet host serve has no option --prot"
    assert check_command(["hosts", "serve"]) == "osfleet has no command 'hosts'"
    assert osfleet_command_lines('eval "$(.venv/bin/osfleet infra env)" && osfleet lab up --hosts 2  # two') == [
        ["infra", "env"],
        ["lab", "up", "--hosts", "2"],
    ]


# --- the pages run as written ------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", [page_param(p) for p in RUN_AS_WRITTEN])
def test_page_runs_as_written(page: Page) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    not_run = Runner(page, REPO, env).run_page()
    assert all(": ci" in x for x in not_run), not_run


SAMPLE_PAGE = """# A page

<!-- docs-test: page system timeout=60 restores=state.txt -->

```sh
export GREETING=hello
echo changed > state.txt
```

<!-- docs-test: background until=http://127.0.0.1:{port}/ -->
```sh
python3 -m http.server {port} --bind 127.0.0.1
```

```sh
test "$GREETING" = hello
curl -sf http://127.0.0.1:{port}/ > /dev/null
```

<!-- docs-test: stop -->
```sh
! curl -sf http://127.0.0.1:{port}/ 2> /dev/null
```

<!-- docs-test: ci -->
```sh
./scripts/setup && .venv/bin/python -m pytest
```
"""


@pytest.mark.system
def test_the_runner_runs_a_page_as_a_reader_would(tmp_path: Path) -> None:
    """Exports carry over, a server runs until its URL answers and stops on Ctrl-C, a changed file is put back."""
    from tests.conftest import free_port

    page_file = tmp_path / "page.md"
    page_file.write_text(SAMPLE_PAGE.replace("{port}", str(free_port())))
    (tmp_path / "state.txt").write_text("original\n")
    page = parse(page_file)
    assert (page.tier, page.timeout, page.restores) == ("system", 60.0, ["state.txt"])
    assert [b.kind for b in page.shell_blocks] == ["run", "background", "run", "stop", "ci"]
    not_run = Runner(page, tmp_path, dict(os.environ)).run_page()
    assert not_run == [f"page.md:{page.shell_blocks[-1].line}: ci"]
    assert (tmp_path / "state.txt").read_text() == "original\n"


@pytest.mark.system
def test_a_failing_block_fails_the_page_with_its_output(tmp_path: Path) -> None:
    page_file = tmp_path / "page.md"
    page_file.write_text("```sh\necho before\nfalse\necho never\n```\n")
    with pytest.raises(AssertionError, match=r"page.md:1 failed \(exit 1\)[\s\S]*before"):
        Runner(parse(page_file), tmp_path, dict(os.environ)).run_page()


@pytest.mark.unit
def test_a_console_blocks_output_is_not_taken_for_a_command() -> None:
    block = Block("console", "$ osfleet mcp serve --transport http \\\n  --port 8765\nosfleet mcp: serving\n", 1)
    assert osfleet_command_lines(typed_lines(block)) == [["mcp", "serve", "--transport", "http", "--port", "8765"]]


CLEANUP_PAGE = """```sh
echo up > made.txt
```

```sh
echo half-way
false
```

```sh
echo never > never.txt
```

<!-- docs-test: cleanup -->
```sh
rm made.txt
echo cleaned > cleaned.txt
```
"""


@pytest.mark.system
def test_a_pages_cleanup_runs_when_a_block_before_it_fails(tmp_path: Path) -> None:
    """A broken page still takes down what it made, and the first failure is the one reported."""
    page_file = tmp_path / "page.md"
    page_file.write_text(CLEANUP_PAGE)
    with pytest.raises(AssertionError, match=r"page.md:5 failed \(exit 1\)[\s\S]*half-way"):
        Runner(parse(page_file), tmp_path, dict(os.environ)).run_page()
    assert not (tmp_path / "made.txt").exists() and (tmp_path / "cleaned.txt").read_text() == "cleaned\n"
    assert not (tmp_path / "never.txt").exists()
    cleanup_fails = CLEANUP_PAGE.replace("rm made.txt", "rm made.txt\nfalse")
    page_file.write_text(cleanup_fails.replace("false\n", "", 1))  # the page passes, its clean-up does not
    with pytest.raises(AssertionError, match=r"page.md:\d+ failed \(exit 1\):[\s\S]*rm made.txt") as alone:
        Runner(parse(page_file), tmp_path, dict(os.environ)).run_page()
    assert (tmp_path / "never.txt").exists() and not getattr(alone.value, "__notes__", None)
    page_file.write_text(cleanup_fails)  # both fail: the first failure is the one raised, the other noted
    with pytest.raises(AssertionError, match=r"page.md:5 failed") as both:
        Runner(parse(page_file), tmp_path, dict(os.environ)).run_page()
    assert "clean-up failed too" in " ".join(getattr(both.value, "__notes__", []))
