"""The differential check of the metrics OSWorld-Verified added, against OSWorld's own functions.

``match_in_list``, ``is_expected_active_tab_approximate``, ``compare_unique_train_records`` and
``compare_image_text`` are in desktop-env 1.0.2 (the newest release on PyPI) and are checked against it, as
``tests/test_osworld_differential_general.py`` checks the others. ``check_structure_sim_with_threshold`` and
``check_play_and_exit`` exist only on OSWorld's main branch: they are checked against its source when
``OSFLEET_OSWORLD_SOURCE`` names a folder holding its ``desktop_env/`` (any checkout of OSWorld's main branch),
and skipped with that reason otherwise. ``compare_image_text`` runs OSWorld's function with EasyOCR replaced by
Tesseract (``tests/osworld_reference/shim_easyocr.py``): everything but the OCR engine is compared here; the
engines' agreement is a separate figure (``docs/reference/osworld-verified.md``).

The table: ``pytest -s`` on this file (printed after its last test).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from osfleet.tasks.osworld_format.metrics import METRICS, run_metric
from tests.osworld_reference import Reference
from tests.osworld_reference.verified import MAIN_ONLY, VERIFIED
from tests.test_osworld_differential_general import Case, Outcome, image, score_both, table, write

pytestmark = [
    pytest.mark.system,
    pytest.mark.xdist_group("chrome"),
]  # one xdist worker: the handover check scans the machine for google-chrome launchers

MAIN_SOURCE = os.environ.get("OSFLEET_OSWORLD_SOURCE", "")
SHIMS = {"compare_image_text": ("easyocr",)}


def match_in_list_cases(d: Path) -> Iterator[Case]:
    for label, result, rules in [
        ("in the list", "light", {"expected": ["light", "system"]}),
        ("not in the list", "dark", {"expected": ["light", "system"]}),
        ("search engine", "Bing", {"expected": ["Microsoft Bing", "Bing"]}),
        ("none", None, {"expected": ["light"]}),
        ("a substring of a string", "Bing", {"expected": "Microsoft Bing"}),
        ("no expected key", "light", {"values": ["light"]}),
        ("a list in a list", ["a"], {"expected": [["a"], "b"]}),
        ("in a number", "1", {"expected": 1}),
        ("empty list", "light", {"expected": []}),
    ]:
        yield Case("match_in_list", "general", label, result, rules)


def active_tab_cases(d: Path) -> Iterator[Case]:
    want = "chrome://password-manager/passwords"
    for label, result, rule in [
        ("same", want, {"type": "url", "url": want}),
        ("with a query", want + "?search=etsy", {"type": "url", "url": want}),
        ("other path", "chrome://password-manager/settings", {"type": "url", "url": want}),
        ("a tab dict", {"url": want + "?q=1", "title": "Passwords"}, {"type": "url", "url": want}),
        ("a dict without url", {"title": "Passwords"}, {"type": "url", "url": want}),
        ("no tab", None, {"type": "url", "url": want}),
        ("empty", "", {"type": "url", "url": want}),
        ("another rule type", want, {"type": "title", "url": want}),
        ("a fragment", "https://a.test/x#frag", {"type": "url", "url": "https://a.test/x"}),
        ("trailing slash", "https://a.test/x/", {"type": "url", "url": "https://a.test/x"}),
        ("scheme differs", "http://a.test/x?y=1", {"type": "url", "url": "https://a.test/x"}),
        ("number", 5, {"type": "url", "url": want}),
    ]:
        yield Case("is_expected_active_tab_approximate", "chrome", label, result, rule)


def _docx(path: Path, lines: list[str]) -> Path:
    import docx

    document = docx.Document()
    for line in lines:
        document.add_paragraph(line)
    path.parent.mkdir(parents=True, exist_ok=True)
    document.save(str(path))
    return path


def train_cases(d: Path) -> Iterator[Case]:
    rows = [f"06{m:02d}, {t}, Station {s}, {p}" for m, t, s, p in [(0, "K1", "A", 1), (5, "K2", "B", 2)]]
    rows += ["0610, K1, Station A, 1", "0615, K3, Station C, 1", "0620, K2, Station B, 2", "Header line"]
    initial = _docx(d / "original.docx", rows)
    gold = _docx(d / "gold.docx", [rows[0], rows[1], rows[3], rows[5]])
    expected = [gold, initial]
    for label, lines in [
        ("as the gold", [rows[0], rows[1], rows[3], rows[5]]),
        ("the other duplicate kept", [rows[2], rows[1], rows[3], rows[5]]),
        ("reordered", [rows[5], rows[3], rows[1], rows[0]]),
        ("duplicates left", rows),
        ("a line added", [rows[0], rows[1], rows[3], rows[5], "0700, K9, Station Z, 3"]),
        ("a train dropped", [rows[0], rows[1], rows[5]]),
        ("the header dropped", [rows[0], rows[1], rows[3]]),
        ("blank lines between", [rows[0], "", rows[1], "  ", rows[3], rows[5]]),
        ("empty", []),
    ]:
        yield Case("compare_unique_train_records", "docs", label, _docx(d / f"r-{label}.docx", lines), expected)
    yield Case("compare_unique_train_records", "docs", "not a document", write(d / "x.docx", "no"), expected)
    yield Case("compare_unique_train_records", "docs", "no result", None, expected)
    yield Case("compare_unique_train_records", "docs", "one expected file", gold, [gold])
    yield Case("compare_unique_train_records", "docs", "no gold file", gold, [None, initial])


def structure_threshold_cases(d: Path) -> Iterator[Case]:
    from PIL import Image

    gold = image(d / "gold.png", (96, 80))
    same = image(d / "same.png", (96, 80))
    other = image(d / "other.png", (96, 80), seed=5)
    bigger = d / "bigger.png"
    Image.open(gold).resize((192, 160)).save(bigger)
    rgba = d / "rgba.png"
    Image.open(gold).convert("RGBA").save(rgba)
    tiny_a, tiny_b = image(d / "tiny-a.png", (5, 6)), image(d / "tiny-b.png", (5, 6))
    flat_a, flat_b = d / "flat-a.png", d / "flat-b.png"
    Image.open(gold).resize((2, 9)).save(flat_a)
    Image.open(other).resize((2, 9)).save(flat_b)
    opts = {"ssim_threshold": 0.85}
    for label, result, expected, options in [
        ("same", same, gold, opts),
        ("different", other, gold, opts),
        ("twice as large", bigger, gold, opts),
        ("with an alpha channel", rgba, gold, opts),
        ("a strict threshold", other, gold, {"ssim_threshold": 0.2}),
        ("the default threshold", bigger, gold, {}),
        ("a threshold as text", same, gold, {"ssim_threshold": "0.85"}),
        ("tiny images", tiny_a, tiny_b, opts),
        ("two pixels wide", flat_a, flat_b, opts),
        ("an unknown option", same, gold, {"ssim_threshold": 0.85, "other": 1}),
        ("no result", None, gold, opts),
        ("not an image", write(d / "x.png", "no"), gold, opts),
    ]:
        yield Case("check_structure_sim_with_threshold", "gimp", label, result, expected, options)


def play_and_exit_cases(d: Path) -> Iterator[Case]:
    for label, text, want in [
        ("unset, wanted 0", "[core]\nplay-and-exit=0\n", 0),
        ("set, wanted 0", "[core]\nplay-and-exit=1\n", 0),
        ("absent: VLC's default 0", "[qt]\nqt-minimal-view=0\n", 0),
        ("commented default", "# Play and exit (boolean)\n#play-and-exit=0\n", 0),
        ("set, wanted '1'", "play-and-exit=1\n", "1"),
        ("spaces around", "play-and-exit = 1 \n", 1),
        ("last one wins", "play-and-exit=1\nplay-and-exit=0\n", 0),
    ]:
        path = write(d / f"vlcrc-{label[:12].replace(' ', '-').replace(',', '')}", text)
        yield Case("check_play_and_exit", "vlc", label, path, {"expected_play_and_exit": want})
    yield Case("check_play_and_exit", "vlc", "no config", None, {"expected_play_and_exit": 0})
    yield Case("check_play_and_exit", "vlc", "no rule key", write(d / "vlcrc-x", "play-and-exit=0\n"), {})


def _text_picture(path: Path, lines: list[str], size: tuple[int, int] = (640, 200)) -> Path:
    from PIL import Image, ImageDraw, ImageFont

    picture = Image.new("RGB", size, (30, 30, 30))
    font = ImageFont.truetype("/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf", 14)
    ImageDraw.Draw(picture).multiline_text((12, 12), "\n".join(lines), font=font, fill=(230, 230, 230), spacing=4)
    path.parent.mkdir(parents=True, exist_ok=True)
    picture.save(path)
    return path


def xwd_bytes(picture: Any, depth: int) -> bytes:
    """An X window dump of ``picture`` as ``xwd`` writes one (ZPixmap, least significant byte first, no colour
    map) with ``depth`` 32 (4 bytes a pixel) or 24 (here 3 bytes a pixel, packed)."""
    name = b"xwdump\x00"
    step = depth // 8
    width, height = picture.size
    header = [100 + len(name), 7, 2, depth, width, height, 0, 0, 32, 0, 32, depth, width * step]
    header += [4, 0xFF0000, 0xFF00, 0xFF, 8, 256, 0, width, height, 0, 0, 0]
    raw = picture.convert("RGB").tobytes("raw", "BGRX" if step == 4 else "RGB")
    return struct.pack(">25I", *header) + name + raw


def image_text_cases(d: Path) -> Iterator[Case]:
    from PIL import Image

    shot = _text_picture(
        d / "ls.png", ["user@osfleet:~$ ls", "Desktop  Documents  Downloads  Music", "user@osfleet:~$"]
    )
    other = _text_picture(d / "pwd.png", ["user@osfleet:~$ pwd", "/home/user"])
    for label, result, rule in [
        ("the command is shown", shot, {"type": "text", "text": "ls"}),
        ("a file name is shown", shot, {"type": "text", "text": "Downloads"}),
        ("OSWorld's 1s variant", shot, {"type": "text", "text": "1s"}),
        ("another command", other, {"type": "text", "text": "ls"}),
        ("another rule type", shot, {"type": "regex", "text": "ls"}),
        ("no picture", None, {"type": "text", "text": "ls"}),
        ("not a picture", write(d / "x.png", "no"), {"type": "text", "text": "ls"}),
    ]:
        yield Case("compare_image_text", "docs", label, result, rule)
    picture = Image.open(shot)
    for depth in (32, 24):
        dump = write(d / f"ls-{depth}.xwd", xwd_bytes(picture, depth))
        yield Case(
            "compare_image_text", "docs", f"an X window dump, depth {depth}", dump, {"type": "text", "text": "ls"}
        )
    cut = write(d / "cut.xwd", xwd_bytes(picture, 32)[:5000])
    yield Case("compare_image_text", "docs", "an X window dump cut short", cut, {"type": "text", "text": "ls"})


BUILDERS = {
    "match_in_list": match_in_list_cases,
    "is_expected_active_tab_approximate": active_tab_cases,
    "compare_unique_train_records": train_cases,
    "check_structure_sim_with_threshold": structure_threshold_cases,
    "check_play_and_exit": play_and_exit_cases,
    "compare_image_text": image_text_cases,
}
OUTCOMES: dict[str, list[Outcome]] = {}


def test_every_verified_metric_is_registered_and_has_cases() -> None:
    assert set(BUILDERS) == VERIFIED and set(METRICS) >= VERIFIED


@pytest.mark.parametrize("metric", sorted(BUILDERS))
def test_osfleet_scores_as_osworld(metric: str, tmp_path: Path) -> None:
    source = None
    if metric in MAIN_ONLY:
        if not (Path(MAIN_SOURCE) / "desktop_env" / "evaluators" / "metrics").is_dir():
            pytest.skip(
                f"{metric} is only on OSWorld's main branch (not desktop-env 1.0.2): set OSFLEET_OSWORLD_SOURCE to a "
                "folder holding its desktop_env/ to compare"
            )
        source = Path(MAIN_SOURCE)
    ref = Reference(shims=SHIMS.get(metric, ()), source=source)
    try:
        outcomes = [score_both(ref, case) for case in BUILDERS[metric](tmp_path)]
    finally:
        ref.close()
    OUTCOMES[metric] = outcomes
    assert all(o.theirs is not None for o in outcomes), [o.theirs_note for o in outcomes if o.theirs is None]
    unequal = [o for o in outcomes if not o.equal]
    assert not unequal, "\n".join(
        f"{o.case.label}: osfleet {o.ours} ({o.reason}) vs OSWorld {o.theirs} {o.theirs_note}" for o in unequal
    )
    assert 0.0 in {o.ours for o in outcomes} and 1.0 in {o.ours for o in outcomes}  # the cases tell both apart


def _osworld_appearance_probe() -> str:
    """OSWorld's own JavaScript of ``get_chrome_appearance_mode_ui``, read from its source (not copied here)."""
    import ast

    source = (Path(MAIN_SOURCE) / "desktop_env" / "evaluators" / "getters" / "chrome.py").read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == "get_chrome_appearance_mode_ui":
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.Assign) and getattr(stmt.targets[0], "id", "") == "js_probe":
                    return f"({ast.literal_eval(stmt.value).strip()})()"
    raise AssertionError("no js_probe in OSWorld's get_chrome_appearance_mode_ui")


@pytest.mark.slow
@pytest.mark.parametrize(
    "prefs",
    [
        None,
        {"browser": {"theme": {"color_scheme2": 2}}, "extensions": {"theme": {"system_theme": 1}}},
        {"browser": {"theme": {"color_scheme2": 1}}, "extensions": {"theme": {"system_theme": 1}}},
        {"browser": {"theme": {"color_scheme2": 0}}, "extensions": {"theme": {"system_theme": 1}}},
    ],
    ids=["fresh", "dark", "light", "device"],
)
def test_chrome_appearance_page_probe_reads_as_osworlds(tmp_path: Path, prefs: dict[str, Any] | None) -> None:
    """The getter ``chrome_appearance_mode_ui``: osfleet's probe of chrome://settings/appearance and OSWorld's,
    on Debian's Chromium with the appearance set in its profile before it starts."""
    import json
    import socket
    import subprocess

    if not (Path(MAIN_SOURCE) / "desktop_env" / "evaluators" / "getters" / "chrome.py").is_file():
        pytest.skip("chrome_appearance_mode_ui is only on OSWorld's main branch: set OSFLEET_OSWORLD_SOURCE")
    profile = tmp_path / "profile"
    if prefs is not None:
        (profile / "Default").mkdir(parents=True)
        (profile / "Default" / "Preferences").write_text(json.dumps(prefs))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    browser = subprocess.Popen(
        ["/usr/bin/chromium", "--headless=new", "--no-sandbox", "--disable-gpu", f"--remote-debugging-port={port}",
         f"--user-data-dir={profile}", "--no-first-run", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    script = Path(__file__).resolve().parents[1] / "osfleet" / "tasks" / "osworld_format" / "guest" / "query.py"
    driver = (
        "import runpy, sys, json; q = runpy.run_path(sys.argv[1], run_name='query'); d = q['Deadline'](60); "
        "q['_wait_devtools'](d); modes = [q['_with_new_tab']('chrome://settings/appearance', d, "
        "lambda page, loaded: q['_evaluate'](page, js), launch=False, settle=2.5) for js in json.loads(sys.argv[2])]; "
        "print(json.dumps(modes))"
    )
    try:
        probes = [_appearance_probe_of_osfleet(), _osworld_appearance_probe()]
        out = subprocess.run(
            ["/usr/bin/python3", "-c", driver, str(script), json.dumps(probes)],
            capture_output=True, text=True, timeout=120, env={**os.environ, "OSFLEET_DEVTOOLS_PORT": str(port)},
        )  # fmt: skip
    finally:
        browser.terminate()
        browser.wait(10)
    ours, theirs = json.loads(out.stdout.strip().splitlines()[-1])
    assert ours == theirs and ours in ("light", "dark", "system"), (ours, theirs, out.stderr[-300:])


def _appearance_probe_of_osfleet() -> str:
    import runpy

    script = Path(__file__).resolve().parents[1] / "osfleet" / "tasks" / "osworld_format" / "guest" / "query.py"
    return str(runpy.run_path(str(script), run_name="query")["APPEARANCE_PROBE"])


def test_compare_image_text_reads_a_terminal_screenshot_at_1920x1080(tmp_path: Path) -> None:
    """The picture multi_apps 02ce9a50 asks for, made as on the office desktop: xterm's own 6x13 font on a
    1920x1080 X screen (Xvfb), `ls` run in it, the screen grabbed as pyautogui grabs it."""
    import shutil
    import subprocess
    import time

    from PIL import ImageGrab

    if not (shutil.which("Xvfb") and shutil.which("xterm")):
        pytest.fail("this test needs Xvfb and xterm (scripts/setup)")
    home = tmp_path / "home"
    for folder in ("Desktop", "Documents", "Downloads", "Music", "Pictures", "Templates", "Videos"):
        (home / folder).mkdir(parents=True)
    read, write = os.pipe()  # Xvfb picks a free display and writes its number here once it accepts clients
    screen = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write), "-screen", "0", "1920x1080x24", "-nolisten", "tcp"], pass_fds=(write,)
    )
    os.close(write)
    term = None
    try:
        with os.fdopen(read) as ready:
            display = f":{ready.readline().strip()}"
        env = {"DISPLAY": display, "HOME": str(home), "PATH": "/usr/bin:/bin"}
        typed = 'echo "user@osfleet:~\\$ ls"; ls; exec sleep 60'
        term = subprocess.Popen(["xterm", "-geometry", "80x24+40+40", "-e", "sh", "-c", typed], cwd=home, env=env)
        for _ in range(100):  # until the listing (the terminal's second row, dark text on white) is drawn
            row = ImageGrab.grab(xdisplay=display).crop((44, 57, 300, 68)).convert("L")
            if row.getextrema()[0] < 100 and row.getextrema()[1] > 200:
                break
            time.sleep(0.1)
        shot = tmp_path / "ls.png"
        ImageGrab.grab(xdisplay=display).save(shot)
    finally:
        for proc in (term, screen):
            if proc is not None:
                proc.terminate()
                proc.wait(10)
    score, reason = run_metric("compare_image_text", shot, {"type": "text", "text": "ls"}, {})
    assert score == 1.0, reason
    assert run_metric("compare_image_text", shot, {"type": "text", "text": "Templates"}, {})[0] == 1.0


@pytest.fixture(scope="module", autouse=True)
def print_the_table() -> Iterator[None]:
    """The closing note's table, once this file's tests have run (shown with ``pytest -s``); a fixture, not a
    test that asserts nothing."""
    yield
    if OUTCOMES:
        print("\n" + table(OUTCOMES))
