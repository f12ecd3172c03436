"""Documented commands as tests: the shell blocks of a Markdown page, parsed and run as a reader would run them.

A page is a script. Its fenced ``sh``/``bash``/``shell`` blocks run in order, each with ``bash -euo pipefail`` from
the repository's root; an HTML comment just before a block (invisible on the page) says how, when a reader would
do something other than wait for it to finish:

- ``<!-- docs-test: background until=URL -->``: the reader leaves it running (a server) and goes on once ``URL``
  answers 200; it is stopped with SIGINT, as Ctrl-C in its terminal, at ``stop`` or at the end of the page.
- ``<!-- docs-test: stop -->``: the background commands are stopped (SIGINT, then waited for) before this block.
- ``<!-- docs-test: cleanup -->``: the reader's clean-up (``destroy``, ``down``). It runs in its place, and also
  when any block before it failed, as a reader who hit an error would still take down what they made, so that a
  broken page leaves no lab or stack to the tests after it. It must therefore hold when what it removes was never
  made. Its own failure is reported beside, never instead of, the first one.
- ``<!-- docs-test: ci -->``: the block is what CI runs; each of its lines must be a line of ``.ci/run``.
- ``<!-- docs-test: skip REASON -->``: not run here, and the reason is shown (never on README or a tutorial).

A page says its tier and how long a block may take in one comment anywhere on it:
``<!-- docs-test: page vm timeout=900 restores=FILE,... -->`` (``vm`` or ``system``; timeout in
seconds; tracked files the page's commands change, such as a Pulumi stack's config, put back afterwards).

As in one terminal, what a block exports (``eval "$(osfleet infra env)"``) is there for the blocks after it.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

SHELLS = {"sh", "bash", "shell"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
DIRECTIVE = re.compile(r"<!--\s*docs-test:\s*(?P<body>.*?)\s*-->")


@dataclass
class Block:
    """One fenced block: its language, its code as the page shows it, the directive before it, its line."""

    lang: str
    code: str
    line: int
    directive: str = ""

    @property
    def kind(self) -> str:
        return self.directive.split(maxsplit=1)[0] if self.directive else "run"

    def option(self, name: str) -> str | None:
        found = re.search(rf"\b{name}=(\S+)", self.directive)
        return found.group(1) if found else None


@dataclass
class Page:
    path: Path
    blocks: list[Block]
    tier: str = ""
    timeout: float = 600.0
    restores: list[str] = field(default_factory=list)

    @property
    def shell_blocks(self) -> list[Block]:
        return [b for b in self.blocks if b.lang in SHELLS]


def parse(path: Path) -> Page:
    """Every fenced block of the page, with the ``docs-test`` directive that precedes it (blank lines between
    allowed); the page-level directive sets the tier and the timeout."""
    text = path.read_text()
    page = Page(path, [])
    pending = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = DIRECTIVE.search(line)
        if directive:
            body = directive.group("body")
            if body.startswith("page"):
                words = body.split()
                page.tier = next((w for w in words[1:] if "=" not in w), "")
                timeout = re.search(r"timeout=(\d+)", body)
                page.timeout = float(timeout.group(1)) if timeout else page.timeout
                restores = re.search(r"restores=(\S+)", body)
                page.restores = restores.group(1).split(",") if restores else []
            else:
                pending = body
            i += 1
            continue
        fence = FENCE.match(line)
        if fence:
            indent, marker = len(fence.group("indent")), fence.group("fence")
            lang = fence.group("info").strip().split(" ")[0].lower()
            body_lines = []
            start = i + 1
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(marker):
                body_lines.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
                i += 1
            page.blocks.append(Block(lang, "\n".join(body_lines) + "\n", start, pending))
            pending = ""
            i += 1
            continue
        if line.strip():
            pending = ""  # a directive belongs to the block right after it
        i += 1
    return page


@dataclass
class Runner:
    """Runs a page's shell blocks in order; background commands run in their own process group."""

    page: Page
    cwd: Path
    env: dict[str, str]
    log: list[str] = field(default_factory=list)
    background: list[tuple[Block, subprocess.Popen[str], Path]] = field(default_factory=list)

    def where(self, block: Block) -> str:
        return f"{self.page.path.name}:{block.line}"

    def run(self, block: Block) -> None:
        if block.kind == "stop":
            self.stop_background()
        if block.kind == "background":
            self.start_background(block)
            return
        started = time.monotonic()
        env_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"docs-test-{os.getpid()}.env"
        script = f"{block.code}\nenv -0 > {shlex.quote(str(env_file))}\n"  # what it exported, for the next blocks
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=self.page.timeout,
            stdin=subprocess.DEVNULL,
        )
        took = time.monotonic() - started
        self.log.append(f"$ {block.code.strip()}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}[exit {proc.returncode}, "
                        f"{took:.1f} s]")  # fmt: skip
        if proc.returncode != 0:
            raise AssertionError(f"{self.where(block)} failed (exit {proc.returncode}):\n" + "\n".join(self.log[-3:]))
        exported = env_file.read_bytes().split(b"\0")
        env_file.unlink()
        self.env = dict(x.decode().split("=", 1) for x in exported if b"=" in x)

    def start_background(self, block: Block) -> None:
        url = block.option("until")
        if not url:
            raise AssertionError(f"{self.where(block)}: a background block needs until=URL")
        out = Path(os.environ.get("TMPDIR", "/tmp")) / f"docs-test-{os.getpid()}-{block.line}.log"
        handle = out.open("w")
        proc = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", f"exec {block.code.strip()}"] if "\n" not in block.code.strip()
            else ["bash", "-euo", "pipefail", "-c", block.code],
            cwd=self.cwd, env=self.env, stdout=handle, stderr=subprocess.STDOUT, text=True,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        handle.close()
        self.background.append((block, proc, out))
        deadline = time.monotonic() + self.page.timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"{self.where(block)} exited ({proc.returncode}) before {url} answered:\n"
                                     f"{out.read_text()[-3000:]}")  # fmt: skip
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    if answer.status == 200:
                        self.log.append(f"$ {block.code.strip()}  (running; {url} answers)")
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        raise AssertionError(f"{self.where(block)}: {url} did not answer within {self.page.timeout:.0f} s")

    def stop_background(self) -> None:
        """Ctrl-C for each background command (SIGINT to its process group), then wait for its clean-up."""
        failures = []
        for block, proc, out in reversed(self.background):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    failures.append(f"{self.where(block)} did not stop within 120 s of Ctrl-C")
            self.log.append(f"[{self.where(block)} stopped: exit {proc.returncode}]\n{out.read_text()[-1500:]}")
            out.unlink(missing_ok=True)
        self.background.clear()
        if failures:
            raise AssertionError("; ".join(failures))

    def run_page(self) -> list[str]:
        """Every shell block in order; ``ci`` and ``skip`` blocks are returned (checked and reported elsewhere)."""
        not_run = []
        kept = {name: (self.cwd / name).read_bytes() for name in self.page.restores}
        cleanups = [b for b in self.page.shell_blocks if b.kind == "cleanup"]  # those not run yet
        try:
            for block in self.page.shell_blocks:
                if block.kind in ("ci", "skip"):
                    not_run.append(f"{self.where(block)}: {block.directive}")
                    continue
                if block.kind == "cleanup":
                    cleanups.remove(block)
                self.run(block)
        except BaseException as exc:
            if cleanups:  # a reader would Ctrl-C the servers first
                try:
                    self.stop_background()
                except AssertionError as also:
                    exc.add_note(str(also))
            for block in cleanups:
                try:
                    self.run(block)
                except AssertionError as also:
                    exc.add_note(f"and its clean-up failed too: {also}")
            raise
        finally:
            try:
                self.stop_background()
            finally:
                for name, data in kept.items():
                    (self.cwd / name).write_bytes(data)
        return not_run
