"""Accelerator detection with a real probe boot of the golden image's kernel."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from osfleet.config import Settings
from osfleet.vm import accel
from osfleet.vm.images import GoldenImage


@pytest.mark.vm
@pytest.mark.slow
def test_probe_decides_and_the_answer_is_remembered(golden: GoldenImage, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    works, seconds, reason = accel.probe_kvm(golden.kernel, timeout=20)
    chosen = accel.detect_accelerator(golden.kernel, settings)
    assert chosen == ("kvm" if works else "qemu")
    cache = json.loads(settings.accel_cache.read_text())
    (entry,) = cache.values()
    assert entry["accel"] == chosen and entry["reason"]
    # The remembered answer is used without probing again, even with a kernel that cannot boot.
    assert accel.detect_accelerator(tmp_path / "no-such-kernel", settings) == chosen
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        assert chosen == "qemu"


@pytest.mark.system
def test_a_kernel_that_does_not_boot_under_kvm_means_tcg(tmp_path: Path) -> None:
    junk = tmp_path / "junk-kernel"
    junk.write_bytes(b"\0" * 4096)
    works, _seconds, reason = accel.probe_kvm(junk, timeout=5)
    assert not works and reason
