"""Domain XML objects, checked by libvirt itself (test:/// driver) and by its real qemu driver's parser."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import libvirt
import pytest

from osfleet.vm.domain_xml import METADATA_NS, DiskSpec, DomainSpec
from osfleet.vm.virt import DomainNotFoundError, Virt, VirtError, translate


def spec(**kw: object) -> DomainSpec:
    base = dict(
        name="osfleet-unit",
        kernel=Path("/boot/k"),
        initrd=Path("/boot/i"),
        cmdline="console=ttyS0",
        disks=(DiskSpec(Path("/srv/ov.qcow2"), backing=(Path("/srv/golden.qcow2"),)),),
        metadata={"role": "test"},
    )
    base.update(kw)
    return DomainSpec(**base)  # type: ignore[arg-type]


@pytest.mark.unit
def test_tcg_domain_has_no_network_no_display_listener_and_a_small_tb_cache() -> None:
    root = ET.fromstring(spec().to_xml())
    assert root.get("type") == "qemu"
    assert root.find("features/tcg/tb-cache").text == "64"
    assert root.find("devices/interface") is None
    assert root.find("devices/graphics") is None
    assert root.find("devices/input[@type='tablet']").get("bus") == "virtio"
    assert root.find("devices/channel/target").get("name") == "org.qemu.guest_agent.0"
    src = root.find("devices/disk/backingStore/source")
    assert src.get("file") == "/srv/golden.qcow2"
    assert src.find("seclabel").get("relabel") == "no"
    assert root.find(f"metadata/{{{METADATA_NS}}}replica").get("role") == "test"


@pytest.mark.unit
def test_kvm_domain_passes_the_host_cpu_and_has_no_tcg_features() -> None:
    root = ET.fromstring(spec(accel="kvm").to_xml())
    assert root.get("type") == "kvm"
    assert root.find("features/tcg") is None
    assert root.find("cpu").get("mode") == "host-passthrough"


@pytest.mark.unit
def test_libvirt_accepts_the_xml_and_errors_are_mapped() -> None:
    with Virt("test:///default") as v:
        v.define(spec(accel="kvm").to_xml().replace('type="kvm"', 'type="test"', 1), "osfleet-unit")
        try:
            assert v.names("osfleet-") == ["osfleet-unit"]
        finally:
            assert v.destroy("osfleet-unit") is True
        assert v.names("osfleet-") == []
        assert v.destroy("osfleet-unit") is False
        with pytest.raises(DomainNotFoundError, match="no domain osfleet-missing"):
            v.suspend("osfleet-missing")


@pytest.mark.integration
def test_connection_failure_is_one_line() -> None:
    with pytest.raises(VirtError, match="cannot connect to libvirt"):
        Virt("qemu+unix:///system?socket=/nonexistent/sock")


@pytest.mark.unit
def test_unexpected_libvirt_errors_keep_their_reason() -> None:
    err = libvirt.libvirtError("boom")
    err.err = (libvirt.VIR_ERR_INTERNAL_ERROR, 0, "internal error: boom", 0, "", "", "", 0, 0)
    mapped = translate(err, "osfleet-x", "starting")
    assert type(mapped) is VirtError and "starting osfleet-x: internal error: boom" in str(mapped)
