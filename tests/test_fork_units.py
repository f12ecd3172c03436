"""Forks without VMs: the sparse in-place copy of an overlay, reference counts of disks and RAM files (a chain
of forks keeps its ancestors' layers but only the RAM its replicas map), the depth and size limits, and fork
capacity reserved atomically."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from osfleet.config import ReplicaShape, Settings
from osfleet.errors import HostIOError
from osfleet.replicas import forks, template_memory
from osfleet.replicas.errors import CapacityError
from osfleet.replicas.forks import Forks
from osfleet.replicas.manager import ReplicaHost
from osfleet.replicas.records import ReplicaRecord, State


@pytest.mark.unit
def test_an_overlay_is_copied_sparse_and_in_place_into_the_file_waiting_domains_hold(tmp_path: Path) -> None:
    src = tmp_path / "overlay.qcow2"
    with src.open("wb") as f:
        f.write(b"head" * 1024)
        f.seek(64 * 2**20)
        f.write(b"tail" * 1024)
    forks._copy_sparse(src, tmp_path / "new.qcow2", in_place=False)
    assert (tmp_path / "new.qcow2").read_bytes() == src.read_bytes()
    assert (tmp_path / "new.qcow2").stat().st_blocks * 512 < 2**20  # the 64 MiB hole stayed a hole
    waiting = tmp_path / "placeholder.qcow2"
    waiting.write_bytes(b"placeholder" * 10**6)  # longer than the overlay's data: nothing of it may remain
    inode = waiting.stat().st_ino
    forks._copy_sparse(src, waiting, in_place=True)
    assert waiting.stat().st_ino == inode and waiting.read_bytes() == src.read_bytes()
    with pytest.raises(HostIOError, match="copying .*File exists"):
        forks._copy_sparse(src, tmp_path / "new.qcow2", in_place=False)  # never overwrites a new fork's file


def make_fork(settings: Settings, fork_id: str, with_ram: bool = True) -> Path:
    directory = settings.forks_dir / fork_id
    directory.mkdir(parents=True)
    for layer in ("disk.qcow2", "parent.qcow2"):
        (directory / layer).write_bytes(b"q" * 4096)
    (directory / "memory.bin").write_bytes(b"m" * 4096)
    meta: dict[str, object] = {"fork": fork_id, "parent": "r-p", "memory_mode": "template"}
    if with_ram:
        assert settings.memory_dir is not None
        ram = settings.memory_dir / f"{fork_id}.ram"
        ram.write_bytes(b"r" * 8192)
        template_memory.claim(ram, directory)
        meta["ram_path"] = str(ram)
    (directory / "meta.json").write_text(json.dumps(meta))
    return directory


def record(rid: str, *layers: Path) -> ReplicaRecord:
    return ReplicaRecord(
        id=rid, image="golden-unit", mode="snapshot", state=State.READY, layers=[str(p) for p in layers]
    )


@pytest.mark.unit
def test_a_chain_of_forks_keeps_its_ancestors_disks_but_only_the_ram_its_replicas_map(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", memory_dir=tmp_path / "shm")
    assert settings.memory_dir is not None
    settings.memory_dir.mkdir()
    f1, f2, f3 = (make_fork(settings, f"f-{n}") for n in ("one", "two", "three"))
    golden = tmp_path / "golden.qcow2"
    # f2 was forked from a child of f1; its child maps f2's RAM and goes through f1's disk layers
    grandchild = record("r-g", f2 / "disk.qcow2", f2 / "parent.qcow2", f1 / "disk.qcow2", f1 / "parent.qcow2", golden)
    child_of_f3 = record("r-c", f3 / "disk.qcow2", f3 / "parent.qcow2", golden)
    host = Forks(None, None, "qemu", ReplicaShape(), settings)  # type: ignore[arg-type]
    assert host.users([grandchild, child_of_f3]) == {"f-one": 1, "f-two": 1, "f-three": 1}
    assert host.mappers([grandchild, child_of_f3]) == {"f-two": 1, "f-three": 1}
    assert host.depth(grandchild) == 2 and host.depth(child_of_f3) == 1
    assert host.collect([grandchild, child_of_f3]) == []
    meta = json.loads((f1 / "meta.json").read_text())
    assert meta["ram_released"] and "ram_path" not in meta and not (settings.memory_dir / "f-one.ram").exists()
    assert not (f1 / "memory.bin").exists() and (f1 / "disk.qcow2").exists()  # disk kept for the chain
    assert (settings.memory_dir / "f-two.ram").exists() and (settings.memory_dir / "f-three.ram").exists()
    assert host.collect([grandchild]) == ["f-three"] and not f3.exists()
    assert sorted(host.collect([])) == ["f-one", "f-two"] and not list(settings.memory_dir.glob("*.ram"))


@pytest.mark.unit
def test_forks_stop_at_the_depth_and_size_limits(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", memory_dir=tmp_path / "shm", fork_max_depth=2, fork_max_bytes=2**20)
    assert settings.memory_dir is not None
    settings.memory_dir.mkdir()
    f1, f2 = make_fork(settings, "f-one"), make_fork(settings, "f-two")
    golden = tmp_path / "golden.qcow2"
    host = Forks(None, None, "qemu", ReplicaShape(memory_mib=1), settings)  # type: ignore[arg-type]
    deep = record("r-d", f2 / "disk.qcow2", f2 / "parent.qcow2", f1 / "disk.qcow2", golden)
    with pytest.raises(CapacityError, match="2 fork\\(s\\) deep; forks go at most 2 deep"):
        host.check_limits(deep, [deep])
    shallow = record("r-s", f1 / "disk.qcow2", golden)
    with pytest.raises(CapacityError, match="would pass the host's limit of 1 MiB"):
        host.check_limits(shallow, [shallow, deep])  # 2 forks of ~28 KiB + 1 MiB for the new one
    roomy = Settings(home=settings.home, memory_dir=settings.memory_dir, fork_max_depth=2, fork_max_bytes=2**21)
    Forks(None, None, "qemu", ReplicaShape(memory_mib=1), roomy).check_limits(shallow, [shallow, deep])  # type: ignore[arg-type]


@pytest.mark.unit
def test_limits_and_ready_slots_are_checked_settings() -> None:
    from osfleet.errors import ConfigError

    for bad in ({"fork_max_depth": 0}, {"fork_max_bytes": 10}, {"fork_ready": 65}):
        with pytest.raises(ConfigError):
            Settings(**bad)  # type: ignore[arg-type]


@pytest.mark.unit
def test_capacity_for_a_fork_is_reserved_atomically(tmp_path: Path) -> None:
    """Twenty threads ask for room at once (forks of 3 children, bring-ups of 1): the room handed out never
    exceeds the maximum, however they interleave."""
    host = object.__new__(ReplicaHost)  # only the capacity book: no libvirt, no image
    host.max_replicas = 10
    host._capacity = threading.Lock()
    host._reserved = 0
    registered: list[int] = []
    host.replicas = lambda: registered  # type: ignore[method-assign]
    granted, refused, peak = [], [], [0]
    gate = threading.Barrier(20)

    def ask(n: int) -> None:
        gate.wait()
        try:
            with host.reserve(n):
                granted.append(n)
                peak[0] = max(peak[0], host._reserved + len(registered))
                os.sched_yield()
                threading.Event().wait(0.05)  # held while the "children" are made
        except CapacityError:
            refused.append(n)

    threads = [threading.Thread(target=ask, args=(3 if i % 2 else 1,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] <= 10 and refused and granted and host._reserved == 0


class SlotVirt:
    """Enough of ``Virt`` for a fork's wiring: domains started (their specs kept), QMP answered as QEMU would
    for a completed stream, screens of one colour."""

    def __init__(self) -> None:
        self.specs: dict[str, object] = {}
        self.calls: list[tuple[str, str]] = []

    def start_transient(self, spec: object, paused: bool = False) -> None:
        assert paused
        self.specs[spec.name] = spec  # type: ignore[attr-defined]

    def is_running(self, name: str) -> bool:
        return name in self.specs

    def destroy(self, name: str) -> bool:
        self.calls.append(("destroy", name))
        return self.specs.pop(name, None) is not None

    def resume(self, name: str) -> None:
        self.calls.append(("resume", name))

    def qmp(self, name: str, command: str, arguments: object = None) -> object:
        self.calls.append((command, name))
        if command == "query-migrate":
            return {"status": "completed", "downtime": 12}
        if command == "qom-get":
            return "/dev/shm/state.ram"
        return {}

    def qmp_with_files(self, name: str, command: str, arguments: object, files: list[int]) -> object:
        return {}

    def qemu_ids(self) -> None:
        return None

    def screenshot(self, name: str) -> object:
        from PIL import Image

        return Image.new("RGB", (8, 8))


@pytest.mark.system
def test_ready_slots_wait_on_the_next_forks_files_and_the_fork_fills_them_in_place(tmp_path: Path) -> None:
    from osfleet.replicas.saved_state import SavedState
    from osfleet.vm import qcow2
    from osfleet.vm.images import GoldenImage

    shm = Path("/dev/shm") / f"osfleet-unit-slots-{os.getpid()}"
    settings = Settings(home=tmp_path / "home", memory_dir=shm)
    golden = tmp_path / "golden-unit.qcow2"
    golden.write_bytes(b"\0" * 2**20)
    image = GoldenImage(tmp_path / "golden-unit.json", {"image": "golden-unit", "kernel_cmdline": "quiet"})
    state_disk = tmp_path / "state.qcow2"
    qcow2.create_overlay(state_disk, golden, "raw")
    state = SavedState(tmp_path, {"memory_mode": "template", "layers": [str(state_disk), str(golden)]})
    virt = SlotVirt()
    try:
        f = Forks(virt, image, "qemu", ReplicaShape(memory_mib=4), settings, saved=lambda: state, ready=2)  # type: ignore[arg-type]
        f.prepare()
        f.wait_ready()
        template = next(s for n, s in virt.specs.items() if n.startswith(settings.template_prefix))
        slots = [s for n, s in virt.specs.items() if not n.startswith(settings.template_prefix)]
        assert len(slots) == 2 and template.memory_file.share is True  # type: ignore[attr-defined]
        ram = template.memory_file.path  # type: ignore[attr-defined]
        assert all(s.memory_file.path == ram and s.memory_file.share is False for s in slots)  # type: ignore[attr-defined]
        fork_dir = settings.forks_dir / template.name.split("template-")[1]  # type: ignore[attr-defined]
        layer = fork_dir / "parent.qcow2"
        inode = layer.stat().st_ino
        for s in slots:  # each child's chain: its overlay, the fork template's, the frozen layer, the state's
            assert s.disks[0].backing == (fork_dir / "disk.qcow2", layer, state_disk, golden)  # type: ignore[attr-defined]
        parent_disk = tmp_path / "parent-overlay.qcow2"
        qcow2.create_overlay(parent_disk, state_disk)
        with parent_disk.open("r+b") as d:
            d.seek(2**16)
            d.write(b"written by the parent")
        parent = ReplicaRecord(
            id="r-p", image="golden-unit", mode="snapshot", state=State.READY, domain="osfleet-r-p-g1",
            disk=str(parent_disk), layers=[str(state_disk), str(golden)],
        )  # fmt: skip
        saved = f.save(parent)
        assert [s.domain for s in saved.slots] == [s.name for s in slots]  # type: ignore[attr-defined]
        assert saved.state.meta["ready_slots"] == 2 and saved.state.memory_mode == "template"
        assert layer.stat().st_ino == inode and layer.read_bytes() == parent_disk.read_bytes()
        assert template.name not in virt.specs  # type: ignore[attr-defined]  # destroyed: its RAM file is final
        assert ("migrate", "osfleet-r-p-g1") in virt.calls and ("resume", "osfleet-r-p-g1") in virt.calls
        assert 0.012 <= saved.state.meta["parent_paused_seconds"] < 5
        other = parent.model_copy(update={"layers": [str(fork_dir / "disk.qcow2"), str(golden)]})
        assert f._take_batch(other) is None  # a parent on another chain does not get slots
        f.release_slots(saved.slots)
        assert not any(s.name in virt.specs for s in slots)  # type: ignore[attr-defined]
        f.unpin(saved.state.directory.name)
    finally:
        f.close()
        import shutil

        shutil.rmtree(shm, ignore_errors=True)


@pytest.mark.unit
def test_a_fork_gives_its_slots_to_children_first_copies_the_parents_identity_and_prepares_the_next(
    tmp_path: Path,
) -> None:
    """Lifecycle.fork without VMs: 3 children, 2 slots; children take the slots in order, the third starts its
    own domain; every child carries the parent's hostname and machine id; spares come after all children; the
    next fork's slots are asked for once."""
    from osfleet.replicas.forks import Saved, Slot
    from osfleet.replicas.lifecycle import Lifecycle
    from osfleet.replicas.records import RecordStore
    from osfleet.replicas.registry import Registry
    from osfleet.replicas.saved_state import SavedState, disk_identity

    reg = Registry(RecordStore(tmp_path / "replicas"))
    parent = ReplicaRecord(
        id="r-p", image="golden-fake", mode="snapshot", state=State.READY, domain="dom-r-p",
        hostname="osfleet-parent", machine_id="a" * 32,
    )  # fmt: skip
    reg.save(parent)
    reg.add(parent)
    events: list[tuple[str, object]] = []
    (tmp_path / "golden-fake.qcow2").write_bytes(b"disk")  # the image's disk the fork records (unchanged since)
    disks = [disk_identity(tmp_path / "golden-fake.qcow2")]
    slots = [Slot(f"r-s{i}", f"osfleet-r-s{i}-g1", tmp_path / "replicas" / f"r-s{i}" / "disk-g1.qcow2") for i in (1, 2)]
    for s in slots:
        s.disk.parent.mkdir(parents=True)

    class FakeForks:
        def check_limits(self, rec: ReplicaRecord, records: object) -> None:
            events.append(("limits", rec.id))

        def save(self, rec: ReplicaRecord) -> Saved:
            return Saved(
                SavedState(
                    tmp_path / "f-1", {"memory_mode": "template", "parent_paused_seconds": 0.05, "disks": disks}
                ),
                list(slots),
                1.0,
            )

        def release_slots(self, left: object) -> None:
            events.append(("release", [s.replica_id for s in left]))  # type: ignore[attr-defined]

        def unpin(self, fork_id: str) -> None:
            pass

        def collect(self, records: object) -> list[str]:
            return []

        def prepare(self) -> None:
            events.append(("prepare", None))

    class NiceVirt(SlotVirt):  # its qemu_ids (None: folders private to root) and the children's priorities
        def set_vcpu_nice(self, name: str, nice: int) -> None:
            events.append(("nice", (name, nice)))

    class FakeGen:
        image = type("I", (), {"name": "golden-fake"})()
        virt = NiceVirt()

        def replica_dir(self, rid: str) -> Path:
            return tmp_path / "replicas" / rid

        def bring_up_from(
            self, rec: ReplicaRecord, state: object, slot: Slot | None, stopped_at: float, vcpu_nice: int | None
        ) -> None:
            rec.generation += 1
            rec.domain = f"osfleet-{rec.id}-g{rec.generation}"
            rec.move(State.BOOTING)
            events.append(("child", (rec.id, slot.domain if slot else None)))
            events.append(("nice", (rec.domain, vcpu_nice)))

        def adjust_clock_later(self, domain: str, seconds: float) -> None:
            events.append(("clock", domain))

        def vcpus_at_normal_priority(self, domain: str) -> None:
            self.virt.set_vcpu_nice(domain, 0)

        def prepare_standby(self, rec: ReplicaRecord) -> None:
            events.append(("spare", rec.id))

    life = Lifecycle(reg, FakeGen(), "snapshot", forks=FakeForks())  # type: ignore[arg-type]
    forked = life.fork("r-p", 3)
    kids = [c.record for c in forked.children]
    assert [k.id for k in kids][:2] == ["r-s1", "r-s2"] and kids[2].id not in ("r-s1", "r-s2")
    assert all(k.hostname == "osfleet-parent" and k.machine_id == "a" * 32 for k in kids)
    children = [e for e in events if e[0] == "child"]
    assert sorted(children) == sorted(
        [("child", ("r-s1", "osfleet-r-s1-g1")), ("child", ("r-s2", "osfleet-r-s2-g1")), ("child", (kids[2].id, None))]
    )
    last_child = max(i for i, e in enumerate(events) if e[0] == "child")
    first_spare = min(i for i, e in enumerate(events) if e[0] == "spare")
    assert first_spare > last_child and [e for e in events if e[0] == "prepare"] == [("prepare", None)]
    # Each child runs at the lowest priority while its siblings load, and all are back to normal before spares.
    nice = [(i, str(e[1])) for i, e in enumerate(events) if e[0] == "nice"]
    wanted = [str((k.domain, 19)) for k in kids] + [str((k.domain, 0)) for k in kids]
    assert sorted(x for _, x in nice) == sorted(wanted)
    back = [i for i, x in nice if x.endswith(", 0)")]
    first_back, last_back = min(back), max(back)
    assert last_child < first_back and last_back < first_spare
    assert ("release", []) in events and ("clock", "dom-r-p") in events  # the parent's clock moves on too
    assert events[0] == ("limits", "r-p")
