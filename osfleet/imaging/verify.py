"""Boot a throwaway replica of a golden image and prove it works: guest agent answers, desktop drawn."""

from __future__ import annotations

import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from osfleet.config import NAME_PREFIX, Settings
from osfleet.replicas.spec import replica_spec
from osfleet.vm import qcow2
from osfleet.vm.accel import detect_accelerator
from osfleet.vm.domain_xml import Accel
from osfleet.vm.images import GoldenImage
from osfleet.vm.readiness import wait_until_ready
from osfleet.vm.virt import Virt

BOOT_TIMEOUT_SECONDS = 180.0


@dataclass(frozen=True)
class BootResult:
    accel: Accel
    agent_seconds: float
    desktop_seconds: float
    overlay_allocated_bytes: int
    screenshot: Path | None


def verify_image(
    image: GoldenImage,
    screenshot: Path,
    settings: Settings | None = None,
    timeout: float = BOOT_TIMEOUT_SECONDS,
    progress: bool = True,
) -> BootResult:
    """Boot ``image`` on a new overlay, wait for agent + drawn desktop, save the screen, remove everything."""
    settings = settings or Settings.from_env()
    workdir = settings.scratch_dir / f"{NAME_PREFIX}verify-{uuid.uuid4().hex[:8]}"
    workdir.mkdir(parents=True)
    workdir.chmod(0o755)
    try:
        overlay = workdir / "disk.qcow2"
        qcow2.create_overlay(overlay, image.disk)
        return boot_overlay(image, overlay, settings, timeout, progress, screenshot)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def boot_overlay(
    image: GoldenImage,
    overlay: Path,
    settings: Settings,
    timeout: float = BOOT_TIMEOUT_SECONDS,
    progress: bool = True,
    screenshot: Path | None = None,
) -> BootResult:
    """Boot a transient domain on ``overlay`` until it is ready, then destroy it (the overlay stays)."""
    accel = detect_accelerator(image.kernel, settings)
    name = f"{NAME_PREFIX}boot-{uuid.uuid4().hex[:8]}"
    spec = replica_spec(
        image, name, overlay, (image.disk,), accel, image.shape, metadata={"role": "verify", "image": image.name}
    )
    if progress:
        print(f"booting {name} from {image.name} under {'KVM' if accel == 'kvm' else 'TCG'} ...", flush=True)
    with Virt(settings.libvirt_uri) as virt:
        try:
            start = time.monotonic()
            virt.start_transient(spec)
            agent_at, desktop_at, last = wait_until_ready(virt, image, name, start, timeout, progress)
        finally:
            virt.destroy(name)
    if screenshot is not None:
        last.save(screenshot)
    return BootResult(accel, agent_at, desktop_at, qcow2.allocated_bytes(overlay), screenshot)
