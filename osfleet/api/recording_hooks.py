"""The API's hooks into the recorder (osfleet.recording): an episode begins at a reset, and an infrastructure
failure ends it as the infrastructure's doing. Recording never fails a request."""

from __future__ import annotations

import base64

from osfleet.api import errors
from osfleet.api.models import Observation
from osfleet.api.state import AgentState, LeasedHost, LiveEpisode
from osfleet.errors import OsfleetError


def image(leased: LeasedHost, rid: str, seen: Observation | None) -> bytes | None:
    """The screen after a step, as image bytes: the observation already taken, else a new screenshot."""
    if seen is not None and seen.screenshot is not None:
        return base64.b64decode(seen.screenshot)
    try:
        return leased.screenshot(rid, "png")
    except OsfleetError:  # the step is applied and answered; only its recorded image is missing
        return None


def begin(s: AgentState, leased: LeasedHost, live: LiveEpisode, seen: Observation | None) -> None:
    """A recorded episode starts on the replica (after a reset, or for a fork's child). Only while the lease
    still holds: a late reset of an ended lease must not end the next holder's recorded episode."""
    if s.recorder is None:
        return
    rid = live.data.replica_id
    try:
        rec = s.host.check_lease(rid, live.data.lease_id)
    except OsfleetError:
        return
    holder = rec.lease.holder if rec.lease is not None else ""
    s.recorder.begin(rid, live.data.lease_id, holder, live.data.task, image(leased, rid, seen), owner=live.data.owner)


def failure(s: AgentState, rid: str, lease_id: str, exc: Exception) -> None:
    """An infrastructure failure in a step ends the recorded episode as the infrastructure's doing."""
    if s.recorder is not None and errors.classify(exc)[1] == "infrastructure":
        s.recorder.end(rid, lease_id, "replica_failed", str(exc))
