"""Template memory, spares, the guest clock helper and host tuning: units without VMs, then a few real clones."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from osfleet.bench.density import cpu_seconds, process_memory
from osfleet.config import ReplicaShape, Settings
from osfleet.errors import ConfigError, OsfleetError
from osfleet.replicas import saved_state, template_memory
from osfleet.replicas.spec import replica_spec
from osfleet.vm.domain_xml import MEMORY_BACKEND_ID, QEMU_NS, MemoryFile
from osfleet.vm.host_tune import apply_ksm, ksm_status, wanted_ksm
from osfleet.vm.images import GoldenImage

SHM = Path("/dev/shm")


def qemu_args(xml: str) -> list[str]:
    return [a.get("value", "") for a in ET.fromstring(xml).iter(f"{{{QEMU_NS}}}arg")]


def fake_image(tmp_path: Path) -> GoldenImage:
    manifest = {
        "image": "golden-unit",
        "kernel_cmdline": "quiet",
        "recipe": {"screen": {"width": 1280, "height": 800}, "background": "#000000"},
    }
    return GoldenImage(tmp_path / "golden-unit.json", manifest)


# --- the domain: one spec, only `share` differs -------------------------------------------------------------
@pytest.mark.unit
def test_memory_file_replaces_libvirts_ram_backend_and_only_share_differs() -> None:
    template = MemoryFile(Path("/dev/shm/osfleet/t.ram"), share=True).qemu_args(512)
    clone = MemoryFile(Path("/dev/shm/osfleet/t.ram"), share=False).qemu_args(512)
    assert template[0] == "-object" and template[2:] == ("-machine", f"memory-backend={MEMORY_BACKEND_ID}")
    t, c = json.loads(template[1]), json.loads(clone[1])
    assert t == {**c, "share": True} and c["share"] is False
    assert c == {
        "qom-type": "memory-backend-file",
        "id": MEMORY_BACKEND_ID,
        "size": 512 * 2**20,
        "mem-path": "/dev/shm/osfleet/t.ram",
        "share": False,
    }
    readonly = json.loads(MemoryFile(Path("/x"), share=False, rom_off=True).qemu_args(512)[1])
    assert readonly["readonly"] is True and readonly["rom"] == "off"


@pytest.mark.unit
def test_template_and_clone_domains_are_the_same_but_for_share_and_incoming(tmp_path: Path) -> None:
    image, shape, ram = fake_image(tmp_path), ReplicaShape(), tmp_path / "t.ram"
    common = dict(image=image, name="osfleet-x", disk=tmp_path / "d.qcow2", layers=(image.disk,), accel="qemu")
    t = replica_spec(**common, shape=shape, memory=MemoryFile(ram, share=True)).to_xml()  # type: ignore[arg-type]
    c = replica_spec(**common, shape=shape, memory=MemoryFile(ram, share=False)).to_xml()  # type: ignore[arg-type]
    # every domain is a new VM generation; apart from that and ``share`` they are the same
    genids = [ET.fromstring(x).findtext("genid") for x in (t, c)]
    assert all(genids) and genids[0] != genids[1]
    same = t.replace(genids[0], genids[1]).replace("&quot;share&quot;:true", "&quot;share&quot;:false")  # type: ignore[arg-type]
    assert same == c
    incoming = replica_spec(**common, shape=shape, incoming=True, memory=MemoryFile(ram, share=False)).to_xml()  # type: ignore[arg-type]
    assert qemu_args(incoming)[:2] == ["-incoming", "defer"] and qemu_args(incoming)[2:] == qemu_args(c)


@pytest.mark.unit
def test_libvirt_accepts_a_domain_with_template_memory(tmp_path: Path) -> None:
    from osfleet.vm.virt import Virt

    image = fake_image(tmp_path)
    spec = replica_spec(
        image, "osfleet-unit-mem", tmp_path / "d.qcow2", (image.disk,), "kvm", ReplicaShape(),
        memory=MemoryFile(SHM / "osfleet-unit.ram", share=False),
    )  # fmt: skip
    with Virt("test:///default") as v:
        v.define(spec.to_xml().replace('type="kvm"', 'type="test"', 1), spec.name)
        try:
            assert v.names("osfleet-unit-mem") == ["osfleet-unit-mem"]
        finally:
            v.destroy(spec.name)


@pytest.mark.system
def test_qemu_takes_the_file_backend_as_the_machines_ram(tmp_path: Path) -> None:
    """The claim the design rests on: a later ``-machine memory-backend=`` replaces libvirt's pc.ram, which
    then has no RAM block name (so it is never migrated)."""
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        pytest.skip("no qemu-system-x86_64")
    ram = SHM / f"osfleet-unit-{os.getpid()}.ram"
    libvirt_like = [
        "-machine", "pc,memory-backend=pc.ram", "-m", "64",
        "-object", json.dumps({"qom-type": "memory-backend-ram", "id": "pc.ram", "size": 64 * 2**20}),
    ]  # fmt: skip
    try:
        out = subprocess.run(
            [qemu, *libvirt_like, *MemoryFile(ram, share=True).qemu_args(64), "-S", "-display", "none",
             "-nodefaults", "-monitor", "stdio"],
            input="info ramblock\nquit\n", capture_output=True, text=True, timeout=60,
        ).stdout  # fmt: skip
        blocks = [line.split()[0] for line in out.splitlines() if "0x" in line and not line.startswith("(qemu)")]
        assert MEMORY_BACKEND_ID in blocks and "pc.ram" not in blocks
        assert ram.stat().st_size == 64 * 2**20
    finally:
        ram.unlink(missing_ok=True)


# --- choosing the mode, files on tmpfs ------------------------------------------------------------------------
@pytest.mark.system
def test_template_memory_is_refused_where_it_cannot_work(tmp_path: Path) -> None:
    assert "off" in (template_memory.unavailable(None, 2**20) or "")
    if template_memory.filesystem_type(tmp_path) not in template_memory.MEMORY_FILESYSTEMS:
        assert "not tmpfs" in (template_memory.unavailable(tmp_path / "m", 2**20) or "")
    big = template_memory.unavailable(SHM / "osfleet-unit", 2**50)
    assert big is not None and "free" in big
    assert template_memory.unavailable(SHM / "osfleet-unit", 2**20) is None
    (SHM / "osfleet-unit").rmdir()


@pytest.mark.unit
def test_a_state_key_names_everything_a_saved_state_depends_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from osfleet.replicas import guest_control

    image, shape = fake_image(tmp_path), ReplicaShape()
    key = saved_state.state_key(image, "qemu", shape)
    assert saved_state.state_key(image, "qemu", shape, "template") != key
    assert saved_state.state_key(image, "qemu", ReplicaShape(kernel_args="")) != key  # booted with other args
    assert saved_state.state_key(image, "qemu", ReplicaShape(memory_mib=1024)) != key
    monkeypatch.setattr(guest_control, "helper_source", lambda: "another helper")
    assert saved_state.state_key(image, "qemu", shape) != key  # the helper lives in the saved state


@pytest.mark.system
def test_choose_memory_mode_falls_back_with_a_reason(tmp_path: Path) -> None:
    assert saved_state.choose_memory_mode(Settings(home=tmp_path, memory_dir=None), ReplicaShape()) == (
        "stream",
        "template memory is off (OSFLEET_MEMORY_DIR is empty)",
    )
    mode, reason = saved_state.choose_memory_mode(
        Settings(home=tmp_path, memory_dir=SHM / "osfleet-unit2"), ReplicaShape()
    )
    assert (mode, reason) == ("template", None)
    (SHM / "osfleet-unit2").rmdir()


@pytest.mark.system
def test_ram_copy_keeps_holes_and_is_put_back_after_a_reboot(tmp_path: Path) -> None:
    ram = tmp_path / "ram"
    with ram.open("wb") as f:
        f.truncate(8 * 2**20)
        f.seek(3 * 2**20 + 5)
        f.write(b"guest page")
    copy = tmp_path / "copy"
    assert template_memory.copy_sparse(ram, copy) == 2**20
    assert copy.read_bytes() == ram.read_bytes()
    assert copy.stat().st_blocks * 512 <= 2 * 2**20  # one data chunk, the rest holes
    back = tmp_path / "tmpfs" / "ram"
    template_memory.put_back(copy, back, None)
    assert back.read_bytes() == ram.read_bytes() and not list(back.parent.glob(".*"))


@pytest.mark.unit
def test_removing_saved_states_removes_their_ram_files(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    ram = tmp_path / "t.ram"
    ram.write_bytes(b"x")
    for name, meta in (("a", {"ram_path": str(ram)}), ("b", {})):
        (settings.states_dir / name).mkdir(parents=True)
        (settings.states_dir / name / "meta.json").write_text(json.dumps(meta))
    assert saved_state.remove_saved_states(settings) == 2
    assert not ram.exists() and not list(settings.states_dir.iterdir())


# --- config, KSM --------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_config_memory_dir_and_tenancy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSFLEET_MEMORY_DIR", "")
    assert Settings.from_env().memory_dir is None
    monkeypatch.setenv("OSFLEET_MEMORY_DIR", "/dev/shm/x")
    monkeypatch.setenv("OSFLEET_TENANCY", "multi")
    s = Settings.from_env()
    assert s.memory_dir == Path("/dev/shm/x") and s.tenancy == "multi"
    monkeypatch.setenv("OSFLEET_TENANCY", "many")
    with pytest.raises(ConfigError, match="OSFLEET_TENANCY 'many' must be one of single, multi"):
        Settings.from_env()


@pytest.mark.unit
def test_ksm_is_on_for_one_user_and_stays_off_for_several(tmp_path: Path) -> None:
    single, multi = Settings(home=tmp_path), Settings(home=tmp_path, tenancy="multi")
    assert wanted_ksm(single)[0].run == 1
    assert wanted_ksm(single, False)[0].run == 2
    assert wanted_ksm(multi)[0].run == 2 and "different users" in wanted_ksm(multi)[1]
    with pytest.raises(OsfleetError, match="KSM stays off when replicas belong to different users"):
        wanted_ksm(multi, True)


@pytest.mark.unit
def test_apply_ksm_writes_rates_then_run(tmp_path: Path) -> None:
    ksm = tmp_path / "ksm"
    ksm.mkdir()
    for name, value in (("run", 0), ("pages_to_scan", 100), ("sleep_millisecs", 200), ("pages_sharing", 25)):
        (ksm / name).write_text(f"{value}\n")
    status = apply_ksm(wanted_ksm(Settings(home=tmp_path))[0], ksm)
    assert (status["run"], status["pages_to_scan"], status["sleep_millisecs"]) == (1, 1000, 20)
    assert status["saved_bytes"] == 25 * 4096
    assert ksm_status(tmp_path / "none") == {"available": False}
    with pytest.raises(OsfleetError, match="has no KSM"):
        apply_ksm(wanted_ksm(Settings(home=tmp_path))[0], tmp_path / "none")


# --- measuring helpers, the clock helper --------------------------------------------------------------------
@pytest.mark.unit
def test_process_memory_and_cpu_of_this_process() -> None:
    mem = process_memory(os.getpid())
    assert mem["rss"] >= mem["pss"] > 0 and mem["private"] > 0
    assert (cpu_seconds(os.getpid()) or 0) > 0
    assert process_memory(2**22 + 7) == {} and cpu_seconds(2**22 + 7) is None


# --- real clones (TCG) ----------------------------------------------------------------------------------------
@pytest.fixture
def template_host(golden: GoldenImage, settings: Settings, no_leftovers: None) -> Iterator[object]:
    from osfleet.replicas.manager import ReplicaHost

    if saved_state.choose_memory_mode(settings, ReplicaShape())[0] != "template":
        pytest.skip("template memory unavailable on this host")
    h = ReplicaHost(golden, settings, mode="snapshot", auto_recover=False, memory="template")
    before = {r.id for r in h.replicas()}
    try:
        yield h
    finally:
        h.down([r.id for r in h.replicas() if r.id not in before])
        h.close()


@pytest.mark.vm
def test_clones_share_the_template_file_yet_keep_their_own_memory_and_a_reset_is_fast(template_host: object) -> None:
    from osfleet.replicas.manager import ReplicaHost

    h: ReplicaHost = template_host  # type: ignore[assignment]
    state = h.saved()
    assert state.memory_mode == "template" and state.ram is not None
    assert state.meta["memory_bytes"] < 32 * 2**20  # device state only; the RAM stays in the file
    ram_before = state.ram.stat()
    a, b = h.create().replica, h.create().replica
    for rid in (a, b):  # both map the template file privately
        maps = Path(f"/proc/{h.virt.qemu_pid(h.get(rid).domain)}/maps").read_text()
        assert str(state.ram) in maps
    h.shell(a, "echo only-a > /dev/shm/marker", 30)
    assert h.shell(b, "cat /dev/shm/marker 2>/dev/null || echo absent", 30)["stdout"].strip() == "absent"
    assert h.shell(a, "hostname", 30)["stdout"].strip() != h.shell(b, "hostname", 30)["stdout"].strip()
    after = state.ram.stat()
    assert (after.st_mtime_ns, after.st_size) == (ram_before.st_mtime_ns, ram_before.st_size)  # never written
    h.settle()
    time.sleep(3)  # the spare stands paused; its clock falls behind and the reset must set it
    took = h.reset(a).seconds
    guest_now = float(h.shell(a, "date +%s.%N", 30)["stdout"])
    assert abs(guest_now - time.time()) < 2.0
    assert took < 1.0, took
    assert h.shell(a, "cat /dev/shm/marker 2>/dev/null || echo absent", 30)["stdout"].strip() == "absent"


# --- spares, without VMs: which path a reset takes ------------------------------------------------------------
class SpareVirt:
    """Just enough of ``Virt`` for a generation's bring-up; records what was done to which domain."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.running: set[str] = set()

    def _do(self, what: str, name: str) -> None:
        self.calls.append((what, name))

    def is_running(self, name: str) -> bool:
        return name in self.running

    def resume(self, name: str) -> None:
        self._do("resume", name)

    def suspend(self, name: str) -> None:
        self._do("suspend", name)

    def destroy(self, name: str) -> bool:
        self._do("destroy", name)
        self.running.discard(name)
        return True

    def wait_for_agent(self, name: str, timeout: float) -> float:
        return 0.0

    def guest_exec(self, name: str, argv: list[str], timeout: float = 30) -> tuple[int, str, str]:
        self._do("identity", name)
        return 0, "", ""


def spare_generations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, fail_spare: bool = False) -> tuple:
    from osfleet.replicas import generations
    from osfleet.replicas.generations import Generations
    from osfleet.replicas.records import ReplicaRecord

    virt = SpareVirt()
    settings = Settings(home=tmp_path)
    gen = Generations(virt, fake_image(tmp_path), "qemu", ReplicaShape(), settings, lambda m: None)  # type: ignore[arg-type]
    disks = [saved_state.disk_identity(tmp_path / "golden-unit.qcow2")]  # unchanged since: the state is not stale
    state = saved_state.SavedState(tmp_path, {"memory_mode": mode, "ram_path": str(tmp_path / "t.ram"), "disks": disks})
    gen._saved = state

    failures = [1] if fail_spare else []

    def start_incoming(virt_: SpareVirt, st: object, image: object, name: str, *rest: object) -> None:
        if failures and "g2" in name:  # the spare's start fails once; the reset's own start works
            failures.pop()
            raise OsfleetError("no room for a spare")
        virt_.running.add(name)
        virt_._do("start", name)

    monkeypatch.setattr(generations.saved_state, "start_incoming", start_incoming)
    monkeypatch.setattr(generations.saved_state, "load_memory", lambda v, st, name: v._do("load", name))
    port = tmp_path / "control.sock"
    monkeypatch.setattr(generations.guest_control, "socket_path", lambda v, name: port)
    monkeypatch.setattr(
        generations.guest_control, "set_identity", lambda path, host, machine, timeout: virt._do("identity", "")
    )
    clock: list[tuple[str, object]] = []
    monkeypatch.setattr(generations.guest_clock, "set_now", lambda v, name, control: clock.append((name, control)))
    monkeypatch.setattr(Generations, "desktop_drawn", lambda self, name: True)
    rec = ReplicaRecord(id="r-1", image="golden-unit", mode="snapshot", hostname="h", machine_id="m")
    (tmp_path / "replicas" / "r-1").mkdir(parents=True)
    gen.bring_up(rec, "snapshot")  # generation 1, no spare yet
    gen.prepare_standby(rec)
    gen.settle()
    virt.calls.clear()
    gen.bring_up(rec, "snapshot")  # generation 2: the reset
    gen.close()
    return virt.calls, clock


@pytest.mark.unit
def test_a_reset_only_resumes_a_restored_spare_and_sets_its_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls, clock = spare_generations(tmp_path, monkeypatch, "template")
    # nothing but the resume touches a domain on the reset's path (identity and screen were done on the spare)
    assert calls == [("resume", "osfleet-r-1-g2")]
    assert clock == [("osfleet-r-1-g2", tmp_path / "control.sock")]


@pytest.mark.unit
def test_a_failed_spare_falls_back_to_restoring_on_the_reset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, clock = spare_generations(tmp_path, monkeypatch, "template", fail_spare=True)
    assert [w for w, _ in calls][:3] == ["start", "load", "identity"] and clock == []


@pytest.mark.unit
def test_full_stream_states_keep_a_started_standby_and_load_on_the_reset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls, clock = spare_generations(tmp_path, monkeypatch, "stream")
    assert [w for w, _ in calls][:2] == ["load", "identity"] and clock == []


@pytest.mark.unit
def test_ram_files_of_vanished_states_are_swept_but_young_or_owned_ones_stay(tmp_path: Path) -> None:
    mem, live = tmp_path / "mem", tmp_path / "home" / "states" / "live"
    mem.mkdir()
    live.mkdir(parents=True)
    (live / "meta.json").write_text("{}")
    for name, state in (("gone", tmp_path / "deleted-home" / "s"), ("live", live), ("saving", tmp_path / "x")):
        (mem / f"{name}.ram").write_bytes(b"r")
        template_memory.claim(mem / f"{name}.ram", state)
    now = time.time()
    os.utime(mem / "gone.state", (now - 3600, now - 3600))
    os.utime(mem / "live.state", (now - 3600, now - 3600))
    assert template_memory.sweep_orphans(mem, now) == [mem / "gone.ram"]
    assert sorted(p.name for p in mem.iterdir()) == ["live.ram", "live.state", "saving.ram", "saving.state"]
