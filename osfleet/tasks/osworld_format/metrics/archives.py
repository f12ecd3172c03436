"""Metrics on archives: a zip or tar of files against a gold one, zips member by member, EPUB books.

- ``compare_archive``: both archives (zip, tar, tar.gz/bz2/xz, by their names' extensions) hold the same
  names (in the folder ``file_path`` inside them, option); each pair of files is scored by the metric of
  option ``file_type`` (``text``: compare_text_file, ``pdf``: compare_pdfs, ``docx``, ``ppt``, ``image``:
  compare_images, ``csv``, ``table``, ``audio``, ``video``) with the remaining options, and the score is
  their mean. A file the inner metric cannot score makes the whole archive score 0, as in OSWorld.
- ``compare_zip_files``: the two zips hold the same names and the same bytes under each, but PDFs, whose
  texts (pypdf; OSWorld uses its predecessor PyPDF2) need only be 95 % alike (difflib).
- ``compare_epub``: the books' ``toc.ncx`` (navPoint lines left out), ``content.opf`` (identifier lines
  left out) and HTML chapters (reformatted by lxml) are paired in name order and scored by line
  similarity (``diff_text_file``); the score is their mean. As in OSWorld, only files at the top of the
  zip are read, and a chapter in a subfolder cannot be scored (OSWorld fails writing it out).

Archives from the guest are unpacked by osfleet itself, never by ``shutil.unpack_archive``: no member may
leave the folder (absolute names, ``..``, links), and they hold at most ``MAX_MEMBERS`` members and
``MAX_UNPACKED_BYTES`` in all.
"""

from __future__ import annotations

import difflib
import io
import tarfile
import tempfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

from osfleet.tasks.osworld_format.metrics.common import CannotScore, Metric, Score, file_path, scored, short
from osfleet.tasks.osworld_format.metrics.registry import (
    METRICS as ALL_METRICS,  # every family's, filled by the package
)

MAX_MEMBERS = 10_000
MAX_UNPACKED_BYTES = 1 * 2**30
FILE_TYPES = {
    "text": "compare_text_file",
    "pdf": "compare_pdfs",
    "docx": "compare_docx_files",
    "ppt": "compare_pptx_files",
    "image": "compare_images",
    "csv": "compare_csv",
    "table": "compare_table",
    "audio": "compare_audios",
    "video": "compare_videos",
}


def _safe_name(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        raise CannotScore(f"archive member {short(name)} would leave its folder")
    return path


def _check_totals(count: int, total: int) -> None:
    if count > MAX_MEMBERS or total > MAX_UNPACKED_BYTES:
        raise CannotScore(f"archive holds more than {MAX_MEMBERS} members or {MAX_UNPACKED_BYTES // 2**20} MiB")


def unpack(archive: Path, folder: Path) -> None:
    """Unpack a zip or tar (chosen by the name's extension, as ``shutil.unpack_archive`` chooses) safely."""
    name = archive.name.lower()
    if name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            infos = z.infolist()
            _check_totals(len(infos), sum(i.file_size for i in infos))
            for info in infos:
                target = folder / _safe_name(info.filename)
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, target.open("wb") as dst:
                    dst.write(src.read())  # at most file_size bytes: zipfile stops there (and checks the CRC)
        return
    if name.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")):
        with tarfile.open(archive) as t:
            members = t.getmembers()
            _check_totals(len(members), sum(m.size for m in members))
            for member in members:
                _safe_name(member.name)
                if not (member.isfile() or member.isdir()):
                    raise CannotScore(f"archive member {short(member.name)} is a link or a device")
            t.extractall(folder, filter="data")
        return
    raise CannotScore(f"unknown archive format of {short(archive.name)}")


def _inner_metric(file_type: str, options: dict[str, Any]) -> Metric:
    name = FILE_TYPES.get(file_type)
    if name is None:
        raise CannotScore(f"compare_archive has no file_type {short(file_type)}")
    if name not in ALL_METRICS:
        raise CannotScore(f"compare_archive's file_type {file_type} needs {name}, which osfleet does not have")
    metric = ALL_METRICS[name]
    accepts = getattr(metric, "osworld_options", None)
    if accepts is not None and set(options) - accepts:
        raise CannotScore(f"{name} takes no option {', '.join(sorted(set(options) - accepts))}")
    return getattr(metric, "__wrapped__", metric)  # raises as OSWorld's does: one failure fails the archive


@scored(any_options=True)
def compare_archive(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    options = dict(options)
    inner = options.pop("file_path", "")
    if not result:
        return 0.0, "no archive"
    with tempfile.TemporaryDirectory(prefix="osfleet-archive-") as tmp:
        got_root, want_root = Path(tmp) / "pred", Path(tmp) / "gold"
        got_root.mkdir()
        want_root.mkdir()
        unpack(file_path(result), got_root)
        unpack(file_path(expected), want_root)
        got_dir, want_dir = got_root / inner, want_root / inner
        got, want = sorted(p.name for p in got_dir.iterdir()), sorted(p.name for p in want_dir.iterdir())
        if got != want:
            return 0.0, f"the archive holds {short(got)}, expected {short(want)}"
        metric = _inner_metric(options.pop("file_type", "text"), options)
        total = sum(metric(got_dir / a, want_dir / b, options)[0] for a, b in zip(got, want, strict=True))
        score = total / len(got)
    return score, f"{len(got)} files, mean score {score:.3f}"


def _zip_member(z: zipfile.ZipFile, name: str) -> bytes:
    info = z.getinfo(name)
    if info.file_size > MAX_UNPACKED_BYTES:
        raise CannotScore(f"zip member {short(name)} is larger than {MAX_UNPACKED_BYTES // 2**20} MiB")
    with z.open(info) as f:
        return f.read(MAX_UNPACKED_BYTES + 1)


def _pdf_bytes_text(data: bytes) -> str:
    from pypdf import PdfReader

    return "".join(page.extract_text() for page in PdfReader(io.BytesIO(data)).pages)


@scored(any_options=True)
def compare_zip_files(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result:
        return 0.0, "no zip"
    with zipfile.ZipFile(file_path(result)) as a, zipfile.ZipFile(file_path(expected)) as b:
        names = set(a.namelist())
        if names != set(b.namelist()):
            return 0.0, f"the zip holds {short(sorted(names))}, expected {short(sorted(b.namelist()))}"
        _check_totals(len(names), sum(i.file_size for i in a.infolist()) + sum(i.file_size for i in b.infolist()))
        for name in names:
            got, want = _zip_member(a, name), _zip_member(b, name)
            if name.lower().endswith(".pdf"):
                ratio = difflib.SequenceMatcher(None, _pdf_bytes_text(got), _pdf_bytes_text(want)).ratio()
                if ratio < 0.95:
                    return 0.0, f"{short(name)}: texts {ratio:.2f} alike"
            elif got != want:
                return 0.0, f"{short(name)} differs"
    return 1.0, f"{len(names)} members the same"


def _epub_files(value: Any) -> list[tuple[str, list[str]]]:
    """OSWorld's ``process_epub``: (name, lines) of each file it writes out, in name order; none when the
    file is not a zip."""
    import lxml.html

    try:
        z = zipfile.ZipFile(file_path(value))
    except zipfile.BadZipFile:
        return []
    files = []
    with z:
        names = z.namelist()
        _check_totals(len(names), sum(i.file_size for i in z.infolist()))
        for name, drop in (("toc.ncx", "navPoint"), ("content.opf", "dc:identifier")):
            if name in names:
                lines = [line for line in _zip_member(z, name).decode().splitlines() if drop not in line]
                files.append((name, lines))
        for name in names:
            if name.endswith(".html"):
                if "/" in name:
                    raise CannotScore(f"chapter {short(name)} is in a subfolder (OSWorld cannot write it out)")
                text = "".join(ch for ch in _zip_member(z, name).decode() if ch not in "\r\n")
                html = lxml.html.fromstring(text.encode())
                files.append((name, lxml.html.tostring(html, pretty_print=True, encoding="unicode").splitlines()))
    return sorted(files, key=lambda f: f[0])


@scored()
def compare_epub(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None:
        return 0.0, "no book"
    got, want = _epub_files(result), _epub_files(expected)
    ratios = [difflib.SequenceMatcher(a=a[1], b=b[1]).ratio() for a, b in zip(got, want, strict=False)]
    score = sum(ratios) / len(got) if got else 0.0
    return score, f"{len(got)} files, similarity {score:.3f}"


METRICS: dict[str, Metric] = {
    "compare_archive": compare_archive,
    "compare_zip_files": compare_zip_files,
    "compare_epub": compare_epub,
}
NEEDS: dict[str, tuple[str, ...]] = {"compare_zip_files": ("pypdf",), "compare_epub": ("lxml",)}
