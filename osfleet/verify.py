"""Boot a throwaway replica of a golden image and prove it works: guest agent answers, desktop drawn."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from osfleet import qcow2, screen
from osfleet.accel import detect_accelerator
from osfleet.config import NAME_PREFIX, Settings
from osfleet.domain_xml import Accel, DiskSpec, DomainSpec
from osfleet.errors import GuestTimeoutError
from osfleet.images import GoldenImage
from osfleet.virt import GuestAgentUnavailableError, Virt, VirtError

BOOT_TIMEOUT_SECONDS = 180.0
POLL_SECONDS = 0.5


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
    spec = DomainSpec(
        name=name,
        kernel=image.kernel,
        initrd=image.initrd,
        cmdline=image.cmdline,
        disks=(DiskSpec(overlay, backing=image.disk),),
        accel=accel,
        metadata={"role": "verify", "image": image.name},
    )
    if progress:
        print(f"booting {name} from {image.name} under {'KVM' if accel == 'kvm' else 'TCG'} ...", flush=True)
    with Virt(settings.libvirt_uri) as virt:
        try:
            start = time.monotonic()
            virt.start_transient(spec)
            agent_at, desktop_at, last = _wait_ready(virt, image, name, start, timeout, progress)
        finally:
            virt.destroy(name)
    if screenshot is not None:
        last.save(screenshot)
    return BootResult(accel, agent_at, desktop_at, qcow2.allocated_bytes(overlay), screenshot)


def _wait_ready(
    virt: Virt, image: GoldenImage, name: str, start: float, timeout: float, progress: bool
) -> tuple[float, float, Image.Image]:
    agent_at: float | None = None
    desktop_at: float | None = None
    last: Image.Image | None = None
    next_note = 15.0
    while time.monotonic() - start < timeout:
        elapsed = time.monotonic() - start
        if agent_at is None:
            try:
                virt.agent(name, "guest-ping", timeout=1)
                agent_at = time.monotonic() - start
                if progress:
                    print(f"  guest agent answered after {agent_at:.1f} s", flush=True)
            except GuestAgentUnavailableError:
                pass
            except VirtError:
                if not virt.is_running(name):
                    raise
        if desktop_at is None:
            last = virt.screenshot(name)
            if screen.desktop_drawn(last, image.background, image.screen):
                desktop_at = time.monotonic() - start
                if progress:
                    print(f"  desktop drawn after {desktop_at:.1f} s", flush=True)
        if agent_at is not None and desktop_at is not None and last is not None:
            return agent_at, desktop_at, last
        if progress and elapsed >= next_note:
            print(f"  ... waiting ({elapsed:.0f} s)", flush=True)
            next_note += 15.0
        time.sleep(POLL_SECONDS)
    hint = ""
    if last is not None:
        failure_shot = Path(tempfile.gettempdir()) / f"{name}-timeout.png"
        last.save(failure_shot)
        hint = f"; last screen saved to {failure_shot}"
    what = "guest agent" if agent_at is None else "desktop"
    raise GuestTimeoutError(f"{name}: {what} not ready within {timeout:.0f} s{hint}")
