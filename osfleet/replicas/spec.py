"""The domain of a replica: one place that turns an image, a disk chain and a shape into a DomainSpec.

Saved states restore only into identical devices, so every replica (and the template a state is saved
from) gets its domain from here.
"""

from __future__ import annotations

from pathlib import Path

from osfleet.config import ReplicaShape
from osfleet.domain_xml import Accel, DiskSpec, DomainSpec
from osfleet.images import GoldenImage

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
) -> DomainSpec:
    """``incoming``: start waiting for a migration stream (a saved state) instead of booting."""
    return DomainSpec(
        name=name,
        kernel=image.kernel,
        initrd=image.initrd,
        cmdline=image.cmdline,
        disks=(DiskSpec(disk, backing=layers),),
        accel=accel,
        memory_mib=shape.memory_mib,
        vcpus=shape.vcpus,
        tb_cache_mib=shape.tb_cache_mib,
        metadata=metadata or {},
        qemu_args=INCOMING_ARGS if incoming else (),
    )
