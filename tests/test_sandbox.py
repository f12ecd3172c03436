"""The evaluation sandbox: hostile files cost their own evaluation a 0 with the reason, never this process.

Every file here is a real one of the kind a guest can write (built with openpyxl, python-docx, zipfile, by
hand), scored by the real metrics in the real sandbox (zygote, children, limits); nothing is mocked.
"""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from docx import Document
from docx.oxml import OxmlElement
from docx.oxml.ns import qn
from openpyxl import Workbook

from osfleet.tasks.jail.sandbox import Limits, Sandbox, SandboxError
from osfleet.tasks.osworld_format import metrics

pytestmark = pytest.mark.system

ALL_SHEET = {"rules": [{"type": "sheet_data", "sheet_idx0": "RI0", "sheet_idx1": "EI0"}]}


def xlsx(path: Path, cells: dict[str, str]) -> Path:
    wb = Workbook()
    ws = wb.active
    assert ws is not None
    for ref, value in cells.items():
        ws[ref] = value
    wb.save(path)
    return path


def docx(path: Path, span: int | None = None) -> Path:
    doc = Document()
    table = doc.add_table(rows=1, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "a", "b"
    if span:
        pr = table.rows[0].cells[0]._tc.get_or_add_tcPr()
        grid = OxmlElement("w:gridSpan")
        grid.set(qn("w:val"), str(span))
        pr.append(grid)
    doc.save(str(path))
    return path


def rezip(src: Path, dst: Path, replace: dict[str, bytes]) -> Path:
    """``src`` (an OOXML zip) with some members' contents replaced."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            zout.writestr(item, replace.get(item.filename, zin.read(item.filename)))
    return dst


def zip_bomb_xlsx(src: Path, dst: Path, expanded: int) -> Path:
    """A workbook whose sheet is one cell holding ``expanded`` bytes of text (a few hundred KiB zipped)."""
    head = b'<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><sheetData><row r="1">'
    head += b'<c r="A1" t="inlineStr"><is><t>'
    tail = b"</t></is></c></row></sheetData></worksheet>"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            if item.filename != "xl/worksheets/sheet1.xml":
                zout.writestr(item, zin.read(item.filename))
                continue
            info = zipfile.ZipInfo(item.filename)
            info.compress_type = zipfile.ZIP_DEFLATED
            with zout.open(info, "w", force_zip64=True) as out:
                out.write(head)
                block = b"a" * 2**20
                for _ in range(expanded // len(block)):
                    out.write(block)
                out.write(tail)
    return dst


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    box = Sandbox(Limits(memory_bytes=512 * 2**20, cpu_seconds=10, wall_seconds=20))
    box.start()
    yield box
    box.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hostile")
    xlsx(d / "e.xlsx", {"A1": "x"})
    docx(d / "e.docx")
    return d


def own_rss() -> int:
    return int(psutil.Process().memory_info().rss)


def test_a_good_file_scores_as_before(sandbox: Sandbox, files: Path) -> None:
    same = xlsx(files / "same.xlsx", {"A1": "x"})
    assert sandbox.run("compare_table", same, files / "e.xlsx", ALL_SHEET) == (1.0, "1 rule(s) hold")


def test_the_far_cell_workbook_scores_zero_at_once(sandbox: Sandbox, files: Path) -> None:
    far = xlsx(files / "far.xlsx", {"A1": "x", "XFD1048576": "y"})
    assert far.stat().st_size < 6000
    before, t = own_rss(), time.monotonic()
    score, detail = sandbox.run("compare_table", far, files / "e.xlsx", ALL_SHEET)
    assert score == 0.0 and "spans 1048576 x 16384 cells, too many to read" in detail, detail
    assert time.monotonic() - t < 10 and own_rss() - before < 50 * 2**20


@pytest.mark.parametrize("func", ["compare_docx_files", "compare_docx_tables"])
def test_a_huge_grid_span_is_scored_at_once(sandbox: Sandbox, files: Path, func: str) -> None:
    """python-docx expands a cell's gridSpan into a list that long; a span no Word document has is refused
    before any table is read: 0 with the reason, at once, in little memory."""
    if func not in metrics.METRICS:
        pytest.skip(f"{func} is not one of this tree's metrics")
    t = time.monotonic()
    score, detail = sandbox.run(func, docx(files / "span.docx", 2**31), files / "e.docx", {})
    used = sandbox.recent[-1].peak_rss_bytes
    assert time.monotonic() - t < 10 and score == 0.0 and "spans '2147483648' columns" in detail, detail
    assert used is not None and used < 300 * 2**20, used  # not the 2^31-long list a metric may not build


def test_a_zip_bomb_hits_the_memory_limit_not_the_host(sandbox: Sandbox, files: Path) -> None:
    bomb = zip_bomb_xlsx(files / "e.xlsx", files / "bomb.xlsx", 700 * 2**20)
    assert bomb.stat().st_size < 8 * 2**20  # within the read cap
    before = own_rss()
    score, detail = sandbox.run("compare_table", bomb, files / "e.xlsx", ALL_SHEET)
    used = sandbox.recent[-1].peak_rss_bytes
    assert score == 0.0 and detail, detail  # the reason is the metric's ("MemoryError", "not a workbook ...")
    assert used is not None and used < sandbox.info["vm_size"] + 512 * 2**20, used  # it never held the 700 MB
    assert own_rss() - before < 50 * 2**20


def test_a_yaml_alias_bomb_is_bounded_in_the_detail(sandbox: Sandbox, files: Path) -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefgh"[i]
        lines.append(f"{name}: &{name} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]")
    bomb = files / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    rules = {"expect": [{"key": ["i"], "method": "eq", "ref": 1}]}
    t = time.monotonic()
    score, detail = sandbox.run("check_json", bomb, rules, {"is_yaml": True})
    assert score == 0.0 and "[[[" in detail and len(detail) < 400, detail
    assert time.monotonic() - t < 5


@pytest.mark.parametrize(
    "kind,words",
    [  # the library's own reason is in the detail, whatever the metric's wording around it
        ("bad-xml", "no element found"),
        ("zlib", "Error -3 while decompressing"),
        ("encrypted", "is encrypted"),
        ("not-a-zip", "File is not a zip file"),
    ],
)
def test_corrupt_workbooks_score_zero_with_the_reason(sandbox: Sandbox, files: Path, kind: str, words: str) -> None:
    good = files / "e.xlsx"
    path = files / f"{kind}.xlsx"
    if kind == "bad-xml":
        rezip(good, path, {"xl/worksheets/sheet1.xml": b"<worksheet><sheetData><row><c>"})
    elif kind == "zlib":
        data = bytearray(good.read_bytes())
        with zipfile.ZipFile(good) as z:
            info = z.getinfo("xl/worksheets/sheet1.xml")
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
        data[start : start + 8] = b"\xff" * 8  # the member's deflate stream, broken; its header intact
        path.write_bytes(bytes(data))
    elif kind == "encrypted":
        data = bytearray(good.read_bytes())
        with zipfile.ZipFile(good) as z:
            offsets = [i.header_offset for i in z.infolist()]
        for off in offsets:  # the "encrypted" flag on every member
            data[off + 6] |= 1
        cd = data.rfind(b"PK\x01\x02", 0)
        while cd != -1:
            data[cd + 8] |= 1
            cd = data.rfind(b"PK\x01\x02", 0, cd)
        path.write_bytes(bytes(data))
    else:
        path.write_bytes(b"PK\x03\x04" + os.urandom(4000))
    score, detail = sandbox.run("compare_table", path, good, ALL_SHEET)
    assert score == 0.0 and words in detail, detail


def test_deep_nesting_is_a_zero_not_a_crash(sandbox: Sandbox, files: Path) -> None:
    deep = files / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    score, detail = sandbox.run("check_json", deep, {"expect": [{"key": [0], "ref": 1}]}, {})
    assert score == 0.0 and "RecursionError" in detail, detail


def test_zlib_errors_are_zero(sandbox: Sandbox, files: Path) -> None:
    """``zlib.error`` straight from a member whose stream is not deflate at all."""
    path = files / "raw-zlib.docx"
    src = files / "e.docx"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            zout.writestr(item, zin.read(item.filename))
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("word/document.xml")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start : start + 4] = b"\x07\xff\xff\xff"  # an invalid deflate block type
    path.write_bytes(bytes(data))
    with pytest.raises(zlib.error):
        zipfile.ZipFile(io.BytesIO(bytes(data))).read("word/document.xml")
    score, detail = sandbox.run("compare_docx_files", path, src, {})
    assert score == 0.0 and detail, detail  # python-docx's reason, or the metric's "not a document ... can read"


def test_the_cpu_limit_ends_a_runaway_metric(files: Path) -> None:
    box = Sandbox(Limits(cpu_seconds=2, wall_seconds=30))
    try:
        box.start()  # (its imports are not the metric's time)
        f = files / "re.json"
        f.write_text(json.dumps({"a": "a" * 40 + "!"}))
        rules = {"expect": [{"key": "a", "method": "re", "ref": "^(a+)+$"}]}  # catastrophic backtracking
        t = time.monotonic()
        score, detail = box.run("check_json", f, rules, {})
        assert score == 0.0 and "CPU-time limit of 2 s" in detail, detail
        assert time.monotonic() - t < 10
    finally:
        box.close()


def test_the_wall_time_limit_ends_a_metric_that_takes_too_long(files: Path) -> None:
    box = Sandbox(Limits(cpu_seconds=60, wall_seconds=2))
    try:
        box.start()
        f = files / "re.json"
        f.write_text(json.dumps({"a": "a" * 40 + "!"}))
        rules = {"expect": [{"key": "a", "method": "re", "ref": "^(a+)+$"}]}
        t = time.monotonic()
        score, detail = box.run("check_json", f, rules, {})
        assert score == 0.0 and "wall-time limit" in detail, detail
        assert time.monotonic() - t < 6
    finally:
        box.close()


def test_a_killed_worker_scores_zero_and_the_next_evaluation_works(sandbox: Sandbox, files: Path) -> None:
    f = files / "re2.json"
    f.write_text(json.dumps({"a": "a" * 40 + "!"}))
    rules = {"expect": [{"key": "a", "method": "re", "ref": "^(a+)+$"}]}
    zygote = psutil.Process(sandbox.pid())
    out: list[tuple[float, str]] = []
    t = threading.Thread(target=lambda: out.append(sandbox.run("check_json", f, rules, {})))
    t.start()
    deadline = time.monotonic() + 10
    while not zygote.children() and time.monotonic() < deadline:
        time.sleep(0.05)
    [child] = zygote.children()
    os.kill(child.pid, signal.SIGKILL)
    t.join(20)
    score, detail = out[0]
    assert score == 0.0 and "SIGKILL" in detail, detail
    assert sandbox.run("literal_match", "a", "a", {})[0] == 1.0


def test_a_dead_zygote_is_an_infrastructure_error_then_restarted(files: Path) -> None:
    box = Sandbox(Limits(cpu_seconds=30, wall_seconds=30))
    try:
        box.start()
        f = files / "re3.json"
        f.write_text(json.dumps({"a": "a" * 40 + "!"}))
        rules = {"expect": [{"key": "a", "method": "re", "ref": "^(a+)+$"}]}
        out: list[BaseException | tuple[float, str]] = []

        def run() -> None:
            try:
                out.append(box.run("check_json", f, rules, {}))
            except SandboxError as exc:
                out.append(exc)

        t = threading.Thread(target=run)
        t.start()
        zygote = psutil.Process(box.pid())
        deadline = time.monotonic() + 60  # generous: in CI's system tier two workers share two busy cores
        while not zygote.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert zygote.children(), "the evaluation never reached the zygote"
        zygote.kill()
        t.join(60)
        assert out, "the evaluation did not end when its zygote died"
        assert isinstance(out[0], SandboxError)
        assert box.run("literal_match", "a", "a", {})[0] == 1.0  # a new zygote
    finally:
        box.close()


def test_the_zygote_has_no_network_and_none_of_our_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSFLEET_API_TOKEN", "secret-of-the-host-agent")
    box = Sandbox()
    try:
        box.start()
        pid = box.pid()
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"secret-of-the-host-agent" not in environ and b"OPENBLAS_NUM_THREADS=1" in environ
        if os.geteuid() == 0:
            assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
            assert box.info["network_isolated"] is True
    finally:
        box.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_run_metric_goes_through_the_sandbox(files: Path) -> None:
    """The metric never runs in this process: a far-cell workbook leaves no openpyxl cells here."""
    far = xlsx(files / "far2.xlsx", {"A1": "x", "XFD1048576": "y"})
    score, detail = metrics.run_metric("compare_table", far, files / "e.xlsx", ALL_SHEET)
    assert score == 0.0 and "too many to read" in detail
    assert metrics.run_metric("exact_match", "x", "not rules", {})[0] == 0.0


def test_a_zygote_started_from_a_thread_that_ended_still_evaluates(files: Path) -> None:
    """``start_soon`` starts the zygote from a thread that ends at once; a death signal tied to that thread
    (bwrap's --die-with-parent) killed it, and every first evaluation of a host agent failed (503)."""
    box = Sandbox(Limits(wall_seconds=30))
    try:
        box.start_soon()
        assert box._starter is not None
        box._starter.join(60)
        time.sleep(0.5)  # a death signal would have landed by now
        assert box._alive_locked(), "the zygote died with the thread that started it"
        same = xlsx(files / "same.xlsx", {"A1": "x"})
        assert box.run("compare_table", same, files / "e.xlsx", ALL_SHEET) == (1.0, "1 rule(s) hold")
    finally:
        box.close()


def test_the_zygote_ends_when_its_host_process_dies(tmp_path: Path) -> None:
    """No death signal: the zygote ends on its control socket's EOF, which a killed host agent gives."""
    import subprocess
    import sys

    program = (
        "import sys, time\nfrom osfleet.tasks.jail.sandbox import Sandbox\n"
        "b = Sandbox(); b.start(); print(b._zygote_pid, flush=True); time.sleep(600)\n"
    )
    host = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        zygote = int(host.stdout.readline())
        assert psutil.pid_exists(zygote)
        host.kill()
        host.wait(10)
        deadline = time.monotonic() + 10
        while psutil.pid_exists(zygote) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not psutil.pid_exists(zygote), "the zygote outlived its host agent"
    finally:
        host.kill()
        host.wait(10)
        if host.stdout is not None:
            host.stdout.close()
