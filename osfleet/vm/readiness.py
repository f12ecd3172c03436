"""When is a replica ready: its guest agent answers, its desktop is drawn and, on an image whose session
pre-starts applications (the OSWorld desktop's ``prestart``), those applications answer: the session writes
``APPS_READY_FILE`` once each is up, so a running state saved after this has them up in every replica."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from PIL import Image

from osfleet.errors import GuestTimeoutError, OsfleetError
from osfleet.vm import screen
from osfleet.vm.images import GoldenImage
from osfleet.vm.virt import GuestAgentUnavailableError, Virt, VirtError

POLL_SECONDS = 0.5
APPS_POLL_SECONDS = 3.0
APPS_READY_FILE = "/run/user/1000/osfleet-apps-ready"
# Pre-starting Chrome, LibreOffice (with each module loaded once) and code-server under TCG takes minutes.
APPS_TIMEOUT_SECONDS = 900.0


def prestarted_apps(image: GoldenImage) -> list[str]:
    """The applications the image's session starts before it counts as ready (none for most images)."""
    return [str(a) for a in image.manifest.get("recipe", {}).get("prestart") or []]


# Session programs whose absence explains a desktop that never drew (a boot stopped at a bare background).
SESSION_PROGRAMS = ("Xorg", "xterm", "twm", "openbox", "xsession")


def wait_until_ready(
    virt: Virt,
    image: GoldenImage,
    name: str,
    start: float,
    timeout: float,
    progress: bool = False,
    after_agent: float | None = None,
) -> tuple[float, float, Image.Image]:
    """Poll until the agent answers and the desktop is drawn; (agent seconds, desktop seconds, screen).

    ``after_agent``: give up when the desktop is not drawn this long after the agent answered (a session
    that stopped at a bare background does not draw later; the caller makes a new generation instead of
    waiting out ``timeout``); the error then names the session programs that are running.

    On an image with pre-started applications the wait goes on until they answer (``timeout`` is raised to
    ``APPS_TIMEOUT_SECONDS`` for it); the desktop seconds then count to that point."""
    apps = prestarted_apps(image)
    if apps:
        timeout = max(timeout, APPS_TIMEOUT_SECONDS)
    apps_at: float | None = None if apps else 0.0
    next_apps_poll = 0.0
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
        if apps_at is None and agent_at is not None and desktop_at is not None and elapsed >= next_apps_poll:
            next_apps_poll = elapsed + APPS_POLL_SECONDS
            if _apps_ready(virt, name):
                apps_at = time.monotonic() - start
                if progress:
                    print(f"  pre-started applications ({', '.join(apps)}) up after {apps_at:.1f} s", flush=True)
        if agent_at is not None and desktop_at is not None and apps_at is not None and last is not None:
            return agent_at, max(desktop_at, apps_at), last
        if after_agent is not None and agent_at is not None and desktop_at is None and elapsed - agent_at > after_agent:
            break
        if progress and elapsed >= next_note:
            print(f"  ... waiting ({elapsed:.0f} s)", flush=True)
            next_note += 15.0
        time.sleep(POLL_SECONDS)
    hint = ""
    if last is not None:
        failure_shot = Path(tempfile.gettempdir()) / f"{name}-timeout.png"
        last.save(failure_shot)
        hint = f"; last screen saved to {failure_shot}"
    if agent_at is None:
        raise GuestTimeoutError(f"{name}: guest agent not ready within {timeout:.0f} s{hint}")
    if desktop_at is None:
        waited = time.monotonic() - start
        raise GuestTimeoutError(f"{name}: desktop not drawn {waited:.0f} s after boot{_session(virt, name)}{hint}")
    hint += f" (the guest's /run/user/1000/osfleet-apps.log says: {_apps_log(virt, name)})"
    raise GuestTimeoutError(f"{name}: pre-started {', '.join(apps)} not ready within {timeout:.0f} s{hint}")


def _apps_ready(virt: Virt, name: str) -> bool:
    try:
        code, _, _ = virt.guest_exec(name, ["/bin/test", "-e", APPS_READY_FILE], timeout=10)
    except OsfleetError:  # the agent is busy or a command timed out: ask again at the next poll
        return False
    return code == 0


def _apps_log(virt: Virt, name: str) -> str:
    try:
        _, out, _ = virt.guest_exec(name, ["/usr/bin/tail", "-n", "3", "/run/user/1000/osfleet-apps.log"], timeout=10)
    except OsfleetError as exc:
        return f"unreadable ({exc})"
    return " | ".join(out.strip().splitlines())[-300:] or "nothing"


def _session(virt: Virt, name: str) -> str:
    """Which session programs run in the guest (``; running: Xorg, twm; not: xterm``), best effort."""
    try:
        _, out, _ = virt.guest_exec(name, ["/bin/ps", "-eo", "comm"], timeout=20)
    except OsfleetError:
        return ""
    running = {line.strip() for line in out.splitlines()}
    have = [p for p in SESSION_PROGRAMS if p in running]
    missing = [p for p in SESSION_PROGRAMS if p not in running]
    return f"; running: {', '.join(have) or 'none'}; not running: {', '.join(missing) or 'none'}"
