"""osfleet's own checks of its non-office OSWorld metrics, on real files made here: the metrics whose OSWorld
reference cannot run on this machine (PDFs: PyMuPDF is not served), and what osfleet adds to OSWorld's
semantics (bounds on hostile files, a read-only database, the test suite in a child process)."""

from __future__ import annotations

import io
import sqlite3
import tarfile
import zipfile
from pathlib import Path

import pytest

from osfleet.tasks.model import UnsupportedTaskError
from osfleet.tasks.osworld_format.metrics import METRICS, Score, images, require, run_metric
from tests.test_osworld_differential_general import image, jpeg_bytes, pdf, write, zip_file


def in_process(func: str, result: object, expected: object, options: dict[str, object]) -> Score:
    """The metric in this process, where a test's monkeypatched limit applies (``run_metric`` runs it in the
    evaluation sandbox, another process)."""
    require(func)
    return METRICS[func](result, expected, options)


@pytest.mark.system
def test_compare_pdfs_scores_text_similarity(tmp_path: Path) -> None:
    a = pdf(tmp_path / "a.pdf", ["Quarterly report\nRevenue grew by 12 percent", "Second page"])
    b = pdf(tmp_path / "b.pdf", ["Quarterly report\nRevenue grew by 12 percent", "Second page"])
    c = pdf(tmp_path / "c.pdf", ["Quarterly report\nRevenue fell by 3 percent", "Second page"])
    d = pdf(tmp_path / "d.pdf", ["Something else entirely"])
    assert run_metric("compare_pdfs", a, b, {})[0] == 1.0
    near = run_metric("compare_pdfs", c, a, {})[0]
    far = run_metric("compare_pdfs", d, a, {})[0]
    assert 0.8 < near < 1.0 and far < 0.5 and far < near
    # lists of files: the mean over the pairs; an unreadable pair adds 0
    junk = write(tmp_path / "junk.pdf", "not a pdf")
    assert run_metric("compare_pdfs", [a, junk], [b, b], {})[0] == pytest.approx(0.5)
    assert run_metric("compare_pdfs", None, b, {})[0] == 0.0
    assert run_metric("compare_pdfs", [], [], {})[0] == 0.0  # OSWorld divides by zero: no score


@pytest.mark.system
def test_compare_pdf_images_by_perceptual_hash(tmp_path: Path) -> None:
    one = pdf(tmp_path / "one.pdf", ["receipt"], jpeg=jpeg_bytes(1))
    same = pdf(tmp_path / "same.pdf", ["another text"], jpeg=jpeg_bytes(1))
    other = pdf(tmp_path / "other.pdf", ["receipt"], jpeg=jpeg_bytes(2, size=(64, 48)))
    none = pdf(tmp_path / "none.pdf", ["no images"])
    assert run_metric("compare_pdf_images", one, same, {}) == (1.0, "1 of 1 images the same")
    assert run_metric("compare_pdf_images", other, one, {})[0] == 0.0
    assert run_metric("compare_pdf_images", none, one, {})[0] == 0.0  # counts differ
    assert run_metric("compare_pdf_images", none, none, {})[0] == 1.0  # neither has images
    assert run_metric("compare_pdf_images", tmp_path / "missing.pdf", one, {})[0] == 0.0


@pytest.mark.system
def test_compare_archive_of_pdfs(tmp_path: Path) -> None:
    slides = {"lecture_slides/a.pdf": pdf(tmp_path / "a.pdf", ["Week 1"]).read_bytes()}
    slides["lecture_slides/b.pdf"] = pdf(tmp_path / "b.pdf", ["Week 2"]).read_bytes()
    pred, gold = zip_file(tmp_path / "pred.zip", slides), zip_file(tmp_path / "gold.zip", slides)
    options = {"file_path": "lecture_slides", "file_type": "pdf"}
    assert run_metric("compare_archive", pred, gold, options)[0] == 1.0
    worse = zip_file(
        tmp_path / "worse.zip", {**slides, "lecture_slides/b.pdf": pdf(tmp_path / "c.pdf", ["Nothing"]).read_bytes()}
    )
    assert 0.5 <= run_metric("compare_archive", worse, gold, options)[0] < 1.0
    tgz = tmp_path / "pdf.tar.gz"
    with tarfile.open(tgz, "w:gz") as t:
        for name, data in slides.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    assert run_metric("compare_archive", tgz, gold, options)[0] == 1.0


@pytest.mark.system
def test_archives_that_leave_their_folder_or_are_too_big_score_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from osfleet.tasks.osworld_format.metrics import archives

    gold = zip_file(tmp_path / "gold.zip", {"a.txt": "x"})
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("../../escaped.txt", "x")
    score, reason = run_metric("compare_archive", evil, gold, {})
    assert score == 0.0 and "would leave its folder" in reason and not (tmp_path.parent / "escaped.txt").exists()
    link = tmp_path / "link.tar"
    with tarfile.open(link, "w") as t:
        info = tarfile.TarInfo("a.txt")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(info)
    score, reason = run_metric("compare_archive", link, gold, {})
    assert score == 0.0 and "link" in reason
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(3):
            z.writestr(f"{i}.txt", b"\0" * (4 * 2**20))  # 12 MiB unpacked from a few KiB
    monkeypatch.setattr(archives, "MAX_UNPACKED_BYTES", 8 * 2**20)
    score, reason = in_process("compare_archive", bomb, gold, {})
    assert score == 0.0 and "MiB" in reason


@pytest.mark.system
def test_an_image_too_large_is_refused_before_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = image(tmp_path / "a.png", (80, 60))
    monkeypatch.setattr(images, "MAX_PIXELS", 80 * 60 - 1)
    score, reason = in_process("compare_images", a, a, {})
    assert score == 0.0 and "larger than" in reason


@pytest.mark.system
def test_the_database_is_read_only_and_the_query_may_only_read(tmp_path: Path) -> None:
    db = tmp_path / "global-messages-db.sqlite"
    con = sqlite3.connect(db)
    con.execute("create table t(x)")
    con.execute("insert into t values (1)")
    con.commit()
    con.close()
    assert run_metric("run_sqlite3", db, {"sql": "select count(*) from t"}, {})[0] == 1.0
    for sql in ("delete from t", f"attach database '{tmp_path / 'x.db'}' as x", "pragma journal_mode=delete"):
        score, reason = run_metric("run_sqlite3", db, {"sql": sql}, {})
        assert score == 0.0 and "not authorized" in reason, (sql, reason)
    assert not (tmp_path / "x.db").exists()
    con = sqlite3.connect(db)
    assert con.execute("select count(*) from t").fetchone() == (1,)
    con.close()


@pytest.mark.system
def test_favourite_apps_are_read_as_a_literal_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch() or ['a.desktop']"
    assert run_metric("check_gnome_favorite_apps", code, {"expected": ["a.desktop"]}, {})[0] == 0.0
    assert not marker.exists()


@pytest.mark.system
def test_a_test_suite_runs_in_a_child_process_with_a_time_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from osfleet.tasks.osworld_format.metrics import programs

    suite = write(tmp_path / "1-test_suite.py", "import os\ndef test():\n    return os.getpid()\n")
    score, _ = run_metric("check_python_file_by_test_suite", [], suite, {})
    assert score == 1.0  # a pid (a number above 1) is clamped to 1, and it is not this process's
    spin = write(tmp_path / "2-test_suite.py", "def test():\n    while True:\n        pass\n")
    monkeypatch.setattr(programs, "TEST_SECONDS", 2)
    score, reason = in_process("check_python_file_by_test_suite", [], spin, {})
    assert score == 0.0 and "longer than 2 s" in reason


@pytest.mark.system
def test_a_metric_needing_a_missing_package_is_refused_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "librosa" else real(name, *a))
    with pytest.raises(UnsupportedTaskError, match=r"needs librosa .*osfleet\[osworld\]"):
        require("compare_audios")
    require("compare_images")


@pytest.mark.system
def test_unknown_options_score_zero_as_osworld_raises() -> None:
    score, reason = run_metric("exact_match", "x", {"expected": "x"}, {"ignore_case": True})
    assert score == 0.0 and "takes no option ignore_case" in reason
