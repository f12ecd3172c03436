"""Saved states are tied to their image's bytes, not its name (``osfleet.replicas.saved_state``).

The reported failure: the image's name was published twice with other bytes; a saved running state taken before
broke every replica restored from it (``guest-exec ... Bad message``: the guest's page cache and the disk under it
disagreed), and nothing said why. A state records what identifies its image's disk and is made again, with a log
line, when that changed, both when a host agent starts and under one that runs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from osfleet.config import ReplicaShape, Settings
from osfleet.replicas import saved_state
from osfleet.replicas.saved_state import SavedState
from osfleet.vm.images import GoldenImage, load


def image_at(folder: Path, name: str = "golden-unit", sha: str = "a" * 64) -> GoldenImage:
    """An image whose disk is a real (small) file: what identifies it is what is tested."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.qcow2").write_bytes(b"disk v1")
    manifest = {
        "image": name,
        "disk_sha256": sha,
        "kernel_cmdline": "quiet",
        "recipe": {"screen": {"width": 1280, "height": 800}, "background": "#000000"},
    }
    return GoldenImage(folder / f"{name}.json", manifest)


def rebuild(disk: Path, data: bytes = b"disk v2") -> None:
    """What a build or publish does: a new file renamed over the old one."""
    new = disk.with_name(f".{disk.name}.part")
    new.write_bytes(data)
    new.rename(disk)


def state_dir(settings: Settings, image: GoldenImage, name: str, meta: dict[str, Any]) -> Path:
    d = settings.states_dir / f"{image.name}-{name}"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"image": image.name, **meta}))
    return d


@pytest.mark.unit
def test_the_state_key_follows_the_images_bytes_not_its_name(tmp_path: Path) -> None:
    image, shape = image_at(tmp_path), ReplicaShape()
    key = saved_state.state_key(image, "qemu", shape)
    assert saved_state.state_key(image, "qemu", shape) == key  # nothing changed: the same state
    rebuild(image.disk)  # the same name, a new file (a new inode)
    renamed = saved_state.state_key(image, "qemu", shape)
    assert renamed != key
    os.utime(image.disk, ns=(1, 1))  # written in place: another mtime
    assert saved_state.state_key(image, "qemu", shape) not in (key, renamed)
    other_build = dataclasses.replace(image, manifest={**image.manifest, "disk_sha256": "b" * 64})
    assert saved_state.state_key(other_build, "qemu", shape) != saved_state.state_key(image, "qemu", shape)


@pytest.mark.unit
def test_a_stale_state_is_named_with_what_changed(tmp_path: Path) -> None:
    image = image_at(tmp_path)
    meta = {"disks": [saved_state.disk_identity(image.disk)]}
    assert saved_state.stale_reason(meta) is None
    inode = image.disk.stat().st_ino
    rebuild(image.disk, b"a longer disk v2")
    why = saved_state.stale_reason(meta)
    assert why is not None and why.startswith(f"{image.disk} is no longer the file it was saved on (inode {inode} -> ")
    assert ", size 7 -> 16, mtime_ns " in why
    image.disk.unlink()
    assert saved_state.stale_reason(meta) == f"{image.disk} is no longer the file it was saved on (it is gone)"
    assert "saved by an older osfleet" in (saved_state.stale_reason({"memory_mode": "stream"}) or "")


@pytest.mark.unit
def test_states_of_a_changed_image_are_removed_with_a_log_line_and_others_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(home=tmp_path / "home")
    image = image_at(tmp_path / "images")
    before = [saved_state.disk_identity(image.disk)]
    ram = tmp_path / "shm" / "old.ram"
    ram.parent.mkdir()
    ram.write_bytes(b"template RAM")
    saved_state.template_memory.claim(ram, settings.states_dir / "x")
    old = state_dir(settings, image, "old", {"disks": before, "ram_path": str(ram)})
    legacy = state_dir(settings, image, "legacy", {"memory_mode": "stream"})  # records nothing: not trusted
    rebuild(image.disk)
    current = state_dir(settings, image, "current", {"disks": [saved_state.disk_identity(image.disk)]})
    other = image_at(tmp_path / "other", name="golden-other")
    other_state = state_dir(settings, other, "o", {"disks": before})  # stale, but another image's: not judged here
    said: list[str] = []
    with caplog.at_level(logging.WARNING, logger="osfleet.replicas.saved_state"):
        removed = saved_state.remove_stale(settings, image.name, said.append)
    assert removed == [legacy, old]
    assert not old.exists() and not legacy.exists() and not ram.exists()
    assert not saved_state.template_memory.owner_file(ram).exists()
    assert current.exists() and other_state.exists()
    assert said == [r.getMessage() for r in caplog.records]
    assert said[1].startswith(f"saved state {old.name} is stale: {image.disk} is no longer the file it was saved on")
    assert said[1].endswith("; it is removed and made again")


class CountingEnsure:
    def __init__(self, state: SavedState) -> None:
        self.state, self.calls = state, 0

    def __call__(self, *args: object) -> SavedState:
        self.calls += 1
        return self.state


@pytest.mark.unit
def test_a_running_host_makes_its_state_again_when_the_image_changes_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image replaced under a running agent (by something other than osfleet, which refuses: the agent holds
    it): the next generation is not restored from the old state; the state is made again first."""
    from osfleet.replicas.generations import Generations

    image = image_at(tmp_path / "images")
    settings = Settings(home=tmp_path / "home")
    said: list[str] = []
    gen = Generations(object(), image, "qemu", ReplicaShape(), settings, said.append, memory="stream")  # type: ignore[arg-type]
    old = SavedState(tmp_path / "old", {"disks": [saved_state.disk_identity(image.disk)]})
    gen._saved = old
    new = SavedState(tmp_path / "new", {"disks": []})
    ensure = CountingEnsure(new)
    monkeypatch.setattr(saved_state, "ensure_saved_state", ensure)
    try:
        assert gen.saved() is old and ensure.calls == 0  # unchanged: no stat-free shortcut, no remake
        rebuild(image.disk)
        assert gen.saved() is new and ensure.calls == 1
        assert said == [f"saved state old is stale: {saved_state.stale_reason(old.meta)}; making it again"]
    finally:
        gen.close()


@pytest.mark.vm
def test_a_state_whose_image_changed_is_remade_not_used(
    golden: GoldenImage, settings: Settings, no_leftovers: None
) -> None:
    """Real saved states: one made on a copy of the golden image; the copy published again under the same name (a
    new file renamed into place, as a second build does); a restarted host agent removes the old state, saying
    why, makes a new one, and its replica runs commands (a state on other bytes fails them: "Bad message")."""
    from osfleet.replicas.manager import ReplicaHost

    work = settings.scratch_dir / f"test-state-{uuid.uuid4().hex[:8]}"  # where QEMU's user may read
    folder = work / "images"
    folder.mkdir(parents=True)
    work.chmod(0o755)
    folder.chmod(0o755)
    try:
        for f in (golden.disk, golden.kernel, golden.initrd, golden.manifest_path):
            # The bytes and mode, not copy2's extended attributes: libvirt keeps a file's labels in use there
            # (trusted.libvirt.security.*), and a copy of them says "already in use" by a domain it never had.
            shutil.copyfile(f, folder / f.name)
            shutil.copymode(f, folder / f.name)
        image = load(folder / golden.manifest_path.name)
        home = dataclasses.replace(settings, home=work / "home")
        said: list[str] = []
        options: dict[str, Any] = {"mode": "snapshot", "auto_recover": False, "memory": "stream", "spares": False}
        first = ReplicaHost(image, home, say=said.append, **options)
        try:
            old = first.saved()
        finally:
            first.close()
        shutil.copyfile(image.disk, folder / ".again.qcow2")
        (folder / ".again.qcow2").rename(image.disk)

        again = ReplicaHost(image, home, say=said.append, **options)
        try:
            rid = again.create().replica
            new = again.saved()
            assert new.directory != old.directory and not old.directory.exists()
            assert new.meta["disks"] == [saved_state.disk_identity(image.disk)]
            assert any(m.startswith(f"saved state {old.directory.name} is stale: {image.disk} is no") for m in said)
            out = again.shell(rid, "echo restored-ok", 60)
            assert (out["exit_code"], out["stdout"].strip()) == (0, "restored-ok")
        finally:
            again.down()
            again.close()
    finally:
        shutil.rmtree(work)
