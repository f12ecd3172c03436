"""Ids that name their host, so a stateless gateway routes without a database.

A replica ``r-1234abcd`` on host ``kvm1`` is ``kvm1.r-1234abcd`` to the gateway's clients, and so is its
lease. OSGym vm ids are integers, so a number derived from the host's name (``host_key``) is folded into them:
every gateway in front of the same hosts (two pods of the k8s Deployment, one restarted with its hosts found in
another order) turns a vm id into the same host. They once folded in the host's position in each gateway's own
list: a vm id from one gateway stepped another replica through the second. Fleet vm ids stay below 2**53, so a
client that reads JSON numbers as doubles (JavaScript, jq) keeps them exact; two names that hash to one key are
told apart by asking each of their hosts (``HostPool.by_vm_key``).
"""

from __future__ import annotations

import hashlib
import re

from osfleet.api.errors import NotFound
from osfleet.replicas.episodes import OSGYM_VM_IDS

HOST_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
SEPARATOR = "."
VM_STRIDE = OSGYM_VM_IDS  # a host's own vm ids are below it
HOST_KEYS = 2**53 // VM_STRIDE  # fleet vm ids below 2**53: exact in any JSON reader


def join(host: str, local: str) -> str:
    return f"{host}{SEPARATOR}{local}"


def split(fleet_id: str, what: str = "replica") -> tuple[str, str]:
    """(host, the host's own id); 404 when the id does not name a host."""
    host, sep, local = fleet_id.partition(SEPARATOR)
    if not sep or not local or not HOST_NAME.match(host):
        raise NotFound(f"no {what} {fleet_id} (fleet ids look like <host>.<id>)")
    return host, local


def host_key(host: str) -> int:
    """The number a host's name gives its OSGym vm ids: the same in every gateway, whatever its host order."""
    return int.from_bytes(hashlib.sha256(host.encode()).digest()[:8], "big") % HOST_KEYS


def vm_to_fleet(host: str, vm_id: int) -> int:
    """The fleet's vm id of vm ``vm_id`` (below ``VM_STRIDE``) on the host named ``host``."""
    if not 0 <= vm_id < VM_STRIDE:  # a host agent keeps its ids below it (``AgentState.new_vm``)
        raise ValueError(f"host {host} gave vm id {vm_id}, outside 0..{VM_STRIDE - 1}")
    return host_key(host) * VM_STRIDE + vm_id


def vm_from_fleet(fleet_vm: int) -> tuple[int, int]:
    """(the host's key, the host's vm id)."""
    if not 0 <= fleet_vm < HOST_KEYS * VM_STRIDE:
        raise NotFound(f"vm {fleet_vm} is not allocated to this client")
    return divmod(fleet_vm, VM_STRIDE)
