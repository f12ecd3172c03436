"""The domain of a replica: one place that turns an image, a disk chain and a shape into a DomainSpec.

Saved states restore only into identical devices, so every replica (and the template a state is saved
from) gets its domain from here. The only thing that differs between a template and its clones is how
the RAM file is mapped (``MemoryFile.share``): devices and machine arguments are the same.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from osfleet.config import ReplicaShape
from osfleet.replicas.network import port_name
from osfleet.vm.domain_xml import Accel, DiskSpec, DomainSpec, MemoryFile, NicSpec
from osfleet.vm.images import GoldenImage

INCOMING_ARGS = ("-incoming", "defer")


def replica_spec(
    image: GoldenImage,
    name: str,
    disk: Path,
    layers: tuple[Path, ...],
    accel: Accel,
    shape: ReplicaShape,
    incoming: bool = False,
    metadata: dict[str, str] | None = None,
    memory: MemoryFile | None = None,
) -> DomainSpec:
    """``incoming``: start waiting for a migration stream (a saved state) instead of booting.
    ``memory``: guest RAM mapped from a template file instead of libvirt's anonymous RAM. Every domain
    is a new VM generation (its own generation ID): a clone's kernel reseeds its RNG as it resumes."""
    return DomainSpec(
        name=name,
        kernel=image.kernel,
        initrd=image.initrd,
        cmdline=f"{image.cmdline} {shape.kernel_args}".strip(),
        disks=(DiskSpec(disk, backing=layers),),
        accel=accel,
        memory_mib=shape.memory_mib,
        vcpus=shape.vcpus,
        tb_cache_mib=shape.tb_cache_mib,
        metadata=metadata or {},
        qemu_args=INCOMING_ARGS if incoming else (),
        memory_file=memory,
        nic=NicSpec(shape.network_bridge, port_name(shape.network_bridge, name)) if shape.network_bridge else None,
        genid=str(uuid.uuid4()),
    )
