"""The documentation site: it builds with ``mkdocs build --strict`` (what CI and the docs acceptance check run), its
generated reference covers the code, and its pages render in Chromium (Debian's, through Playwright, as
tests/test_ui.py drives it) with no console error, no failed request, nothing fetched from another host, and a
screenshot per section that is not blank."""

from __future__ import annotations

import dataclasses
import functools
import html
import http.server
import importlib
import inspect
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from PIL import Image, ImageStat

import osfleet.client
from osfleet.cli import cli
from tests.conftest import CHROMIUM, CHROMIUM_ARGS, REPO, VENV_BIN

pytestmark = pytest.mark.system  # mkdocs builds the site in a subprocess; Chromium renders it


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (VENV_BIN / "mkdocs").exists():
        pytest.fail(
            f"{VENV_BIN / 'mkdocs'} is missing: ./scripts/setup installs the docs extra (pip install -e '.[docs]')"
        )
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [str(VENV_BIN / "mkdocs"), "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def site_text(site: Path) -> str:
    return " ".join(
        re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", p.read_text(errors="replace"))))
        for p in site.rglob("*.html")
    )


def command_paths(cmd: click.Command, prefix: list[str]) -> list[str]:
    """Every command's full name, asked the way click asks (the root group loads its commands lazily, so its
    ``commands`` dict is empty until they are used)."""
    if not isinstance(cmd, click.Group):
        return [" ".join(prefix)]
    ctx = click.Context(cmd, info_name=prefix[-1])
    found = []
    for name in cmd.list_commands(ctx):
        sub = cmd.get_command(ctx, name)
        if sub is not None and not sub.hidden:
            found += command_paths(sub, [*prefix, name])
    return found


def test_the_reference_covers_every_command_route_and_public_name(site: Path) -> None:
    """What the acceptance check asks, and the HTTP routes: generated reference only grows with the code."""
    text = site_text(site)
    commands = command_paths(cli, ["osfleet"])
    assert len(commands) > 50, commands
    missing = [c for c in commands if c not in text]
    assert not missing, f"commands missing from the site: {missing}"
    missing = [n for n in osfleet.client.__all__ if n not in text]
    assert not missing, f"SDK names missing from the site: {missing}"
    from docs_src.hooks import host_agent_openapi

    api = (site / "reference" / "http-api" / "index.html").read_text()
    routes = [f"{m.upper()} {p}" for p, ops in host_agent_openapi()["paths"].items() for m in ops]
    assert routes and not [r for r in routes if html.escape(r) not in api]
    assert (site / "reference" / "openapi.json").is_file()


def documented_members(module_name: str) -> list[str]:
    """What the SDK page must show of a module it renders (``::: module``): every name of its ``__all__`` (else its
    public names defined there) and, of each class, the public methods and properties it declares itself and its
    dataclass fields. mkdocstrings leaves out what has no docstring, so a missing one shows here by name."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None) or [
        n for n, v in vars(module).items() if getattr(v, "__module__", None) == module_name
    ]
    found = []
    for name in (n for n in names if not n.startswith("_")):
        obj = getattr(module, name)
        found.append(f"{module_name}.{name}")
        if inspect.isclass(obj):
            fields = [f.name for f in dataclasses.fields(obj)] if dataclasses.is_dataclass(obj) else []
            methods = [
                m for m, v in vars(obj).items()
                if not m.startswith("_")
                and (inspect.isfunction(v) or isinstance(v, property | classmethod | staticmethod))
            ]  # fmt: skip
            found += [f"{module_name}.{name}.{m}" for m in dict.fromkeys(fields + methods)]
    return found


def test_the_sdk_reference_shows_every_public_member(site: Path) -> None:
    """Not only each name: every method, property and field of the SDK's public types has its entry on the page
    (the blocking ``Session.reset/step/evaluate``, ``Group``, ``ResetResult``... once had none)."""
    page = (site / "reference" / "sdk" / "index.html").read_text()
    shown = set(re.findall(r'id="([\w.]+)"', page))
    modules = re.findall(r"^::: ([\w.]+)$", (REPO / "docs" / "reference" / "sdk.md").read_text(), re.M)
    assert "osfleet.client" in modules, modules
    expected = [m for name in modules for m in documented_members(name)]
    assert {"osfleet.client.Session.reset", "osfleet.client.StepResult.replayed"} <= set(expected)
    missing = [m for m in expected if m not in shown]
    assert not missing, f"on the SDK page without an entry (give each a docstring): {missing}"


def test_limits_and_metrics_pages_read_the_code(site: Path) -> None:
    from osfleet.api.metrics import Metrics
    from osfleet.replicas.actions import STEP_BUDGET_SECONDS

    limits = (site / "reference" / "limits" / "index.html").read_text()
    assert f"{STEP_BUDGET_SECONDS:g} s" in limits and "osfleet.replicas.actions.STEP_BUDGET_SECONDS" in limits
    metrics = (site / "reference" / "metrics" / "index.html").read_text()
    assert all(f.name in metrics for f in Metrics().registry.collect())


def test_every_environment_variable_the_code_reads_is_documented() -> None:
    """The configuration page lists every ``OSFLEET_*`` variable of the runtime and the infra program; variables
    that only exist inside a guest image or as a heredoc marker are named here with why."""
    inside_the_guest = {
        "OSFLEET_BACKGROUND", "OSFLEET_EDITOR", "OSFLEET_HOSTNAME", "OSFLEET_MODULES", "OSFLEET_SCREEN",
        "OSFLEET_TERMINAL", "OSFLEET_USER", "OSFLEET_WM",  # the image builder's settings for the guest's init
        "OSFLEET_CHROME_PORT", "OSFLEET_CODE_PORT", "OSFLEET_PRESTART", "OSFLEET_DEVTOOLS_PORT",  # the office session
        "OSFLEET_ORACLE",  # a heredoc delimiter in the suite's oracles
    }  # fmt: skip
    used: set[str] = set()
    for path in [*REPO.joinpath("osfleet").rglob("*.py"), *REPO.joinpath("infra").rglob("*.py")]:
        used |= set(re.findall(r"(?<![A-Za-z0-9_])(OSFLEET_[A-Z][A-Z0-9_]*)", path.read_text()))
    page = (REPO / "docs" / "reference" / "configuration.md").read_text()
    assert len(used) > 20
    missing = sorted(v for v in used - inside_the_guest if f"`{v}`" not in page)
    assert not missing, f"undocumented in docs/reference/configuration.md: {missing}"


# --- rendered in Chromium ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


SECTIONS = [
    "",
    "tutorials/first-replica/",
    "how-to/host-agent/",
    "reference/cli/",
    "reference/http-api/",
    "reference/sdk/",
    "explanation/architecture/",
    "benchmarks/",
    "contributing/",
]


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/setup installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()
    shutil.rmtree(profile, ignore_errors=True)


def watch(page: Any, path: str, served: str, problems: list[str]) -> None:
    """Collect what would show a reader a broken page: console errors, script errors, failed requests, and any
    request to another host (the site must work offline and fetch nothing from elsewhere)."""

    def console(message: Any) -> None:
        if message.type == "error":
            problems.append(f"{path}: console error: {message.text}")

    def request(req: Any) -> None:
        if not req.url.startswith((served, "data:", "blob:")):
            problems.append(f"{path}: fetched {req.url}")

    page.on("console", console)
    page.on("pageerror", lambda error: problems.append(f"{path}: {error}"))
    page.on("requestfailed", lambda req: problems.append(f"{path}: request failed {req.url}"))
    page.on("request", request)


def test_every_section_renders_in_chromium(served: str, browser: Any, tmp_path: Path) -> None:
    problems: list[str] = []
    shots = tmp_path / "screenshots"
    shots.mkdir()
    for path in SECTIONS:
        page = browser.new_page()
        watch(page, path, served, problems)
        answer = page.goto(f"{served}/{path}", wait_until="networkidle")
        assert answer is not None and answer.status == 200, f"{path}: {answer.status if answer else 'no answer'}"
        title = page.title()
        assert "osfleet" in title, f"{path}: title {title!r}"
        assert page.locator("article h1").count() == 1, f"{path}: no page heading"
        out = shots / f"{path.strip('/').replace('/', '-') or 'home'}.png"
        page.screenshot(path=str(out), full_page=False)
        image = Image.open(out).convert("L")
        assert ImageStat.Stat(image).stddev[0] > 10, f"{path}: the screenshot is blank ({out})"
        page.close()
    assert not problems, "\n".join(problems)


def test_search_finds_a_command(served: str, browser: Any) -> None:
    """The search index is built and Material's search (its own worker, no external script) answers."""
    page = browser.new_page()
    page.goto(f"{served}/", wait_until="networkidle")
    page.keyboard.press("s")  # Material's shortcut to the search box
    page.keyboard.type("fleet serve")
    results = page.locator(".md-search-result__item")
    results.first.wait_for(timeout=15000)
    assert results.count() > 0
    page.close()
