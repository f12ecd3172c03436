"""Who is on the other end of a loopback TCP connection, from the kernel's socket tables.

A server osfleet runs on a machine's loopback for programs that send no credentials of their own (OSWorld's
controllers, a forwarded port's client) still needs to know who connects: another user of the machine, or a
browser's page, reaches the same ``127.0.0.1``. The kernel knows: ``/proc/net/tcp`` (and ``tcp6``) lists every TCP
socket of this network namespace with its owner's uid and its inode (as ``identd`` and PostgreSQL's ``peer``
authentication read it), and ``/proc/self/fd`` names the sockets this process holds. So a server can let in its
own user's processes (``loopback_peer_uid``), or only its own process (``from_this_process``: the client end of
the connection is one of this process's sockets), without any secret. Standard library only: a client-only
install uses it.
"""

from __future__ import annotations

import ipaddress
import os
import struct
from dataclasses import dataclass
from pathlib import Path

PROC_TCP = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
OWN_FDS = Path("/proc/self/fd")


@dataclass(frozen=True)
class Peer:
    """The client end of a loopback connection: its owner's uid and its socket's inode."""

    uid: int
    inode: int


def loopback_peer(client: tuple[str, int], server: tuple[str, int]) -> Peer | None:
    """The client end of a loopback TCP connection to ``server``, or None (not loopback, not found: a process in
    another network namespace, a connection already gone)."""
    try:
        if not ipaddress.ip_address(client[0]).is_loopback:
            return None
        local, remote = proc_address(*client), proc_address(*server)
    except (ValueError, OSError):
        return None
    for table in PROC_TCP:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[1] == local and fields[2] == remote:
                return Peer(uid=int(fields[7]), inode=int(fields[9]))
    return None


def loopback_peer_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The owner of the client's end of a loopback TCP connection to ``server``, or None."""
    peer = loopback_peer(client, server)
    return peer.uid if peer is not None else None


def from_this_process(client: tuple[str, int], server: tuple[str, int]) -> bool:
    """Whether the client's end of this loopback connection is a socket this very process holds."""
    peer = loopback_peer(client, server)
    if peer is None or peer.inode == 0:
        return False
    wanted = f"socket:[{peer.inode}]"
    try:
        names = os.listdir(OWN_FDS)
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(OWN_FDS / name) == wanted:
                return True
        except OSError:  # closed meanwhile
            continue
    return False


def proc_address(host: str, port: int) -> str:
    """``host:port`` as ``/proc/net/tcp{,6}`` prints it: each 32-bit word of the address in host byte order, in
    hex, then the port in hex."""
    ip = ipaddress.ip_address(host)
    raw = ip.packed  # network order, as the kernel keeps it; /proc prints it word by word in host order
    words = struct.unpack(f"={len(raw) // 4}I", raw)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"
