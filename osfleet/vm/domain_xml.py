"""Libvirt domain XML from small typed objects; the only place domain XML is written."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

METADATA_NS = "https://osfleet.dev/xmlns/replica/1"
QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
ET.register_namespace("osfleet", METADATA_NS)
ET.register_namespace("qemu", QEMU_NS)

Accel = Literal["kvm", "qemu"]

# QOM id of the guest RAM backend osfleet gives QEMU when RAM lives in a file (see MemoryFile). It is also
# the RAM block's name in migration streams, so a template and its clones must use the same id.
MEMORY_BACKEND_ID = "osfleet-ram"
# The virtio-serial port of the guest's resident control helper (``osfleet.replicas.guest_control``).
CONTROL_CHANNEL = "org.osfleet.control.0"
# The virtio-serial port of the guest's tunnel relay (``osfleet.replicas.tunnels``): the host reaching the
# replica's own loopback services (Chrome's DevTools) without a network.
TUNNEL_CHANNEL = "org.osfleet.tunnel.0"


@dataclass(frozen=True)
class DiskSpec:
    """A virtio disk backed by a file; ``relabel=False`` leaves ownership alone (shared golden images)."""

    path: Path
    target: str = "vda"
    fmt: str = "qcow2"
    readonly: bool = False
    # The read-only layers under the overlay, nearest first (e.g. a saved-state layer, then the golden
    # image): declared so libvirt neither probes their formats nor chowns them (they are shared).
    backing: tuple[Path, ...] = ()
    backing_fmt: str = "qcow2"


@dataclass(frozen=True)
class MemoryFile:
    """Guest RAM mapped from a file (template memory; see ``osfleet.replicas.template_memory``).

    ``share=True``: the guest writes into the file (the template a state is saved from). ``share=False``:
    a private copy-on-write mapping, the file is never written (a clone). ``rom_off``: open the file
    read-only but map it writable (QEMU >= 8.2 ``readonly=on,rom=off``), so the file can stay root's.
    """

    path: Path
    share: bool
    rom_off: bool = False

    def qemu_args(self, memory_mib: int) -> tuple[str, ...]:
        """libvirt builds its own RAM backend; a later ``-machine memory-backend=`` replaces it as the
        machine's RAM (libvirt's then stays an unused, untouched reservation and is not migrated)."""
        props: dict[str, object] = {
            "qom-type": "memory-backend-file",
            "id": MEMORY_BACKEND_ID,
            "size": memory_mib * 2**20,
            "mem-path": str(self.path),
            "share": self.share,
        }
        if self.rom_off and not self.share:
            props.update({"readonly": True, "rom": "off"})
        return ("-object", json.dumps(props, separators=(",", ":")), "-machine", f"memory-backend={MEMORY_BACKEND_ID}")


@dataclass(frozen=True)
class NicSpec:
    """A virtio NIC on ``bridge`` whose port is isolated: the bridge forwards nothing between isolated ports, so
    replicas on one bridge cannot reach each other (see ``osfleet.replicas.network``)."""

    bridge: str
    port: str | None = None  # the host's name for the replica's port (the tap): the anti-spoofing rules key on it


@dataclass(frozen=True)
class DomainSpec:
    """Everything that distinguishes one replica's domain; the rest is osfleet's fixed device model.

    Fixed on purpose: no network interface (replicas reach nothing) unless the host turned the opt-in replica
    network on (``nic``), no TCP display listener (screens and input go through libvirt/QMP), an absolute
    virtio tablet, a guest agent channel and a control channel for osfleet's resident helper.
    """

    name: str
    kernel: Path
    initrd: Path
    cmdline: str
    disks: tuple[DiskSpec, ...]
    accel: Accel = "qemu"
    uuid: str | None = None
    memory_mib: int = 512
    vcpus: int = 1
    tb_cache_mib: int = 64
    serial_log: Path | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    qemu_args: tuple[str, ...] = ()
    memory_file: MemoryFile | None = None
    nic: NicSpec | None = None
    # VM generation ID (a vmgenid device): a clone gets a new one, and the guest kernel reseeds its random
    # number generator the moment it sees the change, before any program in the clone runs.
    genid: str | None = None

    def to_xml(self) -> str:
        dom = ET.Element("domain", type=self.accel)
        ET.SubElement(dom, "name").text = self.name
        if self.uuid:
            ET.SubElement(dom, "uuid").text = self.uuid
        if self.genid:
            ET.SubElement(dom, "genid").text = self.genid
        if self.metadata:
            meta = ET.SubElement(dom, "metadata")
            rep = ET.SubElement(meta, f"{{{METADATA_NS}}}replica")
            for key, value in sorted(self.metadata.items()):
                rep.set(key, value)
        ET.SubElement(dom, "memory", unit="MiB").text = str(self.memory_mib)
        ET.SubElement(dom, "vcpu").text = str(self.vcpus)
        os_ = ET.SubElement(dom, "os")
        ET.SubElement(os_, "type", arch="x86_64", machine="pc").text = "hvm"
        ET.SubElement(os_, "kernel").text = str(self.kernel)
        ET.SubElement(os_, "initrd").text = str(self.initrd)
        ET.SubElement(os_, "cmdline").text = self.cmdline
        features = ET.SubElement(dom, "features")
        ET.SubElement(features, "acpi")
        if self.accel == "qemu":
            tcg = ET.SubElement(features, "tcg")
            ET.SubElement(tcg, "tb-cache", unit="MiB").text = str(self.tb_cache_mib)
        else:
            ET.SubElement(dom, "cpu", mode="host-passthrough")
        ET.SubElement(dom, "clock", offset="utc")
        ET.SubElement(dom, "on_poweroff").text = "destroy"
        ET.SubElement(dom, "on_reboot").text = "restart"
        ET.SubElement(dom, "on_crash").text = "destroy"
        devices = ET.SubElement(dom, "devices")
        for disk in self.disks:
            d = ET.SubElement(devices, "disk", type="file", device="disk")
            ET.SubElement(d, "driver", name="qemu", type=disk.fmt, cache="writeback")
            ET.SubElement(d, "source", file=str(disk.path))
            if disk.backing:
                parent = d
                for layer in disk.backing:
                    parent = ET.SubElement(parent, "backingStore", type="file")
                    ET.SubElement(parent, "format", type=disk.backing_fmt)
                    src = ET.SubElement(parent, "source", file=str(layer))
                    ET.SubElement(src, "seclabel", model="dac", relabel="no")
                ET.SubElement(parent, "backingStore")  # the chain ends here
            ET.SubElement(d, "target", dev=disk.target, bus="virtio")
            if disk.readonly:
                ET.SubElement(d, "readonly")
        if self.nic is not None:
            iface = ET.SubElement(devices, "interface", type="bridge")
            ET.SubElement(iface, "source", bridge=self.nic.bridge)
            if self.nic.port:
                ET.SubElement(iface, "target", dev=self.nic.port)
            ET.SubElement(iface, "model", type="virtio")
            ET.SubElement(iface, "port", isolated="yes")
        ET.SubElement(devices, "controller", type="usb", model="none")
        ET.SubElement(devices, "input", type="tablet", bus="virtio")
        ET.SubElement(devices, "input", type="keyboard", bus="ps2")
        video = ET.SubElement(devices, "video")
        ET.SubElement(video, "model", type="vga", vram="16384", heads="1")
        channel = ET.SubElement(devices, "channel", type="unix")
        ET.SubElement(channel, "target", type="virtio", name="org.qemu.guest_agent.0")
        control = ET.SubElement(devices, "channel", type="unix")  # libvirt names the socket (live XML)
        ET.SubElement(control, "target", type="virtio", name=CONTROL_CHANNEL)
        tunnel = ET.SubElement(devices, "channel", type="unix")
        ET.SubElement(tunnel, "target", type="virtio", name=TUNNEL_CHANNEL)
        if self.serial_log is not None:
            serial = ET.SubElement(devices, "serial", type="file")
            ET.SubElement(serial, "source", path=str(self.serial_log))
            ET.SubElement(serial, "target", port="0")
        rng = ET.SubElement(devices, "rng", model="virtio")
        ET.SubElement(rng, "backend", model="random").text = "/dev/urandom"
        ET.SubElement(devices, "memballoon", model="none")
        extra = self.qemu_args + (self.memory_file.qemu_args(self.memory_mib) if self.memory_file else ())
        if extra:
            cmd = ET.SubElement(dom, f"{{{QEMU_NS}}}commandline")
            for arg in extra:
                ET.SubElement(cmd, f"{{{QEMU_NS}}}arg", value=arg)
        ET.indent(dom)
        return ET.tostring(dom, encoding="unicode")
