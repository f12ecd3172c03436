"""An observation: the replica's screen, captured through the episode's lease and encoded in the request's
worker thread (never on the event loop); with OSWorld's accessibility tree, the terminal's text and the pointer
when asked (``include``).

The tree and the terminal come from the desktop itself (AT-SPI, through osfleet's guest query script run as
the desktop user), so they cost a guest command each (seconds under emulation, more for a big LibreOffice
sheet); what cannot be read is named in ``unavailable`` instead of failing the observation: the screen is
still the agent's to see.
"""

from __future__ import annotations

import base64
from collections.abc import Collection

from osfleet.api.models import Observation, ObservationPart
from osfleet.api.state import LeasedHost
from osfleet.errors import GuestTimeoutError
from osfleet.measure.timing import stage
from osfleet.protocol.models import DEFAULT_QUALITY, ImageFormat
from osfleet.tasks.osworld_format import guest_query

DESKTOP_QUERY_SECONDS = 120.0  # one accessibility tree (a full LibreOffice window takes tens of seconds under TCG)


def observe(
    leased: LeasedHost,
    rid: str,
    fmt: ImageFormat = "png",
    quality: int | None = None,
    include: Collection[ObservationPart] = (),
) -> Observation:
    # The emulated display has no hardware cursor plane, so X draws the pointer into the framebuffer: every
    # screenshot shows it, as OSWorld's /screenshot does, and ``include=cursor`` is met by the screen itself.
    data = leased.screenshot(rid, fmt, quality)
    with stage("encode"):
        text = base64.b64encode(data).decode()
    w, h = leased.host.image.screen
    used = None if fmt == "png" else (quality or DEFAULT_QUALITY)
    seen = Observation(screenshot=text, format=fmt, quality=used, width=w, height=h)
    unavailable: dict[str, str] = {}
    for part, op in (("accessibility_tree", "accessibility_tree"), ("terminal", "terminal_output")):
        if part not in include:
            continue
        try:
            with stage("desktop"):
                value = guest_query.ask(leased, rid, op, {}, DESKTOP_QUERY_SECONDS)
        except (guest_query.GuestQueryError, GuestTimeoutError) as exc:
            unavailable[part] = str(exc)
            continue
        setattr(seen, part, value if isinstance(value, str) else None)
    seen.unavailable = unavailable or None
    return seen
