"""Ids that name their host, so a stateless gateway routes without a database.

A replica ``r-1234abcd`` on host ``kvm1`` is ``kvm1.r-1234abcd`` to the gateway's clients, and so is its
lease. OSGym vm ids are integers, so the host's position in the gateway's host list is folded into them.
"""

from __future__ import annotations

import re

from osfleet.api.errors import NotFound

HOST_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
SEPARATOR = "."
VM_STRIDE = 1_000_000


def join(host: str, local: str) -> str:
    return f"{host}{SEPARATOR}{local}"


def split(fleet_id: str, what: str = "replica") -> tuple[str, str]:
    """(host, the host's own id); 404 when the id does not name a host."""
    host, sep, local = fleet_id.partition(SEPARATOR)
    if not sep or not local or not HOST_NAME.match(host):
        raise NotFound(f"no {what} {fleet_id} (fleet ids look like <host>.<id>)")
    return host, local


def vm_to_fleet(host_index: int, vm_id: int) -> int:
    return host_index * VM_STRIDE + vm_id


def vm_from_fleet(fleet_vm: int) -> tuple[int, int]:
    """(host index, the host's vm id)."""
    if fleet_vm < 0:
        raise NotFound(f"vm {fleet_vm} is not allocated to this client")
    return divmod(fleet_vm, VM_STRIDE)
