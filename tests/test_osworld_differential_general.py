"""The differential check of osfleet's non-office OSWorld metrics against OSWorld's own functions.

For each metric, generated and hand-made values (matching, near misses, corrupt, empty, missing, of the
wrong kind, and the option shapes OSWorld's task files use) are scored by osfleet (``run_metric``, on the
values osfleet's getters give: files as ``Path``) and by OSWorld's function (desktop-env 1.0.2 in its own
virtualenv, through ``tests.osworld_reference.Reference``, on the values OSWorld's getters give: files as
path strings). The scores must be equal. Where OSWorld's function raises, ``DesktopEnv.evaluate`` raises in
turn and the task gets no score, which counts as failed: osfleet must score 0 there.

A case whose reference needs a package this machine lacks (a stand-in is used) cannot be compared: the
metric must then be listed in ``REFERENCE_CANNOT_RUN`` with the reason, and has osfleet unit tests on real
files in ``tests/test_osworld_metrics_general.py``.

The table ``metric | cases | equal``: ``python -m tests.test_osworld_differential_general`` (a script, not a test:
a test that only printed what earlier tests left behind asserted nothing and depended on their order).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import math
import sqlite3
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from osfleet.tasks.osworld_format import metrics
from osfleet.tasks.osworld_format.metrics import METRICS, run_metric
from tests.osworld_reference import Reference, ReferenceError, StandInCalled
from tests.osworld_reference.verified import VERIFIED

pytestmark = pytest.mark.system

# Metrics whose OSWorld function cannot run here, at least for some cases, and why.
REFERENCE_CANNOT_RUN = {
    "compare_pdfs": "OSWorld reads PDFs with PyMuPDF (fitz), which this machine's package index does not serve",
    "compare_pdf_images": "OSWorld extracts PDF images with PyMuPDF (fitz), not served here",
    "compare_archive": "its file_type 'pdf' (the one OSWorld's three tasks use) goes through compare_pdfs (PyMuPDF)",
}

NO_EXPECTED = object()  # OSWorld calls metric(result, **options) when the task has no expected getter
SAME = object()


@dataclass
class Case:
    metric: str
    module: str
    label: str
    result: Any
    expected: Any = NO_EXPECTED
    options: dict[str, Any] = field(default_factory=dict)
    # What OSWorld's getters would give where it is not the same value (the files of a test-suite folder).
    ref_result: Any = SAME
    ref_expected: Any = SAME


@dataclass
class Outcome:
    case: Case
    ours: float
    reason: str
    theirs: float | None  # None: the reference could not run (a stand-in)
    theirs_note: str

    @property
    def equal(self) -> bool:
        if self.theirs is not None and not 0.0 <= self.theirs <= 1.0:
            # OSWorld's run_sqlite3 returns its query's number; osfleet scores a value out of [0, 1] 0 and says so
            # (osfleet.tasks.rewards: every reward is in [0, 1]).
            return self.ours == 0.0 and "not a number in [0, 1]" in self.reason
        return self.theirs is not None and math.isclose(self.ours, self.theirs, rel_tol=1e-9, abs_tol=1e-9)


def _for_reference(value: Any) -> Any:
    """OSWorld's getters give path strings where osfleet's give ``Path``s."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_for_reference(v) for v in value]
    if isinstance(value, dict):
        return {k: _for_reference(v) for k, v in value.items()}
    return value


def score_both(ref: Reference, case: Case) -> Outcome:
    expected = None if case.expected is NO_EXPECTED else case.expected
    ours, reason = run_metric(case.metric, case.result, expected, case.options)
    args = [_for_reference(case.result if case.ref_result is SAME else case.ref_result)]
    if case.expected is not NO_EXPECTED:
        args.append(_for_reference(case.expected if case.ref_expected is SAME else case.ref_expected))
    try:
        theirs: float | None = ref.score(case.module, case.metric, *args, **case.options)
        note = ""
    except ReferenceError as exc:
        theirs, note = 0.0, f"raised ({exc}): no score, counted 0"
    except StandInCalled as exc:
        theirs, note = None, str(exc)
    return Outcome(case, ours, reason, theirs, note)


# ---------------------------------------------------------------------------------------------------- files


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_bytes(data.encode())
    else:
        path.write_bytes(data)
    return path


def image(path: Path, size: tuple[int, int] = (64, 48), mode: str = "RGB", seed: int = 0, **kw: Any) -> Path:
    """A picture with structure (gradients and a few shapes), deterministic by ``seed``."""
    import numpy as np
    from PIL import Image, ImageDraw

    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), ((xx + yy + seed * 37) % 256)], axis=2)
    img = Image.fromarray(base.astype("uint8"), "RGB")
    draw = ImageDraw.Draw(img)
    draw.rectangle((w // 5, h // 5, w // 2, h // 2), fill=(200, 30 + seed * 20 % 200, 40))
    draw.ellipse((w // 2, h // 3, w - 3, h - 3), fill=(10, 10 + seed * 50 % 240, 220))
    if mode != "RGB":
        img = img.convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, **kw)
    return path


def pdf(path: Path, pages: list[str], jpeg: bytes | None = None) -> Path:
    """A small PDF written by hand: Helvetica text lines per page, optionally one embedded JPEG image."""
    objects: list[bytes] = []
    page_ids = []
    font_id = 3
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(b"")  # pages, filled below
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    image_id = None
    if jpeg is not None:
        from PIL import Image

        w, h = Image.open(io.BytesIO(jpeg)).size  # from memory: nothing to close
        head = f"<< /Type /XObject /Subtype /Image /Width {w} /Height {h} /ColorSpace /DeviceRGB "
        head += f"/BitsPerComponent 8 /Filter /DCTDecode /Length {len(jpeg)} >>\nstream\n"
        objects.append(head.encode() + jpeg + b"\nendstream")
        image_id = len(objects)
    for text in pages:
        ops = ["BT /F1 12 Tf 72 720 Td 14 TL"]
        for line in text.split("\n"):
            escaped = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
            ops.append(f"({escaped}) Tj T*")
        ops.append("ET")
        if image_id is not None:
            ops.append("q 100 0 0 80 72 500 cm /Im1 Do Q")
        content = "\n".join(ops).encode()
        objects.append(b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream")
        content_id = len(objects)
        resources = f"<< /Font << /F1 {font_id} 0 R >>"
        resources += f" /XObject << /Im1 {image_id} 0 R >> >>" if image_id else " >>"
        page = f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {content_id} 0 R "
        page += f"/Resources {resources} >>"
        objects.append(page.encode())
        page_ids.append(len(objects))
    kids = " ".join(f"{i} 0 R" for i in page_ids)
    objects[1] = f"<< /Type /Pages /Kids [{kids}] /Count {len(page_ids)} >>".encode()
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return write(path, bytes(out))


def jpeg_bytes(seed: int, size: tuple[int, int] = (64, 48)) -> bytes:
    buf = io.BytesIO()
    import numpy as np
    from PIL import Image

    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    arr = np.stack([(xx * 4 + seed * 60) % 256, (yy * 5) % 256, ((xx * yy) // 8 + seed * 90) % 256], axis=2)
    Image.fromarray(arr.astype("uint8"), "RGB").save(buf, "JPEG", quality=90)
    return buf.getvalue()


def zip_file(path: Path, members: dict[str, bytes | str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def tar_file(path: Path, members: dict[str, bytes | str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as t:
        for name, data in members.items():
            raw = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            t.addfile(info, io.BytesIO(raw))
    return path


# ---------------------------------------------------------------------------------------------------- cases
# One builder per OSWorld module; each returns its cases, making their files under ``d``.


def general_cases(d: Path) -> Iterator[Case]:
    def c(metric: str, label: str, result: Any, expected: Any = NO_EXPECTED, **options: Any) -> Case:
        return Case(metric, "general", label, result, expected, options)

    for label, result, rules in [
        ("equal", "true\n", {"expected": "true\n"}),
        ("no newline", "true", {"expected": "true\n"}),
        ("None", None, {"expected": "true"}),
        ("list result", ["a"], {"expected": ["a"]}),
        ("int vs str", 1, {"expected": "1"}),
        ("rules not a dict", "x", "x"),
        ("no expected key", "x", {"include": ["x"]}),
    ]:
        yield c("exact_match", label, result, rules)
    yield c("exact_match", "unknown option", "x", {"expected": "x"}, ignore_case=True)
    for label, result, rules in [
        ("all in", "a b c", {"include": ["a", "b"], "exclude": ["z"]}),
        ("one missing", "a c", {"include": ["a", "b"], "exclude": []}),
        ("excluded present", "a b z", {"include": ["a"], "exclude": ["z"]}),
        ("empty rules", "anything", {"include": [], "exclude": []}),
        ("no keys", "anything", {}),
        ("None", None, {"include": ["a"]}),
        ("newline in include", "54\n", {"include": ["54\n"], "exclude": []}),
        ("list result", ["a", "b"], {"include": ["a"], "exclude": ["c"]}),
        ("int item", "a1", {"include": [1]}),
        ("rules a list", "a", ["a"]),
    ]:
        yield c("check_include_exclude", label, result, rules)
    for label, result, expected, options in [
        ("str equal", "abc", "abc", {}),
        ("str case", "ABC", "abc", {}),
        ("str ignore case", "ABC", "abc", {"ignore_case": True}),
        ("number and str", 3, "3", {}),
        ("rule dict not unwrapped", "q1", {"expected": "q1"}, {}),
        ("list ignore case", ["Bob", "42"], ["bob", 42], {"type": "list", "ignore_case": True}),
        ("list case", ["Bob"], ["bob"], {"type": "list"}),
        ("list lengths", ["a"], ["a", "b"], {"type": "list"}),
        ("list vs str", "a", ["a"], {"type": "list"}),
        ("unknown type", "a", "a", {"type": "set"}),
        ("None and None", None, None, {}),
    ]:
        yield c("literal_match", label, result, expected, **options)
    for label, result, rules in [
        ("in list", ["/home/user/Desktop/helloExtension", "/x"], {"expected": "/home/user/Desktop/helloExtension"}),
        ("not in list", ["/x"], {"expected": "/y"}),
        ("substring", "# packages in environment at /opt", {"expected": "packages in environment at"}),
        ("None", None, {"expected": "a"}),
        ("no rule key", ["a"], {}),
        ("dict result", {"a": 1}, {"expected": "a"}),
    ]:
        yield c("is_in_list", label, result, rules)

    a = write(d / "diff" / "a.js", "line1\nline2\nline3\n")
    b = write(d / "diff" / "b.js", "line1\nline2 changed\nline3\n")
    crlf = write(d / "diff" / "crlf.js", "line1\r\nline2\r\nline3\r\n")
    empty = write(d / "diff" / "empty.txt", "")
    binary = write(d / "diff" / "bin.dat", b"\xff\xfe\x00bad")
    for label, r, e in [
        ("same", a, a),
        ("one line differs", a, b),
        ("CRLF vs LF", crlf, a),
        ("empty vs text", empty, a),
        ("both empty", empty, empty),
        ("None", None, a),
        ("expected None", a, None),
        ("not UTF-8", binary, a),
        ("missing file", d / "nope.txt", a),
    ]:
        yield c("diff_text_file", label, r, e)

    report = write(d / "report.txt", "Linux\n12:00:01 AM CPU %user %nice %system %iowait %steal %idle\n")
    times = write(d / "times.txt", "".join(f"10:{i:02d}:00 x\n" for i in range(31)) + "no time here\n25:00:00\n")
    for label, r, rules in [
        ("all present", report, {"expected": ["CPU", "%user", "%idle"]}),
        ("one missing", report, {"expected": ["CPU", "%guest"]}),
        ("None", None, {"expected": ["CPU"]}),
        ("string expected (chars)", report, {"expected": "CPU"}),
        ("no expected key", report, {}),
        ("not UTF-8", binary, {"expected": ["x"]}),
    ]:
        yield c("file_contains", label, r, rules)
    for label, r, rules in [
        ("31 lines", times, {"expected": "31"}),
        ("wrong count", times, {"expected": "30"}),
        ("int expected", times, {"expected": 31}),
        ("not a number", times, {"expected": "many"}),
        ("None", None, {"expected": "1"}),
        ("missing", d / "none.txt", {"expected": "0"}),
        ("empty file", empty, {"expected": "0"}),
    ]:
        yield c("check_line_number", label, r, rules)

    listing = write(d / "wmctrl.out", "0x1 0 org.gnome.Nautilus.Org.gnome.Nautilus host OSWorld\nsecond line\n")
    for label, r, rules in [
        ("expect found", listing, {"expect": [r"\bOSWorld\b", "second"]}),
        ("expect missing", listing, {"expect": ["third"]}),
        ("unexpect any line", listing, {"unexpect": [".+"]}),
        ("unexpect on empty file", empty, {"unexpect": [".+"]}),
        ("expect on empty file", empty, {"expect": ["x"]}),
        ("bad regex", listing, {"expect": ["("]}),
        ("None", None, {"expect": ["x"]}),
        ("anchors per line", listing, {"expect": ["^second line$"]}),
        ("no rules", listing, {}),
    ]:
        yield c("check_list", label, r, rules)

    accounts = write(
        d / "accounts.csv",
        "url,user,password\nimap://outlook.office365.com,anonym-x2024@outlook.com,p\\$;\n"
        'smtp://smtp.office365.com,anonym-x2024@outlook.com,"multi\r\nline"\n',
    )
    rec = {"url": "imap://outlook.office365.com", "user": "anonym-x2024@outlook.com"}
    for label, r, rules in [
        ("expect found", accounts, {"expect": [rec]}),
        ("expect with password", accounts, {"expect": [{**rec, "password": "p\\$;"}]}),
        ("expect wrong value", accounts, {"expect": [{**rec, "user": "x"}]}),
        ("unexpect present", accounts, {"unexpect": [rec]}),
        ("unexpect absent", accounts, {"unexpect": [{"url": "pop://x"}]}),
        ("multi-line field", accounts, {"expect": [{"password": "multi\nline"}]}),
        ("empty file", empty, {"expect": [rec]}),
        ("empty file, no expect", empty, {"unexpect": [rec]}),
        ("None", None, {"expect": []}),
        ("unknown column", accounts, {"expect": [{"port": "1"}]}),
    ]:
        yield Case("check_csv", "general", label, r, rules)

    db = d / "global-messages-db.sqlite"
    con = sqlite3.connect(db)
    con.executescript(
        "create table messages(id integer, folderID integer);"
        "create table messageAttributes(attributeID integer, value integer, messageID integer);"
        "insert into messages values (1, 13), (2, 7);"
        "insert into messageAttributes values (58, 1, 1), (58, 1, 2);"
    )
    con.commit()
    con.close()
    sql = (
        "select sum(1) > 0 from messageAttributes where attributeID = 58 and value = 1 and messageID in "
        "(select id from messages where folderID = 13);"
    )
    for label, r, rules in [
        ("task query true", db, {"sql": sql}),
        ("task query false", db, {"sql": sql.replace("13", "99")}),
        ("count above 1", db, {"sql": "select count(*) from messageAttributes"}),
        ("null is 0", db, {"sql": "select null"}),
        ("no row", db, {"sql": "select id from messages where id = 42"}),
        ("no such table", db, {"sql": "select * from nothing"}),
        ("not a database", report, {"sql": "select 1"}),
        ("None", None, {"sql": "select 1"}),
        ("string value", db, {"sql": "select '0.5'"}),
    ]:
        yield c("run_sqlite3", label, r, rules)

    manifest = write(
        d / "manifest.json",
        json.dumps({"name": "happy-extension", "version": "0.0.1", "background": {"scripts": ["bg.js"]}, "n": [1, 2]}),
    )
    yaml_file = write(d / "_config.yaml", "name: Test Account\nauthor:\n  name: Test Account\n  email: T@g.com\n")
    xul = write(d / "xulstore.json", json.dumps({"chrome://m": {"folderTree": {"mode": "smart,favorite"}}}))
    for label, r, rules, options in [
        ("expect eq", manifest, {"expect": [{"key": ["name"], "method": "eq", "ref": "happy-extension"}]}, {}),
        (
            "expect list eq",
            manifest,
            {"expect": [{"key": ["background", "scripts"], "method": "eq", "ref": ["bg.js"]}]},
            {},
        ),
        ("expect ne fails", manifest, {"expect": [{"key": ["version"], "method": "ne", "ref": "0.0.1"}]}, {}),
        ("missing key", manifest, {"expect": [{"key": ["nope"], "method": "eq", "ref": 1}]}, {}),
        ("list index", manifest, {"expect": [{"key": ["n", 1], "method": "ge", "ref": 2}]}, {}),
        ("list index out of range", manifest, {"expect": [{"key": ["n", 5], "method": "eq", "ref": 2}]}, {}),
        ("key as a string", manifest, {"expect": [{"key": "n", "method": "eq", "ref": [1, 2]}]}, {}),
        ("no method", manifest, {"expect": [{"key": ["name"], "ref": "happy-extension"}]}, {}),
        ("unknown method", manifest, {"expect": [{"key": ["name"], "method": "has", "ref": "h"}]}, {}),
        (
            "re with word boundary",
            xul,
            {"expect": [{"key": ["chrome://m", "folderTree", "mode"], "method": "re", "ref": "\\bsmart\\b"}]},
            {},
        ),
        (
            "re.I",
            xul,
            {"expect": [{"key": ["chrome://m", "folderTree", "mode"], "method": "re.I", "ref": "SMART"}]},
            {},
        ),
        ("approx", manifest, {"expect": [{"key": ["version"], "method": "approx:0.5", "ref": 0.2}]}, {}),
        ("range.te", manifest, {"expect": [{"key": ["n", 0], "method": "range.te", "ref": [0, 1]}]}, {}),
        (
            "str_set_eq",
            yaml_file,
            {"expect": [{"key": ["name"], "method": "str_set_eq", "ref": ["Test Account"]}]},
            {"is_yaml": True},
        ),
        (
            "unexpect missing key with null ref",
            manifest,
            {"unexpect": [{"key": ["nope"], "method": "eq", "ref": None}]},
            {},
        ),
        ("unexpect missing key", manifest, {"unexpect": [{"key": ["nope"], "method": "eq", "ref": 1}]}, {}),
        ("unexpect matches", manifest, {"unexpect": [{"key": ["name"], "method": "re", "ref": "happy"}]}, {}),
        ("unexpect re on missing key", manifest, {"unexpect": [{"key": ["nope"], "method": "re", "ref": "x"}]}, {}),
        (
            "yaml",
            yaml_file,
            {"expect": [{"key": ["author", "email"], "method": "eq", "ref": "T@g.com"}]},
            {"is_yaml": True},
        ),
        ("yaml read as json", yaml_file, {"expect": []}, {}),
        ("empty yaml", empty, {"expect": []}, {"is_yaml": True}),
        ("bad yaml", write(d / "bad.yaml", "a: [1,\n"), {"expect": []}, {"is_yaml": True}),
        ("None", None, {"expect": []}, {}),
        ("missing file", d / "missing.json", {"expect": []}, {}),
        ("lt across types", manifest, {"expect": [{"key": ["name"], "method": "lt", "ref": 3}]}, {}),
        ("unknown option", manifest, {"expect": []}, {"strict": True}),
    ]:
        yield c("check_json", label, r, rules, **options)

    for label, result, rules in [
        (
            "dict equal",
            {"q": "drip coffee maker", "tbs": "mr:1"},
            {"expected": {"q": "drip coffee maker", "tbs": "mr:1"}},
        ),
        ("dict one differs", {"q": "drip", "tbs": "mr:1"}, {"expected": {"q": "drip coffee maker"}}),
        ("string with single quotes", "{'time': 'march-weather'}", {"expected": {"time": "march-weather"}}),
        ("bad json string", "{time: 1}", {"expected": {"time": 1}}),
        ("evaluation failed", {"a": 1}, {"expected": {"a": "__EVALUATION_FAILED__"}}),
        ("empty expected", {"a": 1}, {"expected": {}}),
        ("None", None, {"expected": {"a": 1}}),
        ("missing key", {"b": 1}, {"expected": {"a": None}}),
        ("ignore_list_order", {"a": [2, 1]}, {"expected": {"a": [1, 2], "ignore_list_order": True}}),
        (
            "expect_in_result list",
            {"h1": ["Kilimanjaro", "x"], "h2": "Everest"},
            {"expected": {"h1": ["Kilimanjaro"], "h2": ["Himalayas", "Everest"]}, "expect_in_result": True},
        ),
        ("expect_in_result miss", {"h1": ["Kibo"]}, {"expected": {"h1": ["Kilimanjaro"]}, "expect_in_result": True}),
        (
            "expect_in_result substring",
            {"t": "Buying-Tickets page"},
            {"expected": {"t": "Tickets"}, "expect_in_result": True},
        ),
        ("expect_in_result None value", {}, {"expected": {"t": "Tickets"}, "expect_in_result": True}),
        ("expect_in_result number", {"t": 1}, {"expected": {"t": 1}, "expect_in_result": True}),
        ("result a list", [1], {"expected": {"a": 1}}),
        ("expected a list", {"a": 1}, {"expected": ["a"]}),
    ]:
        yield c("check_direct_json_object", label, result, rules)

    speed = d / "speedtest.csv"
    now = dt.datetime.now()
    for label, minutes, limit in [("within", 10, "60"), ("outside", 200, "60"), ("int limit", 5, 60)]:
        when = (now - dt.timedelta(minutes=minutes)).strftime("%Y-%m-%d %H:%M")
        f = write(d / f"speed-{label}.csv", f"Server,Date,Download\nX,{when},93.2\n")
        yield c("compare_time_in_speedtest_results", label, f, limit)
    last = write(speed, f"Server,Date\nX,{now.strftime('%Y-%m-%d %H:%M')}\n")
    yield c("compare_time_in_speedtest_results", "time is the last field (newline kept)", last, "60")
    yield c("compare_time_in_speedtest_results", "one line", write(d / "one.csv", "Server,Date\n"), "60")
    yield c("compare_time_in_speedtest_results", "None", None, "60")
    yield c("compare_time_in_speedtest_results", "bad limit", write(d / "s2.csv", f"a,b\nX,{now:%H:%M},1\n"), "x")

    py_a = write(d / "colab.py", "#!/usr/bin/env python\n# coding: utf-8\nimport os\n\n\tx = 1   \nprint(x)\n")
    py_b = write(d / "colab_gold.py", "import os\n    x = 1\n\n\nprint(x)")
    py_c = write(d / "colab_bad.py", "```python\nimport os\n    x = 1\nprint(x)\n```\n")
    for label, r, e in [
        ("same code", py_a, py_b),
        ("markdown fences", py_c, py_b),
        ("None", None, py_b),
        ("expected None", py_a, None),
        ("not UTF-8", binary, py_b),
        ("empty vs empty", empty, empty),
    ]:
        yield c("compare_python_pure_text", label, r, e)

    docx_ok, docx_two = d / "AllLocations.docx", d / "two.docx"
    import docx

    document = docx.Document()
    for words in ["深圳市福田区益田路5055号", "福田区莲科路18号", "深圳市福田区正义街1号"]:
        document.add_paragraph(words)
    document.save(docx_ok)
    document = docx.Document()
    document.add_paragraph("one two")
    document.save(docx_two)
    answers = ["深圳市福田区益田路5055号信息枢纽大厦", "福田区莲科路18号莲花一村警务室", "深圳市福田区正义街1号"]
    for label, r, rules in [
        ("three places", docx_ok, {"expected": answers}),
        ("two words", docx_two, {"expected": answers}),
        ("no answers", docx_ok, {"expected": []}),
        ("None", None, {"expected": answers}),
        ("not a docx", report, {"expected": answers}),
    ]:
        yield c("fuzzy_place_math", label, r, rules)

    tree = (
        '<desktop-frame xmlns:attr="https://accessibility.ubuntu.example.org/ns/attributes">'
        '<application name="Thunderbird"><page-tab-list attr:id="tabmail-tabs">'
        '<page-tab name="About Profiles">About Profiles</page-tab><page-tab name="Inbox">Inbox</page-tab>'
        "</page-tab-list></application></desktop-frame>"
    )
    tab = 'application[name=Thunderbird] page-tab-list[attr|id="tabmail-tabs"]>page-tab[name="About Profiles"]'
    for label, r, rules, options in [
        ("selector found", tree, [{"selectors": [tab]}], {}),
        ("selector missing", tree, [{"selectors": ['page-tab[name="Settings"]']}], {}),
        ("xpath text exact", tree, [{"xpath": "//page-tab[@name='Inbox']", "text": "Inbox", "exact": True}], {}),
        ("xpath text exact miss", tree, [{"xpath": "//page-tab", "text": "Inbo", "exact": True}], {}),
        ("fuzzy text", tree, [{"xpath": "//page-tab", "text": "Inbx", "exact": False}], {}),
        ("text without exact", tree, [{"xpath": "//page-tab", "text": "Inbox"}], {}),
        ("neither xpath nor selectors", tree, [{"text": "x"}], {}),
        ("not XML", "<a><b></a>", [{"xpath": "//a"}], {}),
        ("None", None, [{"xpath": "//a"}], {}),
        ("windows namespaces", tree, [{"xpath": "//application"}], {"osname": "windows"}),
        ("unknown os", tree, [{"xpath": "//application"}], {"osname": "beos"}),
        ("xpath count", tree, [{"xpath": "count(//page-tab)"}], {}),
    ]:
        yield c("check_accessibility_tree", label, r, rules, **options)


def vscode_cases(d: Path) -> Iterator[Case]:
    def c(metric: str, label: str, result: Any, expected: Any = NO_EXPECTED, **options: Any) -> Case:
        return Case(metric, "vscode", label, result, expected, options)

    settings = write(
        d / "settings.json", json.dumps({"editor.wordWrapColumn": 50, "files.exclude": {"**/__pycache__": True}})
    )
    jsonc = write(d / "settings-comments.json", '// comment\n{"a": 1}')
    empty = write(d / "empty.json", "")
    for label, r, rules in [
        ("equal value", settings, {"expected": {"editor.wordWrapColumn": 50}}),
        ("nested object", settings, {"expected": {"files.exclude": {"**/__pycache__": True}}}),
        ("different value", settings, {"expected": {"editor.wordWrapColumn": 80}}),
        ("missing key", settings, {"expected": {"debug.focusEditorOnBreak": False}}),
        ("empty expectation", settings, {"expected": {}}),
        ("comments (not JSON)", jsonc, {"expected": {}}),
        ("empty file", empty, {"expected": {}}),
        ("None", None, {"expected": {}}),
        ("no expected key", settings, {}),
        ("a list file", write(d / "list.json", "[1]"), {"expected": {"a": 1}}),
    ]:
        yield c("check_json_settings", label, r, rules)

    binding = {"key": "ctrl+j", "command": "workbench.action.focusActiveEditorGroup", "when": "terminalFocus"}
    kb = write(d / "keybindings.json", json.dumps([binding]))
    kb_comment = write(d / "kb-comment.json", "// Place your key bindings in this file\n" + json.dumps([binding]))
    kb_object = write(d / "kb-object.json", json.dumps({"a": binding}))
    for label, r, rules in [
        ("bound", kb, {"expected": binding}),
        ("first line a comment", kb_comment, {"expected": binding}),
        ("other binding", kb, {"expected": {**binding, "key": "ctrl+k"}}),
        ("an object", kb_object, {"expected": binding}),
        ("empty", empty, {"expected": binding}),
        ("None", None, {"expected": binding}),
        ("missing file", d / "none.json", {"expected": binding}),
    ]:
        yield c("check_json_keybindings", label, r, rules)

    a = write(d / "a.txt", "Hello  World\n\n")
    b = write(d / "b.txt", "hello world")
    tabs = write(d / "tabs.txt", "Hello\tWorld")
    crlf = write(d / "crlf.txt", "hello world\r\n")
    for label, r, e, options in [
        ("equal", b, b, {}),
        ("differs", a, b, {}),
        ("ignore blanks and case", a, b, {"ignore_blanks": True, "ignore_case": True}),
        ("ignore blanks only", a, b, {"ignore_blanks": True}),
        ("tabs", tabs, a, {"ignore_blanks": True}),
        ("CRLF", crlf, b, {"ignore_blanks": True}),
        ("CRLF exact", crlf, write(d / "lf.txt", "hello world\n"), {}),
        ("None", None, b, {}),
        ("expected None", a, None, {}),
        ("not UTF-8", write(d / "latin.txt", b"caf\xe9"), b, {}),
    ]:
        yield c("compare_text_file", label, r, e, **options)

    cfg = write(d / "OpenProject.txt", "project")
    for label, r, rules in [
        ("equal", cfg, {"expected": "project"}),
        ("trailing newline", write(d / "p2.txt", "project\n"), {"expected": "project"}),
        (
            "settings text",
            write(d / "s.json", '{"workbench.colorTheme": "Visual Studio Dark"}\n'),
            {"expected": '{"workbench.colorTheme": "Visual Studio Dark"}\n'},
        ),
        ("None", None, {"expected": "project"}),
        ("empty string", "", {"expected": ""}),
    ]:
        yield c("compare_config", label, r, rules)

    for label, result, rules in [
        ("contain", "ms-python.python\n", {"type": "contain", "expected": "ms-python.python"}),
        ("contain miss", "", {"type": "contain", "expected": "mattn.lisp"}),
        ("not_contain", "x\n", {"type": "not_contain", "expected": "y"}),
        ("unknown type", "x", {"type": "equal", "expected": "x"}),
        ("None", None, {"type": "contain", "expected": "x"}),
    ]:
        yield c("is_extension_installed", label, result, rules)

    zipped = {
        "a.txt": "alpha",
        "docs/b.txt": "beta",
        "r.pdf": pdf(d / "zr.pdf", ["Report line one", "Page two"]).read_bytes(),
    }
    z1 = zip_file(d / "z1.zip", zipped)
    z2 = zip_file(d / "z2.zip", zipped)
    z3 = zip_file(d / "z3.zip", {**zipped, "a.txt": "ALPHA"})
    z4 = zip_file(d / "z4.zip", {k: v for k, v in zipped.items() if k != "a.txt"})
    z5 = zip_file(d / "z5.zip", {**zipped, "r.pdf": pdf(d / "zr2.pdf", ["Report line one", "Page 2"]).read_bytes()})
    z6 = zip_file(d / "z6.zip", {**zipped, "r.pdf": pdf(d / "zr3.pdf", ["Something else entirely"]).read_bytes()})
    for label, r, e in [
        ("same", z1, z2),
        ("member differs", z3, z2),
        ("member missing", z4, z2),
        ("pdf nearly same text", z5, z2),
        ("pdf other text", z6, z2),
        ("None", None, z2),
        ("not a zip", b, z2),
    ]:
        yield c("compare_zip_files", label, r, e)

    res, gold = write(d / "result.txt", "The answer is 42.0\n"), write(d / "result_gold.txt", "42.0")
    for label, r, e in [
        ("number in text", res, gold),
        ("numbers close", write(d / "r2.txt", "42.00001"), gold),
        ("numbers apart", write(d / "r3.txt", "41"), gold),
        ("text equal", write(d / "r4.txt", " abc \n"), write(d / "g4.txt", "abc")),
        ("text differs", write(d / "r5.txt", "abc"), write(d / "g5.txt", "abd")),
        ("gold number, result text", write(d / "r6.txt", "many"), gold),
        ("None", None, gold),
    ]:
        yield c("compare_result_files", label, r, e)

    page = write(
        d / "index.html", "<html><head><style>body { background-image: url('anmi_sharper.png'); }</style></head></html>"
    )
    for label, r, e in [
        ("set", page, {"type:": "value", "value": "anmi_sharper.png"}),
        ("other image", page, {"value": "anmi.png"}),
        ("no style", write(d / "plain.html", "<p>x</p>"), {"value": "anmi.png"}),
        ("None", None, {"value": "x"}),
        ("rule None, style present", page, None),
    ]:
        yield c("check_html_background_image", label, r, e)

    suite_dir = d / "suite"
    write(suite_dir / "snake.py", "class Snake:\n    def __init__(self):\n        self.length = 3\n")
    tests = {
        "passes": "from snake import Snake\ndef test():\n    return Snake().length == 3\n",
        "fails": "from snake import Snake\ndef test():\n    return Snake().length == 4\n",
        "half": "def test():\n    return 0.5\n",
        "clamped": "def test():\n    return 7\n",
        "truthy": "def test():\n    return 'yes'\n",
        "raises": "def test():\n    raise RuntimeError('boom')\n",
        "no test": "def check():\n    return True\n",
        "syntax": "def test(:\n",
        "import fails": "import no_such_module_here\ndef test():\n    return True\n",
    }
    for label, body in tests.items():
        slug = label.replace(" ", "_")
        # OSWorld's cache folder: the agent's files and the suite under their own names, side by side.
        theirs = d / f"osworld-{slug}"
        their_files = [write(theirs / "snake.py", (suite_dir / "snake.py").read_text())]
        their_suite = write(theirs / "test_suite.py", body)
        # osfleet's getters number the files they fetch into one work folder.
        ours = d / f"osfleet-{slug}"
        files = [write(ours / "0-snake.py", (suite_dir / "snake.py").read_text())]
        gold = write(ours / "1-test_suite.py", body)
        case = c("check_python_file_by_test_suite", label, files, gold)
        case.ref_result, case.ref_expected = their_files, their_suite
        yield case
    named = write(suite_dir / "test_named.py", "def check():\n    return True\n")
    yield c("check_python_file_by_test_suite", "test_function_name", [], named, test_function_name="check")
    yield c("check_python_file_by_test_suite", "no suite", [], None)
    yield c("check_python_file_by_test_suite", "missing suite", [], d / "none.py")


def chrome_cases(d: Path) -> Iterator[Case]:
    def c(metric: str, label: str, result: Any, expected: Any = NO_EXPECTED, **options: Any) -> Case:
        return Case(metric, "chrome", label, result, expected, options)

    for label, tab, url in [
        ("same", {"url": "https://www.drugs.com/npc/"}, "https://www.drugs.com/npc/"),
        ("www and suffix dropped", "https://drugs.co.uk/npc", "https://www.drugs.com/npc"),
        ("trailing slash", "https://www.nfl.com/", "https://www.nfl.com"),
        ("no scheme", "nfl.com/scores", "https://nfl.com/scores"),
        ("scheme differs", "http://nfl.com/scores", "https://nfl.com/scores"),
        (
            "query differs",
            "https://www.apple.com/iphone/compare/?modelList=a",
            "https://www.apple.com/iphone/compare/?modelList=b",
        ),
        ("subdomain kept", "https://discussions.flightaware.com/t/1", "https://flightaware.com/t/1"),
        ("chrome url", "chrome://password-manager/passwords", "chrome://password-manager/passwords"),
        ("port", "https://www.x.com:8080/a", "https://x.com/a"),
        ("dict without url", {"title": "x"}, "https://x.com"),
        ("empty", "", "https://x.com"),
        ("None", None, "https://x.com"),
    ]:
        yield c("is_expected_active_tab", label, tab, {"type": "url", "url": url})
    yield c("is_expected_active_tab", "unknown type", "https://x.com", {"type": "title", "url": "x"})
    yield c("is_expected_active_tab", "no type", "https://x.com", {"url": "x"})

    for label, result, patterns in [
        (
            "all found",
            "https://www.target.com/c/toys?AgeAppropriate:Kids&search=spider-man%20toys&S=4",
            ["AgeAppropriate:Kids", "search=spider[-%20]?man%20toys", "S=4"],
        ),
        ("one missing", "https://www.target.com/c/toys?S=4", ["AgeAppropriate:Kids", "S=4"]),
        ("dict", {"url": "https://a.com/women-jerseys/x"}, ["/women-jerseys/"]),
        ("dict without url", {"title": "x"}, ["x"]),
        ("string patterns (chars)", "abc", "ab"),
        ("bad regex", "abc", ["("]),
        ("None", None, ["x"]),
        ("list result", ["https://a.com"], ["a"]),
    ]:
        yield c("is_expected_url_pattern_match", label, result, {"expected": patterns})

    for label, installed, want in [
        ("all installed", ["Zoom Chrome Extension", "Momentum", "Google Translate"], ["Momentum", "Google Translate"]),
        ("one missing", ["Momentum"], ["Momentum", "Google Translate"]),
        ("none installed", [], ["Momentum"]),
        ("getter failed (a string)", "Google", ["Google"]),
    ]:
        yield c("is_expected_installed_extensions", label, installed, {"expected": want})

    tabs = [{"title": "a", "url": "https://www.lonelyplanet.com/"}, {"title": "b", "url": "https://airbnb.com.sg"}]
    for label, result, urls in [
        ("same tabs", tabs, ["https://www.lonelyplanet.com", "https://www.airbnb.com"]),
        ("extra tab", [*tabs, {"url": "https://x.com"}], ["https://www.lonelyplanet.com", "https://www.airbnb.com"]),
        ("same url twice", [tabs[0], tabs[0]], ["https://www.lonelyplanet.com", "https://lonelyplanet.com"]),
        ("missing tab", tabs, ["https://www.lonelyplanet.com", "https://www.tripadvisor.com"]),
        ("file url", [{"url": "file:///home/user/Desktop/a.html"}], ["file:///home/user/Desktop/a.html"]),
        ("no tabs", [], ["https://x.com"]),
        ("tab without url", [{"title": "x"}], ["https://x.com"]),
    ]:
        yield c("is_expected_tabs", label, result, {"type": "url", "urls": urls})
    yield c("is_expected_tabs", "unknown type", tabs, {"type": "title", "urls": []})

    bar = {
        "bookmark_bar": {
            "children": [
                {"type": "folder", "name": "Favorites", "children": []},
                {"type": "url", "name": "t", "url": "https://jalammar.github.io/illustrated-transformer/"},
                {
                    "type": "folder",
                    "name": "Liked Authors",
                    "children": [
                        {"type": "url", "name": "a", "url": "https://jimfan.me/"},
                        {"type": "url", "name": "b", "url": "https://ai.stanford.edu/~dahuang/"},
                    ],
                },
            ]
        }
    }
    liked = [
        ["https://jimfan.me/", "https://research.nvidia.com/person/linxi-jim-fan"],
        ["https://research.nvidia.com/person/de-an-huang", "https://ai.stanford.edu/~dahuang/"],
    ]
    for label, result, rule in [
        ("folder names", bar, {"type": "bookmark_bar_folders_names", "names": ["Favorites", "Liked Authors"]}),
        ("folder names differ", bar, {"type": "bookmark_bar_folders_names", "names": ["Favorites"]}),
        (
            "site urls",
            bar,
            {"type": "bookmark_bar_websites_urls", "urls": ["https://jalammar.github.io/illustrated-transformer/"]},
        ),
        ("site urls differ", bar, {"type": "bookmark_bar_websites_urls", "urls": ["https://jalammar.github.io/"]}),
        ("liked authors", bar, {"type": "liked_authors_websites_urls", "names": ["Liked Authors"], "urls": liked}),
        (
            "liked authors, a string alternative",
            bar,
            {
                "type": "liked_authors_websites_urls",
                "urls": ["https://jimfan.me/", ["https://ai.stanford.edu/~dahuang/"]],
            },
        ),
        (
            "liked authors missing one",
            bar,
            {"type": "liked_authors_websites_urls", "urls": [*liked, ["https://yukezhu.me/"]]},
        ),
        ("no liked folder", {"bookmark_bar": {"children": []}}, {"type": "liked_authors_websites_urls", "urls": liked}),
        ("no bookmarks", {}, {"type": "bookmark_bar_folders_names", "names": []}),
        ("unknown type", bar, {"type": "other"}),
        ("no bar", {"other": 1}, {"type": "bookmark_bar_folders_names", "names": []}),
    ]:
        yield c("is_expected_bookmarks", label, result, rule)

    for label, result, rule in [
        (
            "query found",
            {"url": "https://www.google.com/search?q=Nereida&sca=1"},
            {"expect": {"pattern": "www\\.google\\.com.*?/search\\?q=Nereida&"}},
        ),
        ("query missing", {"url": "https://www.google.com/search?q=Other&"}, {"expect": {"pattern": "q=Nereida&"}}),
        ("string result", "https://www.google.com/search?q=Nereida&", {"expect": {"pattern": "q=Nereida&"}}),
        ("None", None, {"expect": {"pattern": "x"}}),
    ]:
        yield c("is_expected_search_query", label, result, rule)

    cookies = [[1, ".amazon.com", "session"], [2, "www.example.org", "x"]]
    for label, result, rule in [
        ("cookie left", cookies, {"type": "domains", "domains": [".amazon.com"]}),
        ("deleted", cookies[1:], {"type": "domains", "domains": [".amazon.com"]}),
        ("suffix ignored", [[1, "amazon.co.uk", "x"]], {"type": "domains", "domains": [".amazon.com"]}),
        ("no cookies", [], {"type": "domains", "domains": [".amazon.com"]}),
        ("None", None, {"type": "domains", "domains": [".amazon.com"]}),
        ("unknown type", cookies, {"type": "names"}),
    ]:
        yield c("is_cookie_deleted", label, result, rule)
    history = [["https://www.youtube.com/watch?v=1", "t", 1], ["https://example.org", "e", 2]]
    for label, result, rule in [
        ("visit left", history, {"type": "keywords", "keywords": ["youtube"]}),
        ("deleted", history[1:], {"type": "keywords", "keywords": ["youtube"]}),
        ("None", None, {"type": "keywords", "keywords": ["youtube"]}),
        ("unknown type", history, {"type": "domains"}),
    ]:
        yield c("check_history_deleted", label, result, rule)
    for label, result, rule in [
        (
            "enabled",
            ["chrome-refresh-2023@1", "chrome-webui-refresh-2023@1"],
            {"type": "names", "names": ["chrome-refresh-2023", "chrome-webui-refresh-2023"]},
        ),
        (
            "order differs",
            ["chrome-webui-refresh-2023@1", "chrome-refresh-2023@1"],
            {"type": "names", "names": ["chrome-refresh-2023", "chrome-webui-refresh-2023"]},
        ),
        ("none", [], {"type": "names", "names": []}),
        ("None", None, {"type": "names", "names": []}),
        ("unknown type", [], {"type": "ids"}),
    ]:
        yield c("check_enabled_experiments", label, result, rule)
    for label, result, rule in [
        ("in range", {"default_font_size": 20}, {"type": "range", "min": 16, "max": 99999}),
        ("at the bound", {"default_font_size": 16}, {"type": "range", "min": 16, "max": 99999}),
        ("value", {"default_font_size": 16}, {"type": "value", "value": 16}),
        ("value differs", {"default_font_size": 12}, {"type": "value", "value": 16}),
        ("no size", {}, {"type": "value", "value": 16}),
        ("unknown type", {"default_font_size": 1}, {"type": "min"}),
    ]:
        yield c("check_font_size", label, result, rule)
    desktop = {"/home/user/Desktop/2048.desktop": "[Desktop Entry]\nName=Play Puzzle Game 2048\nExec=chrome --app=x\n"}
    for label, result, rule in [
        ("by name", desktop, {"type": "name", "name": "Play Puzzle Game 2048"}),
        ("name differs", desktop, {"type": "name", "name": "2048"}),
        ("by exec", desktop, {"type": "exec", "exec": "chrome --app=x"}),
        ("no shortcuts", {}, {"type": "name", "name": "x"}),
        ("getter failed (a list)", [], {"type": "name", "name": "x"}),
        ("url type", desktop, {"type": "url", "url": "x"}),
        ("name not a string", desktop, {"type": "name", "name": 2048}),
    ]:
        yield c("is_shortcut_on_desktop", label, result, rule)
    for label, result, rule in [
        (
            "in cart",
            {"content": "Your cart: The Dota 2 Official Soundtrack $9"},
            {"items": ["The Dota 2 Official Soundtrack"]},
        ),
        ("not in cart", {"content": "empty"}, {"items": ["The Dota 2 Official Soundtrack"]}),
        ("None", None, {"items": ["x"]}),
    ]:
        yield c("is_added_to_steam_cart", label, result, rule)

    h1 = write(d / "a.html", "<html><body><table><tr><td sdnum='1033;0;0'>1</td><td>x</td></tr></table></body></html>")
    h2 = write(d / "b.html", "<html><body><table><tr><td sdnum='1033;0;0'>1</td><td>x</td></tr></table></body></html>")
    h3 = write(d / "c.html", "<html><body><table><tr><td sdnum='2057;0;0'>1</td><td>x</td></tr></table></body></html>")
    h4 = write(d / "d.html", "<html><body><table><tr><td>2</td></tr></table></body></html>")
    h5 = write(d / "e.html", "<html><body><table><tr><td sdnum='1033;0;0'>1</td></tr></table></body></html>")
    for label, r, e, options in [
        ("same", h1, h2, {}),
        ("sdnum differs", h3, h1, {}),
        ("sdnum ignored", h3, h1, {"ignore_sdnum": True}),
        ("text differs", h4, h1, {}),
        ("prefix only", h5, h1, {}),
        ("empty", write(d / "empty.html", ""), h1, {}),
        ("None", None, h1, {}),
        ("not UTF-8", write(d / "latin.html", b"<p>caf\xe9</p>"), h1, {}),
    ]:
        yield c("compare_htmls", label, r, e, **options)

    for label, r, e in [
        ("same text", pdf(d / "p1.pdf", ["Hello world\nSecond line"]), pdf(d / "p2.pdf", ["Hello world\nSecond line"])),
        ("different text", pdf(d / "p3.pdf", ["Hello world"]), pdf(d / "p4.pdf", ["Goodbye"])),
        ("None", None, pdf(d / "p5.pdf", ["x"])),
    ]:
        yield c("compare_pdfs", label, r, e)
    img_pdf = pdf(d / "i1.pdf", ["receipt"], jpeg=jpeg_bytes(1))
    for label, r, e in [
        ("same images", img_pdf, pdf(d / "i2.pdf", ["receipt"], jpeg=jpeg_bytes(1))),
        ("None", None, img_pdf),
        ("missing file", d / "none.pdf", img_pdf),
    ]:
        yield c("compare_pdf_images", label, r, e)

    texts = {"a.txt": "alpha\n", "b.txt": "beta\n"}
    pred, gold = tar_file(d / "pred.tar.gz", texts), tar_file(d / "gold.tar.gz", texts)
    for label, r, e, options in [
        ("same texts", pred, gold, {}),
        ("one text differs", zip_file(d / "p2.zip", {**texts, "b.txt": "BETA\n"}), zip_file(d / "g2.zip", texts), {}),
        (
            "ignore case passed on",
            zip_file(d / "p3.zip", {**texts, "b.txt": "BETA\n"}),
            zip_file(d / "g3.zip", texts),
            {"ignore_case": True},
        ),
        ("names differ", zip_file(d / "p4.zip", {"a.txt": "alpha\n"}), zip_file(d / "g4.zip", texts), {}),
        (
            "inner folder",
            zip_file(d / "p5.zip", {"slides/a.txt": "x"}),
            zip_file(d / "g5.zip", {"slides/a.txt": "x"}),
            {"file_path": "slides"},
        ),
        (
            "missing inner folder",
            zip_file(d / "p6.zip", {"a.txt": "x"}),
            zip_file(d / "g6.zip", {"a.txt": "x"}),
            {"file_path": "slides"},
        ),
        ("empty archives", zip_file(d / "p7.zip", {}), zip_file(d / "g7.zip", {}), {}),
        (
            "images",
            zip_file(d / "p8.zip", {"i.png": image(d / "i8.png").read_bytes()}),
            zip_file(d / "g8.zip", {"i.png": image(d / "j8.png", seed=2).read_bytes()}),
            {"file_type": "image"},
        ),
        (
            "pdfs",
            zip_file(d / "p9.zip", {"r.pdf": pdf(d / "r9.pdf", ["x"]).read_bytes()}),
            zip_file(d / "g9.zip", {"r.pdf": pdf(d / "s9.pdf", ["x"]).read_bytes()}),
            {"file_type": "pdf"},
        ),
        ("unknown file type", pred, gold, {"file_type": "epub"}),
        ("None", None, gold, {}),
        ("not an archive", write(d / "x.rar", "no"), gold, {}),
    ]:
        yield c("compare_archive", label, r, e, **options)


def others_cases(d: Path) -> Iterator[Case]:
    def c(metric: str, label: str, result: Any, expected: Any = NO_EXPECTED, **options: Any) -> Case:
        return Case(metric, "others", label, result, expected, options)

    opf = '<package>\n<dc:identifier id="u">urn:uuid:1</dc:identifier>\n<dc:title>Pass Through</dc:title>\n</package>\n'
    ncx = "<ncx>\n<navPoint id='n1'>\n<text>Chapter 1</text>\n</ncx>\n"
    ch1 = "<html><body><h1>Chapter 1</h1>\r\n<p>It was a dark night.</p></body></html>"
    book = {"mimetype": "application/epub+zip", "content.opf": opf, "toc.ncx": ncx, "ch1.html": ch1}
    gold = zip_file(d / "gold.epub", book)
    for label, r in [
        ("same book", zip_file(d / "same.epub", {**book, "content.opf": opf.replace("uuid:1", "uuid:2")})),
        ("chapter edited", zip_file(d / "edit.epub", {**book, "ch1.html": ch1.replace("dark", "stormy")})),
        ("chapter missing", zip_file(d / "less.epub", {k: v for k, v in book.items() if k != "ch1.html"})),
        ("chapter in a subfolder", zip_file(d / "sub.epub", {**book, "OEBPS/ch2.html": ch1})),
        ("no toc", zip_file(d / "notoc.epub", {k: v for k, v in book.items() if k != "toc.ncx"})),
        ("not a zip", write(d / "bad.epub", "text")),
        ("None", None),
        ("empty chapter", zip_file(d / "emptych.epub", {**book, "ch1.html": ""})),
    ]:
        yield c("compare_epub", label, r, gold)
    yield c("compare_epub", "gold not a zip", gold, write(d / "bad2.epub", "text"))

    mp3 = _mp3(d / "song.mp3", {"title": "Missing You", "artist": "Cheng Xiang"})
    for label, r, rules in [
        (
            "tags match",
            mp3,
            {"title": {"method": "eq", "ref": "Missing You"}, "artist": {"method": "eq", "ref": "Cheng Xiang"}},
        ),
        ("title differs", mp3, {"title": {"method": "eq", "ref": "Missing Me"}}),
        ("missing tag is empty", mp3, {"album": {"method": "eq", "ref": ""}}),
        ("regex", mp3, {"artist": {"method": "re", "ref": "^Cheng"}}),
        ("no tags", _mp3(d / "bare.mp3", {}), {"title": {"method": "eq", "ref": ""}}),
        ("not an mp3", write(d / "x.mp3", "text"), {"title": {"method": "eq", "ref": ""}}),
        ("unknown tag name", mp3, {"nosuchtag": {"method": "eq", "ref": ""}}),
        ("None", None, {}),
    ]:
        yield c("check_mp3_meta", label, r, rules)


def _mp3(path: Path, tags: dict[str, str]) -> Path:
    import numpy as np
    import soundfile as sf
    from mutagen.easyid3 import EasyID3

    rate = 22050
    tone = 0.3 * np.sin(2 * np.pi * 440 * np.arange(rate // 4) / rate)
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, tone, rate, format="MP3")
    if tags:
        audio = EasyID3()
        for k, v in tags.items():
            audio[k] = v
        audio.save(path)
    return path


def basic_os_cases(d: Path) -> Iterator[Case]:
    def c(metric: str, label: str, result: Any, expected: Any = NO_EXPECTED, **options: Any) -> Case:
        return Case(metric, "basic_os", label, result, expected, options)

    want = {"expected": ["google-chrome.desktop", "thunderbird.desktop"]}
    for label, out in [
        ("same apps", "['thunderbird.desktop', 'google-chrome.desktop']\n"),
        ("extra app", "['thunderbird.desktop', 'google-chrome.desktop', 'vim.desktop']\n"),
        ("duplicate", "['thunderbird.desktop', 'thunderbird.desktop']\n"),
        ("empty (gsettings' @as [])", "@as []\n"),
        ("None", None),
    ]:
        yield c("check_gnome_favorite_apps", label, out, want)
    status = "      Local time: Thu 2024-01-25 12:56:06 {tz}\n  Universal time: x\n        RTC time: x\n"
    status += "       Time zone: {zone}\n"
    for label, out in [
        ("UTC", status.format(tz="UTC", zone="Etc/UTC (UTC, +0000)")),
        ("not UTC", status.format(tz="CET", zone="Europe/Paris (CET, +0100)")),
        ("+0000 elsewhere", status.format(tz="WET", zone="Atlantic/Faroe (WET, +0000)")),
        ("short output", "Local time: x\n"),
        ("None", None),
    ]:
        yield c("is_utc_0", label, out)
    for label, out in [
        ("enlarged", "1.25\n"),
        ("default", "1.0\n"),
        ("smaller", "0.8"),
        ("not a number", "big"),
        ("None", None),
    ]:
        yield c("check_text_enlarged", label, out)
    names = ["emnlp2023.jpg", "hk_group_photo.jpg"]
    for label, tree in [
        ("same files", {"name": "cpjpg", "children": [{"name": n} for n in reversed(names)]}),
        ("extra file", {"children": [{"name": n} for n in [*names, "x.jpg"]]}),
        ("empty folder", {"children": []}),
        ("None", None),
    ]:
        yield c("check_moved_jpgs", label, tree, {"expected": names})
    for label, rule, clip in [
        (
            "string in clipboard",
            {"expected": "/home/user/Data3/List3/secret.docx"},
            "/home/user/Data3/List3/secret.docx",
        ),
        ("list all in", {"expected": ["a", "b"]}, "a b"),
        ("list one missing", {"expected": ["None"]}, ""),
        ("clipboard None", {"expected": "x"}, None),
    ]:
        yield c("is_in_vm_clickboard", label, rule, clip)


def gimp_cases(d: Path) -> Iterator[Case]:
    def c(metric: str, label: str, result: Any, expected: Any = NO_EXPECTED, **options: Any) -> Case:
        return Case(metric, "gimp", label, result, expected, options)

    from PIL import Image, ImageEnhance

    orig = image(d / "orig.png", (80, 60))
    other = image(d / "other.png", (80, 60), seed=5)
    small = image(d / "small.png", (5, 5))
    big = image(d / "big.png", (160, 120))
    corrupt = write(d / "corrupt.png", b"\x89PNG\r\n\x1a\nnot really")
    text = write(d / "text.png", "hello")
    src = Image.open(io.BytesIO(orig.read_bytes()))
    darker = d / "darker.png"
    ImageEnhance.Brightness(src).enhance(0.6).save(darker)
    brighter = d / "brighter.png"
    ImageEnhance.Brightness(src).enhance(1.3).save(brighter)
    colourful = d / "colourful.png"
    ImageEnhance.Color(src).enhance(1.8).save(colourful)
    contrast = d / "contrast.png"
    ImageEnhance.Contrast(src).enhance(1.6).save(contrast)
    palette = d / "palette.png"
    src.convert("P", palette=Image.Palette.ADAPTIVE, colors=64).save(palette)
    mirrored = d / "mirror.png"
    src.transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(mirrored)
    rgba = d / "rgba.png"
    canvas = Image.new("RGBA", (100, 100), (0, 0, 0, 0))
    canvas.paste(src.convert("RGBA").resize((50, 40)), (10, 20))
    canvas.save(rgba)
    jpg = image(d / "photo.jpg", (80, 60), quality=80)

    pairs = [
        ("same", orig, orig),
        ("other picture", other, orig),
        ("darker", darker, orig),
        ("brighter", brighter, orig),
        ("more colourful", colourful, orig),
        ("more contrast", contrast, orig),
        ("palette", palette, orig),
        ("mirrored", mirrored, orig),
        ("resized", big, orig),
        ("tiny", small, small),
        ("transparent", rgba, orig),
        ("jpeg", jpg, orig),
        ("corrupt", corrupt, orig),
        ("not an image", text, orig),
        ("None", None, orig),
        ("missing file", d / "none.png", orig),
    ]
    for metric in [
        "check_structure_sim",
        "check_structure_sim_resized",
        "check_brightness_decrease_and_structure_sim",
        "check_saturation_increase_and_structure_sim",
        "check_contrast_increase_and_structure_sim",
        "check_palette_and_structure_sim",
        "check_file_exists_and_structure_sim",
        "check_image_mirror",
        "check_sharper",
    ]:
        for label, r, e in pairs:
            yield c(metric, label, r, e)
    yield c("check_brightness_decrease_and_structure_sim", "threshold option", darker, orig, threshold=0.0001)
    # Gentle edits of pictures that survive them (few flat colours; a blurred gradient), so the checks pass.
    blocks, smooth = _blocks(d / "blocks.png"), _smooth(d / "smooth.png")
    blocks_palette = d / "blocks-palette.png"
    Image.open(io.BytesIO(blocks.read_bytes())).convert("P", palette=Image.Palette.ADAPTIVE, colors=16).save(
        blocks_palette
    )
    yield c("check_palette_and_structure_sim", "flat colours as a palette", blocks_palette, blocks)
    yield c("check_palette_and_structure_sim", "flat colours, not a palette", blocks, blocks)
    saturated = d / "smooth-saturated.png"
    ImageEnhance.Color(Image.open(io.BytesIO(smooth.read_bytes()))).enhance(1.3).save(saturated)
    yield c("check_saturation_increase_and_structure_sim", "gently more saturated", saturated, smooth)
    yield c("check_saturation_increase_and_structure_sim", "less saturated", smooth, saturated)
    yield c("check_structure_sim", "gold None", orig, None)
    yield c("check_sharper", "sharpened", _sharpened(orig, d / "sharp.png"), orig)

    for label, r, e in [
        ("same", [orig], [orig]),
        ("single values", orig, orig),
        ("one differs", [orig, other], [orig, orig]),
        ("resized copy", [big], [orig]),
        ("palette vs rgb", [palette], [orig]),
        ("empty lists", [], []),
        ("missing one", [None], [orig]),
        ("corrupt", [corrupt], [orig]),
    ]:
        yield c("compare_image_list", label, r, e)

    for label, r, rule in [
        ("height", big, {"height": 120}),
        ("width and height", orig, {"height": 60, "width": 80}),
        ("wrong width", orig, {"width": 60}),
        ("no rule", orig, {}),
        ("opaque part", rgba, {"height": 40, "width": 50, "ignore_transparent": True}),
        ("transparent, not ignored", rgba, {"height": 100}),
        ("palette with transparency", _transparent_palette(d / "tp.png"), {"height": 10}),
        ("None", None, {"height": 1}),
        ("corrupt", corrupt, {"height": 1}),
    ]:
        yield c("check_image_size", label, r, rule)
    for label, r, rule in [
        ("small enough", jpg, {"max_size": 600000}),
        ("too big", jpg, {"max_size": 10}),
        ("None", None, {"max_size": 1}),
        ("missing", d / "none.jpg", {"max_size": 1}),
    ]:
        yield c("check_image_file_size", label, r, rule)

    white = _object_on(d / "white.png", (255, 255, 255), (40, 40))
    black_bg = _object_on(d / "black.png", (0, 0, 0), (40, 40))
    for label, r, e in [
        ("green background", _object_on(d / "green.png", (20, 200, 30), (40, 40)), white),
        ("still white", white, white),
        (
            "not square",
            _object_on(d / "gw.png", (20, 200, 30), (40, 30)),
            _object_on(d / "ww.png", (255, 255, 255), (40, 30)),
        ),
        ("original all black", white, black_bg),
        ("grey original", _object_on(d / "g2.png", (20, 200, 30), (40, 40)), _grey(white, d / "grey.png")),
        ("result smaller", _object_on(d / "gs.png", (20, 200, 30), (20, 20)), white),
        ("rgba result", _object_on(d / "ga.png", (20, 200, 30), (40, 40), mode="RGBA"), white),
        ("None", None, white),
    ]:
        yield c("check_green_background", label, r, e)

    for label, r in [
        ("centred", _triangle(d / "tri-centre.png", (50, 50))),
        ("off centre", _triangle(d / "tri-side.png", (15, 20))),
        ("one colour", _flat(d / "flat.png")),
        ("grey image", _grey(_triangle(d / "tri2.png", (50, 50)), d / "tri-grey.png")),
        ("None", None),
    ]:
        yield c("check_triangle_position", label, r)
    for label, r in [
        ("text on the left", _text_at(d / "left.png", 2)),
        ("text in the middle", _text_at(d / "mid.png", 40)),
        ("no dark pixel", _flat(d / "flat2.png")),
        ("None", None),
    ]:
        yield c("check_textbox_on_leftside", label, r)

    gimprc = write(
        d / "gimprc", '# GIMP gimprc\n\n(theme "Light")\n(undo-levels 100)\n(default-image\n    (width 1920))\n'
    )
    history = write(d / "action-history", '(history-item "filters-vignette" 1)\n(history-item "edit-undo" 3)\n')
    for label, r, rule in [
        ("theme", gimprc, {"type:": "key-value", "key": "theme", "value": '"Light"'}),
        ("undo levels wrong", gimprc, {"key": "undo-levels", "value": "5"}),
        ("two-part key", history, {"key": ["history-item", '"filters-vignette"'], "value": "1"}),
        ("two-part key wrong value", history, {"key": ["history-item", '"edit-undo"'], "value": "1"}),
        ("key not set", gimprc, {"key": "layer-new-name", "value": '"Square"'}),
        ("blank line with spaces", write(d / "gimprc2", "   \n(theme x)\n"), {"key": "theme", "value": "x"}),
        ("None", None, {"key": "theme", "value": "x"}),
        ("no key in rule", gimprc, {"value": "x"}),
    ]:
        yield c("check_config_status", label, r, rule)


def _blocks(path: Path) -> Path:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (80, 60), (240, 240, 230))
    draw = ImageDraw.Draw(img)
    draw.rectangle((5, 5, 40, 30), fill=(200, 40, 40))
    draw.rectangle((45, 20, 75, 55), fill=(30, 60, 200))
    draw.ellipse((10, 35, 35, 58), fill=(40, 160, 60))
    img.save(path)
    return path


def _smooth(path: Path) -> Path:
    import numpy as np
    from PIL import Image, ImageFilter

    yy, xx = np.mgrid[0:96, 0:128]
    arr = np.stack([xx * 2, yy * 2, 128 + 60 * np.sin(xx / 9.0)], axis=2).clip(0, 255).astype("uint8")
    Image.fromarray(arr).filter(ImageFilter.GaussianBlur(2)).save(path)
    return path


def _sharpened(path: Path, out: Path) -> Path:
    from PIL import Image, ImageFilter

    Image.open(io.BytesIO(path.read_bytes())).filter(ImageFilter.SHARPEN).save(out)
    return out


def _transparent_palette(path: Path) -> Path:
    from PIL import Image

    img = Image.new("P", (10, 10), 0)
    img.putpixel((2, 2), 1)
    img.info["transparency"] = 0
    img.save(path, transparency=0)
    return path


def _object_on(path: Path, background: tuple[int, int, int], size: tuple[int, int], mode: str = "RGB") -> Path:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, background)
    ImageDraw.Draw(img).rectangle((5, 5, 15, 15), fill=(0, 0, 0))
    if mode != "RGB":
        img = img.convert(mode)
    img.save(path)
    return path


def _grey(path: Path, out: Path) -> Path:
    from PIL import Image

    Image.open(io.BytesIO(path.read_bytes())).convert("L").save(out)
    return out


def _triangle(path: Path, centre: tuple[int, int]) -> Path:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (100, 100), (255, 255, 255))
    x, y = centre
    ImageDraw.Draw(img).polygon([(x - 10, y + 8), (x + 10, y + 8), (x, y - 12)], fill=(250, 220, 0))
    img.save(path)
    return path


def _flat(path: Path) -> Path:
    from PIL import Image

    Image.new("RGB", (40, 30), (255, 255, 255)).save(path)
    return path


def _text_at(path: Path, x: int) -> Path:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (100, 40), (255, 255, 255))
    ImageDraw.Draw(img).rectangle((x, 10, x + 20, 20), fill=(0, 0, 0))
    img.save(path)
    return path


def vlc_cases(d: Path) -> Iterator[Case]:
    def c(metric: str, label: str, result: Any, expected: Any = NO_EXPECTED, **options: Any) -> Case:
        return Case(metric, "vlc", label, result, expected, options)

    def status(state: str, infos: dict[str, str], category: str = "meta") -> Path:
        body = "".join(f'<info name="{k}">{v}</info>' for k, v in infos.items())
        xml = f'<root><state>{state}</state><information><category name="{category}">{body}</category>'
        xml += "</information></root>"
        return write(d / f"status-{abs(hash((state, category, tuple(infos.items()))))}.xml", xml)

    video = "Rick Astley - Never Gonna Give You Up (Official Music Video).mp4"
    url = "https://www.youtube.com/watch?v=pgBsyTKAwLw"
    for label, r, rule in [
        ("file playing", status("playing", {"filename": video}), {"type": "file_name", "file_name": video}),
        ("path playing", status("playing", {"uri": f"/home/user/{video}"}), {"type": "file_name", "file_name": video}),
        ("other file", status("playing", {"filename": "x.mp4"}), {"type": "file_name", "file_name": video}),
        ("paused", status("paused", {"filename": video}), {"type": "file_name", "file_name": video}),
        ("no file info", status("playing", {}), {"type": "file_name", "file_name": video}),
        ("url playing", status("playing", {"url": url}), {"type": "url", "url": url}),
        (
            "url file name",
            status("playing", {"filename": "watch"}),
            {"type": "url", "url": "https://www.youtube.com/watch"},
        ),
        (
            "url same host",
            status("playing", {"title": "https://www.youtube.com/watch/x?v=1"}),
            {"type": "url", "url": "https://www.youtube.com/watch"},
        ),
        ("url in stream info", status("playing", {"Codec": url}, "Stream 0"), {"type": "url", "url": url}),
        ("url mismatch", status("playing", {"url": "https://x.org/a"}), {"type": "url", "url": url}),
        ("unknown type", status("playing", {"filename": video}), {"type": "title"}),
        ("no state", write(d / "nostate.xml", "<root/>"), {"type": "url", "url": url}),
        ("not XML", write(d / "bad.xml", "<root>"), {"type": "url", "url": url}),
        ("None", None, {"type": "url", "url": url}),
    ]:
        yield c("is_vlc_playing", label, r, rule)

    vlcrc = write(
        d / "vlcrc",
        "# VLC preferences\n\n[qt]\n#qt-bgcone=1\nqt-bgcone=0\n#qt-max-volume=125\nqt-max-volume=200\n"
        "#qt-minimal-view=0\n#qt-slider-colours=153;210;153;20;210;20;255;199;15;245;39;29\n"
        "[core]\n#one-instance-when-started-from-file=1\ninput-record-path=/home/user/Desktop\n"
        "#global-key-play-pause=\nglobal-key-play-pause=Ctrl+Space\n",
    )
    defaults = write(d / "vlcrc-defaults", "# nothing set\n[qt]\n")
    dark = write(d / "vlcrc-dark", "qt-slider-colours=10;20;30;40;50;60;0;0;0;99;99;99\n")
    bad = write(d / "vlcrc-bad", "qt-slider-colours=a;b;c\n")
    crlf = write(d / "vlcrc-crlf", "qt-bgcone=0\r\nqt-max-volume=200\r\n")
    for metric, key, values in [
        ("check_qt_bgcone", "expected_qt_bgcone", [0, 1, "0", True]),
        ("check_qt_max_volume", "expected_qt_max_volume", [200, 125, "200"]),
        ("check_qt_minimal_view", "expected_qt_minimal_view", [1, 0]),
        ("check_one_instance_when_started_from_file", "expected_one_instance_when_started_from_file", [0, 1]),
        ("check_global_key_play_pause", "expected_global_key_play_pause", [1, 0, "1"]),
    ]:
        for f in (vlcrc, defaults, crlf):
            for v in values:
                yield c(metric, f"{f.name} {v!r}", f, {key: v})
        yield c(metric, "None", None, {key: 1})
        yield c(metric, "no rule key", vlcrc, {})
    for label, r, rule in [
        ("blackish", dark, {"type": "blackish"}),
        ("default colours not blackish", defaults, {"type": "blackish"}),
        ("match", dark, {"type": "match", "expected_qt_slider_colours": "10;20;30;40;50;60;0;0;0;99;99;99"}),
        (
            "match default",
            vlcrc,
            {"type": "match", "expected_qt_slider_colours": "153;210;153;20;210;20;255;199;15;245;39;29"},
        ),
        ("not numbers", bad, {"type": "blackish"}),
        ("unknown type", dark, {"type": "white"}),
        ("no type", dark, {}),
        ("None", None, {"type": "blackish"}),
    ]:
        yield c("check_qt_slider_colours", label, r, rule)
    for label, r, rule in [
        ("desktop", vlcrc, {"recording_file_path": "/home/user/Desktop"}),
        ("other folder", vlcrc, {"recording_file_path": "/tmp"}),
        ("not set", defaults, {"recording_file_path": "/home/user/Desktop"}),
        ("None", None, {"recording_file_path": "/tmp"}),
        ("not UTF-8", write(d / "latin", b"\xe9"), {"recording_file_path": "/tmp"}),
    ]:
        yield c("is_vlc_recordings_folder", label, r, rule)
    for label, screen, window in [
        ("fullscreen", {"width": 1920, "height": 1080}, {"width": 1920, "height": 1080}),
        ("windowed", {"width": 1920, "height": 1080}, {"width": 800, "height": 600}),
        ("no window", {"width": 1920, "height": 1080}, None),
        ("no screen", None, {"width": 1, "height": 1}),
    ]:
        yield c("is_vlc_fullscreen", label, screen, window)

    a, b = image(d / "img-a.png", (80, 60)), image(d / "img-b.png", (80, 60), seed=3)
    big = image(d / "img-big.png", (160, 120))
    tall = image(d / "img-tall.png", (60, 90))
    for label, r, e, options in [
        ("same", a, a, {}),
        ("different", b, a, {}),
        ("resized", big, a, {}),
        ("other shape", tall, a, {}),
        ("base result", big, b, {"reference_base_result": 0.3}),
        ("below base", b, a, {"reference_base_result": 0.99}),
        ("tiny", image(d / "img-tiny.png", (5, 5)), a, {}),
        ("gif", image(d / "clip.gif", (80, 60)), a, {}),
        ("corrupt", write(d / "bad.png", b"\x89PNGxx"), a, {}),
        ("None", None, a, {}),
    ]:
        yield c("compare_images", label, r, e, **options)

    v1 = _video(d / "v1.avi", 12, seed=0)
    v2 = _video(d / "v2.avi", 12, seed=0)
    v3 = _video(d / "v3.avi", 12, seed=7)
    v4 = _video(d / "v4.avi", 8, seed=0)
    for label, r, e, options in [
        ("same video", v1, v2, {}),
        ("different frames", v3, v1, {}),
        ("shorter", v4, v1, {}),
        ("few frames checked", v4, v1, {"max_frames_to_check": 5}),
        ("lenient threshold", v3, v1, {"threshold": 64}),
        ("both unreadable", write(d / "x.mp4", "no"), write(d / "y.mp4", "no"), {}),
        ("result unreadable", write(d / "z.mp4", "no"), v1, {}),
        ("None", None, v1, {}),
    ]:
        yield c("compare_videos", label, r, e, **options)

    w1 = _wav(d / "tone.wav", 440)
    w2 = _wav(d / "tone2.wav", 440)
    w3 = _wav(d / "other.wav", 1200, chirp=True)
    for label, r, e in [
        ("same recording", w1, w2),
        ("other sound", w3, w1),
        ("mp3 vs wav", _mp3(d / "tone.mp3", {}), w1),
        ("both undecodable", write(d / "a.wav", "no"), write(d / "b.wav", "no")),
        ("one undecodable", write(d / "c.wav", "no"), w1),
        ("None", None, w1),
    ]:
        yield c("compare_audios", label, r, e)


def _video(path: Path, frames: int, seed: int) -> Path:
    import cv2
    import numpy as np

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 48))
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
    for i in range(frames):
        frame = np.roll(base, i * 2, axis=1)
        writer.write(frame)
    writer.release()
    return path


def _wav(path: Path, freq: float, chirp: bool = False) -> Path:
    import numpy as np
    import soundfile as sf

    rate = 16000
    t = np.arange(rate // 2) / rate
    phase = 2 * np.pi * (freq * t + (2000 * t**2 if chirp else 0))
    sf.write(path, 0.4 * np.sin(phase), rate)
    return path


def thunderbird_cases(d: Path) -> Iterator[Case]:
    def c(metric: str, label: str, result: Any, expected: Any = NO_EXPECTED, **options: Any) -> Case:
        return Case(metric, "thunderbird", label, result, expected, options)

    prefs = write(
        d / "prefs.js",
        '// Mozilla User Preferences\n\nuser_pref("mail.identity.id1.auto_quote", false);\n'
        'user_pref("mail.identity.id1.htmlSigText", "Anonym\\nXYZ Lab");\n'
        'user_pref("extensions.activeThemeID", "thunderbird-compact-dark@mozilla.org");\n'
        'user_pref("mail.server.default.applyIncomingFilters", true);\n'
        'user_pref("mail.imap.use_status_for_biff", false);\n'
        'user_pref("mail.server.default.autosync_offline_stores", true);\n',
    )
    bad_value = write(d / "prefs-bad.js", 'user_pref("a", true);\nuser_pref("b", undefinedValue);\n')
    for label, r, rules in [
        ("eq false", prefs, {"expect": {"mail.identity.id1.auto_quote": {"method": "eq", "ref": False}}}),
        (
            "re.S across lines",
            prefs,
            {"expect": {"mail.identity.id1.htmlSigText": {"method": "re.S", "ref": "Anonym.+XYZ Lab"}}},
        ),
        (
            "re without S",
            prefs,
            {"expect": {"mail.identity.id1.htmlSigText": {"method": "re", "ref": "Anonym.+XYZ Lab"}}},
        ),
        ("theme", prefs, {"expect": {"extensions.activeThemeID": {"method": "re", "ref": "dark"}}}),
        (
            "expect and unexpect",
            prefs,
            {
                "expect": {"mail.server.default.applyIncomingFilters": {"method": "eq", "ref": True}},
                "unexpect": {"mail.server.default.autosync_offline_stores": {"method": "eq", "ref": False}},
            },
        ),
        (
            "unexpect matches",
            prefs,
            {"unexpect": {"mail.server.default.autosync_offline_stores": {"method": "eq", "ref": True}}},
        ),
        ("key never set", prefs, {"expect": {"mail.nope": {"method": "eq", "ref": True}}}),
        ("a value not JSON", bad_value, {"expect": {"a": {"method": "eq", "ref": True}}}),
        ("empty rules", prefs, {}),
        ("None", None, {}),
    ]:
        yield c("check_thunderbird_prefs", label, r, rules)

    filters = write(
        d / "msgFilterRules.dat",
        'version="9"\nlogging="no"\nname="Promotions"\nenabled="yes"\ntype="17"\naction="Move to folder"\n'
        'actionValue="mailbox://nobody@Local%20Folders/Promotions"\ncondition="AND (subject,contains,discount)"\n'
        'name="Forward all"\nenabled="yes"\ntype="17"\naction="Forward"\nactionValue="anonym-x2024@gmail.com"\n'
        'condition="ALL"\n',
    )
    early = write(d / "early.dat", 'enabled="yes"\nname="x"\ncondition="ALL"\n')
    for label, r, rules in [
        (
            "move filter",
            filters,
            {
                "expect": [
                    {
                        "enabled": "yes",
                        "action": "Move to folder",
                        "actionValue": "mailbox://nobody@Local%20Folders/Promotions",
                        "condition": ["AND (subject,contains,discount)"],
                    }
                ]
            },
        ),
        (
            "forward filter",
            filters,
            {
                "expect": [
                    {
                        "enabled": "yes",
                        "action": "Forward",
                        "actionValue": "anonym-x2024@gmail.com",
                        "condition": ["ALL"],
                    }
                ]
            },
        ),
        ("wrong action value", filters, {"expect": [{"action": "Forward", "actionValue": "x@y.z"}]}),
        ("unexpect present", filters, {"unexpect": [{"name": "Promotions"}]}),
        ("field before a name", early, {"expect": []}),
        ("empty file", write(d / "empty.dat", ""), {"expect": [{"name": "x"}]}),
        ("None", None, {}),
    ]:
        yield c("check_thunderbird_filter", label, r, rules)

    msg = "From: a@b.c\nX-Mozilla-Status: 0001\nX-Mozilla-Keys: \nMIME-Version: 1.0\nSubject: {s}\n\nbody\n"
    f1 = write(d / "have_seen", "FROM - Mon\n" + msg.format(s="one"))
    f2 = write(d / "have_seen_gold", "FROM - Tue\n" + msg.format(s="two"))
    f3 = write(d / "no_sep", msg.format(s="one"))
    f4 = write(d / "double", "FROM - FROM - x\n" + msg.format(s="one"))
    for label, r, e, options in [
        ("different messages, both separated", f1, f2, {}),
        ("one without separator", f3, f2, {}),
        ("double separator", f4, f2, {}),
        ("duplicates kept", f4, f2, {"remove_duplicate": False}),
        ("lists", [f1, f3], [f2, f3], {"remove_deleted": True, "remove_duplicate": True}),
        ("lists, one missing", [f1, None], [f2, f3], {}),
        ("ignore options", f1, f2, {"ignore_status": True, "ignore_keys": True}),
        ("None", None, f2, {}),
        ("empty files", write(d / "e1", ""), write(d / "e2", ""), {}),
    ]:
        yield c("check_thunderbird_folder", label, r, e, **options)


def table_cases(d: Path) -> Iterator[Case]:
    import openpyxl

    cities = [
        "Scottsdale",
        "Atlanta",
        "Lake Tahoe",
        "Banff",
        "Beijing",
        ["Montreal", "Montréal"],
        "San Diego",
        "Lille",
        ["Montreal", "Montréal"],
        "San Juan",
        ["New York", "New York City", "NYC"],
        "Barcelona",
        "Toulon",
        "Sydney",
        "Long Beach",
        "Vancouver",
        "Stockholm",
        ["Montreal", "Montréal"],
        "New Orleans",
        "Long Beach",
        "Vancouver",
    ]

    d.mkdir(parents=True, exist_ok=True)

    def book(name: str, column: list[Any]) -> Path:
        wb = openpyxl.Workbook()
        ws = wb.active
        assert ws is not None
        ws.append(["Conference", "Year", "City"])
        for i, city in enumerate(column):
            ws.append([f"C{i}", 2000 + i, city])
        wb.save(d / name)
        return d / name

    spelled = [c if isinstance(c, str) else c[-1] for c in cities]
    for label, column, rules in [
        ("in order", [f"{c}, Somewhere" for c in spelled], {"expected": cities}),
        ("one swapped", [spelled[1], spelled[0], *spelled[2:]], {"expected": cities}),
        ("a blank cell", [*spelled[:20], None], {"expected": cities}),
        ("a number cell", [*spelled[:20], 7], {"expected": cities}),
        ("expected too short", spelled, {"expected": cities[:5]}),
        ("expected not a list item", spelled, {"expected": [1] * 21}),
    ]:
        yield Case(
            "compare_conference_city_in_order", "table", label, book(f"cc-{len(label)}-{label[:5]}.xlsx", column), rules
        )
    yield Case(
        "compare_conference_city_in_order", "table", "not a workbook", write(d / "x.xlsx", "no"), {"expected": cities}
    )


BUILDERS: dict[str, Callable[[Path], Iterator[Case]]] = {
    "general": general_cases,
    "vscode": vscode_cases,
    "chrome": chrome_cases,
    "others": others_cases,
    "basic_os": basic_os_cases,
    "gimp": gimp_cases,
    "vlc": vlc_cases,
    "thunderbird": thunderbird_cases,
    "table": table_cases,
}
# The office families are checked by tests/test_osworld_differential_office.py; the metrics of theirs named here
# have cases in this file too (both sets must hold).
BOTH = {"compare_pdfs", "compare_pdf_images", "check_csv", "check_config_status", "compare_conference_city_in_order"}
OFFICE = {
    name
    for family in (
        metrics.tables,
        metrics.sheets_csv,
        metrics.documents,
        metrics.slides,
        metrics.office_config,
        metrics.pdfs,
    )
    for name in family.METRICS
} - BOTH


# ---------------------------------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def reference() -> Iterator[Reference]:
    ref = Reference()
    yield ref
    ref.close()


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Case]]:
    d = tmp_path_factory.mktemp("osworld-diff")
    by_metric: dict[str, list[Case]] = {}
    for module, build in BUILDERS.items():
        for case in build(d / module):
            by_metric.setdefault(case.metric, []).append(case)
    return by_metric


def covered_metrics() -> list[str]:
    return sorted(set(METRICS) - OFFICE - VERIFIED)  # OSWorld-Verified's: test_osworld_differential_verified.py


@pytest.mark.parametrize("metric", covered_metrics())
def test_osfleet_scores_as_osworld(metric: str, reference: Reference, cases: dict[str, list[Case]]) -> None:
    assert metric in cases, f"no differential cases for {metric}"
    outcomes = [score_both(reference, case) for case in cases[metric]]
    unequal = [o for o in outcomes if o.theirs is not None and not o.equal]
    assert not unequal, "\n".join(
        f"{o.case.label}: osfleet {o.ours} ({o.reason}) vs OSWorld {o.theirs} {o.theirs_note}" for o in unequal
    )
    not_run = [o for o in outcomes if o.theirs is None]
    if not_run:
        assert metric in REFERENCE_CANNOT_RUN, f"{metric}: the reference used a stand-in: {not_run[0].theirs_note}"
    assert len(outcomes) - len(not_run) > 0 or metric in REFERENCE_CANNOT_RUN


def table(outcomes: dict[str, list[Outcome]]) -> str:
    lines = ["metric | cases | equal | reference not run", "--- | --- | --- | ---"]
    for metric in sorted(outcomes):
        rows = outcomes[metric]
        ran = [o for o in rows if o.theirs is not None]
        lines.append(f"{metric} | {len(rows)} | {sum(o.equal for o in ran)} | {len(rows) - len(ran)}")
    total = [o for rows in outcomes.values() for o in rows]
    ran = [o for o in total if o.theirs is not None]
    lines.append(f"**{len(outcomes)} metrics** | {len(total)} | {sum(o.equal for o in ran)} | {len(total) - len(ran)}")
    return "\n".join(lines)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        ref = Reference()
        try:
            results: dict[str, list[Outcome]] = {}
            for module, build in BUILDERS.items():
                for case in build(Path(tmp) / module):
                    results.setdefault(case.metric, []).append(score_both(ref, case))
        finally:
            ref.close()
    print(table(results))
    for metric, reason in REFERENCE_CANNOT_RUN.items():
        print(f"reference not run for {metric}: {reason}")
