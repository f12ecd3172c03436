"""An observation: the replica's screen, captured through the episode's lease and encoded in the request's
worker thread (never on the event loop)."""

from __future__ import annotations

import base64

from osfleet.api.models import Observation
from osfleet.api.state import LeasedHost
from osfleet.screen import DEFAULT_QUALITY, ImageFormat
from osfleet.timing import stage


def observe(leased: LeasedHost, rid: str, fmt: ImageFormat = "png", quality: int | None = None) -> Observation:
    data = leased.screenshot(rid, fmt, quality)
    with stage("encode"):
        text = base64.b64encode(data).decode()
    w, h = leased.host.image.screen
    used = None if fmt == "png" else (quality or DEFAULT_QUALITY)
    return Observation(screenshot=text, format=fmt, quality=used, width=w, height=h)
