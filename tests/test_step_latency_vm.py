"""Observations on a real replica: QEMU's screendump on tmpfs shows what libvirt's stream shows, in every format,
and a click + observation reports its stages."""

from __future__ import annotations

import io
import os

import pytest
from PIL import Image

from osfleet.config import Settings
from osfleet.measure.timing import collecting
from osfleet.protocol.actions import Click
from osfleet.replicas.manager import ReplicaHost
from osfleet.vm.images import GoldenImage

pytestmark = pytest.mark.vm


def test_observations_come_from_screendump_and_match_libvirts_screen(
    golden: GoldenImage, settings: Settings, no_leftovers: None
) -> None:
    with ReplicaHost(golden, settings, warm=0, auto_recover=False, spares=False) as host:
        try:
            rid = host.create("snapshot").replica
            domain = host.get(rid).domain
            fast, slow = host.capture.grab(domain), host.virt.screenshot(domain)
            assert host.capture.method == "screendump"
            assert fast.size == golden.screen and fast.tobytes() == slow.tobytes()
            for fmt, name in (("png", "PNG"), ("jpeg", "JPEG"), ("webp", "WEBP")):
                shot = Image.open(io.BytesIO(host.screenshot(rid, fmt, 60)))  # type: ignore[arg-type]
                assert shot.format == name and shot.size == golden.screen
            with collecting() as stages:
                host.act(rid, [Click(type="click", x=200, y=200)])
                host.screenshot(rid, "jpeg")
            assert list(stages.seconds) == ["act", "capture", "encode"]
            assert settings.memory_dir is not None  # this test's screendumps were read and removed
            assert not any((settings.memory_dir / "screens").glob(f"*.{os.getpid()}-*.ppm"))
        finally:
            host.down()
