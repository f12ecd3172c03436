"""When is a replica ready: its guest agent answers and its desktop is drawn."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from PIL import Image

from osfleet import screen
from osfleet.errors import GuestTimeoutError
from osfleet.images import GoldenImage
from osfleet.virt import GuestAgentUnavailableError, Virt, VirtError

POLL_SECONDS = 0.5


def wait_until_ready(
    virt: Virt, image: GoldenImage, name: str, start: float, timeout: float, progress: bool = False
) -> tuple[float, float, Image.Image]:
    """Poll until the agent answers and the desktop is drawn; (agent seconds, desktop seconds, screen)."""
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
