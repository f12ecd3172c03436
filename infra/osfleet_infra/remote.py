"""How a dynamic provider reaches a host: plain connection inputs (they are stored in the stack state and
pickled with the provider) turned into the project's ``Host`` wrapper over a Fabric connection."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from fabric import Connection

from osfleet.imaging.host import Host

CONNECT_TIMEOUT = 15


def conn_inputs(addr: Any, user: str, port: int, key_file: str) -> dict[str, Any]:
    """The connection inputs every host-acting resource takes (changing any of them replaces the resource)."""
    return {"addr": addr, "user": user, "port": port, "key_file": key_file}


CONN_KEYS = ("addr", "user", "port", "key_file")


@contextmanager
def host_of(props: Mapping[str, Any]) -> Iterator[Host]:
    """A ``Host`` on the resource's target, closed when done."""
    c = Connection(
        str(props["addr"]),
        user=str(props["user"]),
        port=int(props["port"]),
        connect_timeout=CONNECT_TIMEOUT,
        connect_kwargs={"key_filename": str(props["key_file"]), "look_for_keys": False, "allow_agent": False},
    )
    try:
        yield Host(c, echo=False)
    finally:
        c.close()
