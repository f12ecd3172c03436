"""Documentation that cannot drift from what it describes: README's list of pages is the site's navigation, the
benchmarks' headline figures are their pages' own, nothing in the docs or the tests points outside the repository,
and what an agent is told about the desktop is true of the images (tests/test_docs.py builds the site itself)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from docs_src.hooks import GENERATED, benchmark_pages, superseded_by
from osfleet.recipe import load_recipe
from tests.conftest import REPO

pytestmark = pytest.mark.unit

DOCS = REPO / "docs"
SECTIONS = ("Tutorials", "How-to guides", "Reference", "Explanation")


def nav_pages() -> dict[str, set[str]]:
    """The pages of each section of mkdocs.yml's navigation, by their path under docs/ (index pages left out)."""
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    found: dict[str, set[str]] = {}

    def walk(entry: object, section: str) -> None:
        if isinstance(entry, str):
            if not entry.endswith("index.md"):
                found.setdefault(section, set()).add(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                walk(value, section)
        elif isinstance(entry, list):
            for item in entry:
                walk(item, section)

    for section in nav:
        (title, entries), *_ = section.items()
        walk(entries, title)
    return found


def readme_links() -> set[str]:
    return {m.removeprefix("docs/") for m in re.findall(r"\]\((docs/[\w/.-]+\.md)(?:#[\w-]+)?\)", readme())}


def readme() -> str:
    return (REPO / "README.md").read_text()


def test_readme_lists_the_pages_of_the_sites_navigation() -> None:
    """Every hand-written page of the four sections is linked from README's "Documentation", and every page README
    links is in the navigation (generated reference pages are named there as a group)."""
    nav = nav_pages()
    links = readme_links()
    assert len(links) > 20, links
    in_nav = set().union(*nav.values())
    in_nav |= {"benchmarks/index.md"}  # the section's own page, which README links
    assert not links - in_nav, f"README links pages the site's navigation lacks: {sorted(links - in_nav)}"
    generated = {p for p in GENERATED if p.endswith(".md")} | {"reference/cli.md", "reference/sdk.md"}
    for section in SECTIONS:
        missing = sorted(nav[section] - generated - links)
        assert not missing, f"README's Documentation does not link these {section} pages: {missing}"


# A sibling folder of the checkout, or the workspace it was cloned in (a sample command line such as
# "/srv/.venv/bin/python -m osfleet ..." in a test is no reference to a file).
OUTSIDE = [re.escape("../" + "shared"), "/" + r"work/(?:shared|main|team|\.library|\.mirror)\b"]
SCANNED = ["README.md", "CONTRIBUTING.md", "mkdocs.yml", ".ci/run", "docs", "docs_src", "examples", "tests", "scripts"]


def test_nothing_in_the_docs_or_tests_points_outside_the_repository() -> None:
    """A clone must hold everything its docs and tests read: data from elsewhere (OSWorld's task files) is fetched
    by a script from a named public source, or its tests are skipped saying so."""
    files = []
    for name in SCANNED:
        path = REPO / name
        files += [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    pattern = re.compile("|".join(OUTSIDE))
    found = []
    for path in files:
        if "__pycache__" in path.parts or path.suffix in (".png", ".qcow2", ".gz", ".mp4", ".wav", ".pdf"):
            continue
        text = path.read_text(errors="replace")
        found += [f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}" for m in pattern.finditer(text)]
    assert len(files) > 200
    assert not found, f"references outside the repository: {found}"


def test_headline_figures_are_their_pages_own() -> None:
    """The benchmarks index's table is built from each dated page's ``headline`` front matter: each value must be
    in that page's body, and each page it says it supersedes must exist and be older."""
    pages = benchmark_pages(DOCS)
    stems = {p.stem: p for p in pages}
    assert len(pages) >= 15 and sum(len(p.headline) for p in pages) >= 15
    for page in pages:
        for what, value in page.headline:
            assert value and value in page.body, f"{page.stem}: headline {what!r} = {value!r} is not on the page"
        for old in page.supersedes:
            assert old in stems and stems[old].date < page.date, f"{page.stem} supersedes {old!r}: no older page"
    gone = superseded_by(pages)
    assert gone["2026-11-29-main-job"].stem == "2026-12-01-deployment"  # a newer run of the main job
    newest = {p.name: p.stem for p in reversed(pages)}  # oldest first: the newest of each name is kept
    assert {p.stem for p in pages if p.name in newest and newest[p.name] != p.stem} <= set(gone)


def test_superseding_follows_names_and_front_matter(tmp_path: Path) -> None:
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "2026-01-01-resets.md").write_text("# Resets\n\n| a | 5 ms |\n")
    (bench / "2026-01-02-main-job.md").write_text("# Main\n")
    (bench / "2026-01-03-resets.md").write_text('---\nheadline:\n  - {what: "reset", value: "2 ms"}\n---\n# R\n2 ms\n')
    (bench / "2026-01-04-deploy.md").write_text('---\nsupersedes: ["2026-01-02-main-job"]\n---\n# Deploy\n')
    pages = benchmark_pages(tmp_path)
    assert [p.stem for p in pages][0] == "2026-01-04-deploy"
    gone = {old: new.stem for old, new in superseded_by(pages).items()}
    assert gone == {"2026-01-01-resets": "2026-01-03-resets", "2026-01-02-main-job": "2026-01-04-deploy"}
    assert pages[1].headline == (("reset", "2 ms"),) and pages[1].body.startswith("# R")


# What the images run (golden_images/recipes): a plain window manager and no desktop environment, so no launcher,
# panel or GNOME shortcut (docs/explanation/desktop.md says which are missing).
DESKTOP_ENVIRONMENTS = ("xfce", "gnome", "kde", "lxde", "lxqt", "mate", "cinnamon", "unity")
UNBOUND_HOTKEYS = {("ctrl", "alt", "t"), ("super",), ("win",), ("command",)}


def mcp_instructions() -> str:
    """The text the MCP server gives every agent, read from its source (the module is not imported)."""
    tree = ast.parse((REPO / "osfleet" / "mcp" / "server.py").read_text())
    for node in ast.walk(tree):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(getattr(t, "id", "") == "INSTRUCTIONS" for t in targets) and node.value is not None:  # type: ignore[attr-defined]
            value = ast.literal_eval(node.value)  # type: ignore[attr-defined]
            return " ".join(value.values()) if isinstance(value, dict) else str(value)  # one text per role
    raise AssertionError("osfleet/mcp/server.py has no INSTRUCTIONS")


def test_what_agents_are_told_about_the_desktop_is_true_of_the_images() -> None:
    managers = {load_recipe(p).window_manager for p in (REPO / "golden_images" / "recipes").glob("*.yaml")}
    assert managers == {"twm", "openbox"}, f"the images' window managers changed ({managers}): check what agents read"
    told = mcp_instructions().lower()
    assert all(m in told for m in managers), told
    assert not [d for d in DESKTOP_ENVIRONMENTS if re.search(rf"\b{d}\b", told)], told


def test_no_page_presses_a_shortcut_the_images_do_not_bind() -> None:
    pages = [
        *DOCS.rglob("*.md"),
        *(REPO / "docs_src").rglob("*.py"),
        *(REPO / "examples").rglob("*.py"),
        REPO / "README.md",
    ]
    pressed = []
    for path in pages:
        for call in re.findall(r"hotkey\(([^)]*)\)", path.read_text()):
            keys = tuple(k.strip().strip("'\"").lower() for k in call.split(",") if k.strip())
            if keys in UNBOUND_HOTKEYS:
                pressed.append(f"{path.relative_to(REPO)}: hotkey{keys}")
    assert not pressed, f"shortcuts no image binds (twm and openbox, no desktop environment): {pressed}"


def test_no_page_says_evaluation_runs_in_the_guest() -> None:
    """Tasks are scored on the host, in the evaluation sandbox, from what is read from the desktop: a page that says
    ``evaluate()`` checks in the guest teaches the wrong threat model."""
    claims = []
    for path in [*DOCS.rglob("*.md"), REPO / "README.md"]:
        text = " ".join(path.read_text().split())
        claims += [
            f"{path.relative_to(REPO)}: {m}" for m in re.findall(r"evaluate\(\)[^.;:]{0,60}\bin the guest", text)
        ]
    assert not claims, claims


ERROR_PREFIXES = ("osfleet: error: ", "[build-pulumi] error: ", "[setup] ")


def source_text() -> str:
    """osfleet's, the scripts' and the tests' harness source, with adjacent string literals joined (a message split
    over two f-strings reads as one)."""
    paths = [*(REPO / "osfleet").rglob("*.py"), *(REPO / "scripts").glob("*"), REPO / "tests" / "conftest.py"]
    text = "\n".join(p.read_text(errors="replace") for p in paths if p.is_file())
    return re.sub(r"""["']\s*\n\s*f?["']""", "", text)


def test_the_failure_page_quotes_the_codes_own_lines() -> None:
    """docs/how-to/when-it-fails.md: each line it says a command prints is still the code's (``…`` for the parts
    the code fills in)."""
    page = (DOCS / "how-to" / "when-it-fails.md").read_text()
    quoted = [m for row in re.findall(r"^\| `([^`|]+ [^`|]+)` \|", page, re.M) for m in [row]]
    assert len(quoted) >= 20, quoted
    code = source_text()
    stale = []
    for line in quoted:
        for prefix in ERROR_PREFIXES:
            line = line.removeprefix(prefix)
        fragments = [f for f in (x.strip() for x in line.split("…")) if len(f) >= 6]
        if not fragments or any(f not in code for f in fragments):
            stale.append(line)
    assert not stale, f"lines the page quotes that the code no longer prints: {stale}"
