"""Checkpoints and forks know their image's bytes, not only its name (``forks.image_changed``).

The failure they prevent: an image rebuilt under the same name, then a checkpoint saved before restored over the new
bytes (the guest's page cache and the disk under it disagree: ``Bad message``). Saved running states were tied to
their image's disk already (``tests/test_saved_state_image.py``); a fork's state now records the same identity, and
a checkpoint or fork whose disk changed, or that records none (saved by an older osfleet), is refused with a 409 and
the reason before any replica starts, and is never deleted for its client.

These run a real ``ReplicaHost`` on libvirt's ``test:///`` driver over a small image file: the refusal comes before
anything a hypervisor would do. Only the accelerator probe is replaced (it boots a kernel under KVM, which a unit
test may not do).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from osfleet.api.errors import classify
from osfleet.config import Settings
from osfleet.replicas import manager as manager_module
from osfleet.replicas import saved_state
from osfleet.replicas.checkpoints import Checkpoint
from osfleet.replicas.errors import StateImageChangedError
from osfleet.replicas.forks import META, image_changed
from osfleet.replicas.manager import ReplicaHost
from osfleet.replicas.records import ReplicaRecord
from osfleet.replicas.saved_state import SavedState
from osfleet.vm.images import GoldenImage
from tests.test_saved_state_image import image_at, rebuild

unit = pytest.mark.unit
OWNER = "alice"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ReplicaHost]:
    monkeypatch.setattr(manager_module, "detect_accelerator", lambda kernel, settings: "qemu")
    settings = Settings(home=tmp_path / "home", libvirt_uri="test:///default", memory_dir=tmp_path / "memory")
    made = ReplicaHost(image_at(tmp_path / "images"), settings, auto_recover=False, spares=False, memory="stream")
    try:
        yield made
    finally:
        made.close()


def fork_state(host: ReplicaHost, fork_id: str, disks: list[dict[str, Any]] | None) -> SavedState:
    """A fork's folder as ``Forks.save`` leaves it (its meta; the layers' content is never read before the check)."""
    directory = host.settings.forks_dir / fork_id
    directory.mkdir(parents=True)
    meta: dict[str, Any] = {
        "fork": fork_id,
        "parent": "r-parent",
        "image": host.image.name,
        "accel": "qemu",
        "memory_mode": "stream",
        "layers": [str(directory / "disk.qcow2"), str(host.image.disk)],
    }
    if disks is not None:
        meta["disks"] = disks
    (directory / META).write_text(json.dumps(meta))
    return SavedState(directory, meta)


def keep(host: ReplicaHost, name: str, state: SavedState) -> None:
    host.checkpoints.add(
        Checkpoint(
            name=name,
            owner=OWNER,
            fork_id=state.directory.name,
            image=host.image.name,
            parent="r-parent",
            created_at=time.time(),
            stopped_at=time.time(),
            save_seconds=0.1,
            disk_bytes=1,
            memory_bytes=1,
            identity=("osfleet", "0" * 32),
        )
    )


def identity(image: GoldenImage) -> list[dict[str, Any]]:
    return [saved_state.disk_identity(image.disk)]


@unit
def test_a_checkpoint_saved_before_its_image_was_rebuilt_is_409_and_kept(host: ReplicaHost) -> None:
    state = fork_state(host, "f-0000000001", identity(host.image))
    keep(host, "before-rebuild", state)
    assert image_changed(state, "checkpoint 'before-rebuild'", "delete it") is None  # the same file: restorable
    rebuild(host.image.disk)  # the same name, other bytes
    with pytest.raises(StateImageChangedError) as refused:
        host.start_checkpoint("before-rebuild", OWNER, 1, "tester")
    message = str(refused.value)
    assert message.startswith(
        f"checkpoint 'before-rebuild' was saved on image {host.image.name} and cannot be restored"
    )
    assert "is no longer the file it was saved on (inode" in message and message.endswith("; delete it"), message
    assert classify(refused.value) == (409, "conflict")
    assert host.replicas() == []  # nothing started from it
    assert [c.name for c in host.checkpoints.list(OWNER)] == ["before-rebuild"]  # deleting it stays the client's call
    assert (state.directory / META).exists()


@unit
def test_a_checkpoint_that_records_no_disk_is_refused_as_an_older_osfleets(host: ReplicaHost) -> None:
    keep(host, "old-format", fork_state(host, "f-0000000002", None))
    with pytest.raises(StateImageChangedError, match="records nothing that identifies the image"):
        host.start_checkpoint("old-format", OWNER, 2, "tester")
    assert host.replicas() == [] and [c.name for c in host.checkpoints.list(OWNER)] == ["old-format"]


@unit
def test_no_child_starts_from_a_fork_state_whose_image_changed(host: ReplicaHost) -> None:
    state = fork_state(host, "f-0000000003", identity(host.image))
    rebuild(host.image.disk)
    with pytest.raises(
        StateImageChangedError, match=r"fork f-0000000003 was saved on image .* cannot be restored: .*\(inode"
    ):
        host.lifecycle.start_from(state, 2, None, ("osfleet", "0" * 32), time.time())
    assert host.replicas() == []


@unit
def test_a_fork_records_the_image_disk_its_parent_was_restored_on(host: ReplicaHost) -> None:
    """A parent restored from a saved state runs on that state's bytes even after a rebuild: its fork records those
    (and is then refused), not the new file; a cold-booted parent's fork records the image's disk as it is."""
    cold = ReplicaRecord(id="r-cold", image=host.image.name, mode="cold", layers=[str(host.image.disk)])
    assert host.forks.image_disks(cold) == identity(host.image)
    restored_on = identity(host.image)
    state_dir = host.settings.states_dir / f"{host.image.name}-abc"
    state_dir.mkdir(parents=True)
    (state_dir / "meta.json").write_text(json.dumps({"image": host.image.name, "disks": restored_on}))
    (state_dir / "disk.qcow2").write_bytes(b"")  # the state's layer (its content is never read here)
    rebuild(host.image.disk)
    parent = ReplicaRecord(
        id="r-warm",
        image=host.image.name,
        mode="snapshot",
        layers=[str(state_dir / "disk.qcow2"), str(host.image.disk)],
    )
    assert host.forks.image_disks(parent) == restored_on != identity(host.image)
    assert host.forks.image_disks(cold) == identity(host.image)


@unit
def test_a_parent_whose_saved_state_was_removed_under_it_is_not_forked(host: ReplicaHost) -> None:
    """The image rebuilt while a restored parent ran, and its saved state removed as stale (as a start or reset of
    another replica does): the parent runs on the open files, but a fork would record the new disk for bytes the
    parent never ran on, and its children could not open the chain. Refused before the parent pauses: 409."""
    state_dir = host.settings.states_dir / f"{host.image.name}-gone"
    parent = ReplicaRecord(
        id="r-orphan",
        image=host.image.name,
        mode="snapshot",
        layers=[str(state_dir / "disk.qcow2"), str(host.image.disk)],  # the state's folder is gone
    )
    with pytest.raises(StateImageChangedError) as refused:
        host.forks.image_disks(parent)
    assert f"replica r-orphan cannot be forked: a layer of its disk is gone ({state_dir / 'disk.qcow2'})" in str(
        refused.value
    )
    assert str(refused.value).endswith("reset it (it then runs on the image as it is now) and fork again")
    assert classify(refused.value) == (409, "conflict")
