"""The in-process overlay writer against real qemu-img and qemu-io."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from osfleet.errors import CommandFailedError
from osfleet.vm import qcow2

pytestmark = pytest.mark.system


def make_base(path: Path, size: str = "256M", pattern: int = 0xAB) -> Path:
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), size], check=True)
    subprocess.run(["qemu-io", "-c", f"write -P {pattern} 0 1M", str(path)], check=True, capture_output=True)
    return path


def qemu_io(path: Path, *cmds: str) -> str:
    args = ["qemu-io"]
    for c in cmds:
        args += ["-c", c]
    proc = subprocess.run(args + [str(path)], capture_output=True, text=True, check=True)
    assert "Pattern verification failed" not in proc.stdout + proc.stderr, proc.stdout
    return proc.stdout


def test_overlay_is_a_valid_qcow2_with_the_golden_as_backing(tmp_path: Path) -> None:
    base = make_base(tmp_path / "base.qcow2")
    ov = tmp_path / "ov.qcow2"
    qcow2.create_overlay(ov, base)
    qcow2.check(ov)
    chain = qcow2.info(ov, backing_chain=True)
    assert [layer["filename"] for layer in chain] == [str(ov), str(base)]
    assert chain[0]["backing-filename-format"] == "qcow2"
    assert chain[0]["virtual-size"] == chain[1]["virtual-size"] == 256 * 2**20
    assert qcow2.allocated_bytes(ov) < 64 * 1024  # metadata only


def test_overlay_reads_through_and_writes_stay_in_the_overlay(tmp_path: Path) -> None:
    base = make_base(tmp_path / "base.qcow2")
    ov = tmp_path / "ov.qcow2"
    qcow2.create_overlay(ov, base)
    qemu_io(ov, "read -P 0xab 0 1M")
    qemu_io(ov, "write -P 0xcd 0 64k")
    qemu_io(ov, "read -P 0xcd 0 64k", "read -P 0xab 64k 64k")
    qemu_io(base, "read -P 0xab 0 1M")  # the golden image is untouched
    qcow2.check(ov)


def test_overlay_of_a_huge_image_needs_several_l1_clusters(tmp_path: Path) -> None:
    base = tmp_path / "big.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "16T"], check=True)
    ov = tmp_path / "ov.qcow2"
    qcow2.create_overlay(ov, base)
    qcow2.check(ov)
    qemu_io(ov, "write -P 0x11 15T 64k", "read -P 0x11 15T 64k")
    qcow2.check(ov)


def test_overlay_never_overwrites_and_rejects_non_qcow2(tmp_path: Path) -> None:
    base = make_base(tmp_path / "base.qcow2")
    ov = tmp_path / "ov.qcow2"
    ov.write_text("precious")
    with pytest.raises(FileExistsError):
        qcow2.create_overlay(ov, base)
    assert ov.read_text() == "precious"
    raw = tmp_path / "raw.img"
    raw.write_bytes(b"\0" * 4096)
    with pytest.raises(CommandFailedError, match="not a qcow2"):
        qcow2.create_overlay(tmp_path / "x.qcow2", raw)
