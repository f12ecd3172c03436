"""Files in and out of a leased replica's desktop, as its desktop user (``osfleet.replicas.guest_files``).

As every operation on one replica, a request finds its episode first (404 for another client's replica, 409 for a
lease that does not hold it) and goes through the episode's ``LeasedHost``, which checks the lease again under the
replica's lock; only then is the path looked at (403). An upload is the agent acting on its desktop, as a step
is: it waits for a step under way and is refused while a person drives the replica from the dashboard. A download
is like an observation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Query
from fastapi.responses import Response

from osfleet.api.auth import Caller
from osfleet.api.contract import OctetStream, RawBody, Routes
from osfleet.api.models import FileQuery, FileWritten
from osfleet.api.operations import DOWNLOAD_FILE, UPLOAD_FILE
from osfleet.api.state import AgentState


def mount(routes: Routes, state: Callable[[], AgentState]) -> None:
    @routes(UPLOAD_FILE)
    def upload_file(rid: str, query: Annotated[FileQuery, Query()], data: RawBody, who: Caller) -> FileWritten:
        s = state()
        live = s.episode(rid, query.lease_id, who)
        with live.lock:
            s.check_not_taken_over(rid, query.lease_id)
            live.on(s.host, who).upload_file(rid, query.path, data)
        return FileWritten(path=query.path, bytes=len(data))

    @routes(DOWNLOAD_FILE)
    def download_file(rid: str, query: Annotated[FileQuery, Query()], who: Caller) -> Response:
        s = state()
        live = s.episode(rid, query.lease_id, who)
        return OctetStream(live.on(s.host, who).download_file(rid, query.path))
