"""Real replicas of the golden image under libvirt (TCG here): boot, desktop, guest agent, cleanup."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from PIL import Image

from osfleet.config import NAME_PREFIX, Settings
from osfleet.vm import qcow2, screen
from osfleet.vm.accel import detect_accelerator
from osfleet.vm.domain_xml import DiskSpec, DomainSpec
from osfleet.vm.images import GoldenImage
from osfleet.vm.readiness import wait_until_ready
from osfleet.vm.virt import Virt
from tests.conftest import VENV_BIN, Sshd

pytestmark = pytest.mark.vm
BOOT_LIMIT_SECONDS = 60.0  # the target is 40 s on this 2-core TCG machine; CI load gets some slack


def test_verify_task_over_ssh_boots_to_a_drawn_desktop(
    sshd: Sshd, golden: GoldenImage, tmp_path: Path, no_leftovers: None
) -> None:
    shot = tmp_path / "verify.png"
    proc = sshd.fab(
        "verify", "--image", golden.name, "--screenshot", str(shot), "--osfleet", str(VENV_BIN / "osfleet"), timeout=400
    )
    assert proc.returncode == 0, proc.stderr
    assert "desktop drawn after" in proc.stdout
    image = Image.open(shot)
    assert image.size == golden.screen
    assert not screen.is_blank(image)
    assert screen.desktop_drawn(image, golden.background, golden.screen)
    desktop_seconds = float(proc.stdout.split("desktop drawn after ")[1].split(" s")[0])
    assert desktop_seconds <= BOOT_LIMIT_SECONDS


def test_guest_runs_the_recipe_desktop_as_user_with_no_network(golden: GoldenImage, settings: Settings) -> None:
    name = f"{NAME_PREFIX}test-{uuid.uuid4().hex[:8]}"
    workdir = settings.scratch_dir / name
    workdir.mkdir(parents=True)
    workdir.chmod(0o755)
    overlay = workdir / "disk.qcow2"
    qcow2.create_overlay(overlay, golden.disk)
    spec = DomainSpec(
        name=name,
        kernel=golden.kernel,
        initrd=golden.initrd,
        cmdline=golden.cmdline,
        disks=(DiskSpec(overlay, backing=(golden.disk,)),),
        accel=detect_accelerator(golden.kernel, settings),
    )
    with Virt(settings.libvirt_uri) as virt:
        try:
            virt.start_transient(spec)
            wait_until_ready(virt, golden, name, time.monotonic(), 180, progress=False)
            code, out, _ = virt.guest_exec(
                name, ["/bin/sh", "-c", "ps -o user= -C xterm; ps -o user= -C Xorg; hostname"]
            )
            assert code == 0
            assert out.split() == ["user", "root", "osfleet"]
            code, out, _ = virt.guest_exec(name, ["/bin/sh", "-c", "ls /sys/class/net"])
            assert out.split() == ["lo"]  # no network device at all
            code, out, _ = virt.guest_exec(name, ["/bin/sh", "-c", "DISPLAY=:0 xdpyinfo | grep dimensions"])
            assert "1280x800 pixels" in out
            # the guest writes to its overlay, never to the golden image
            code, _, _ = virt.guest_exec(name, ["/bin/sh", "-c", "head -c 4M /dev/urandom > /home/user/blob && sync"])
            assert code == 0
        finally:
            virt.destroy(name)
            grown = qcow2.allocated_bytes(overlay)
            shutil.rmtree(workdir, ignore_errors=True)
    assert grown > 4 * 2**20
    assert (
        golden.manifest["disk_sha256"]
        == subprocess.run(["sha256sum", str(golden.disk)], capture_output=True, text=True, check=True).stdout.split()[0]
    )
