"""One build at a time per image folder (``osfleet.imaging.build_lock``), and images never replaced under their users.

Two builds of one recipe into one folder at once published the image's name twice, and a host agent's saved state
of the first broke every replica restored from it. These builds are real ``builder.build`` calls on this machine
(locks, checks, renames, manifest) with the long part, ``_build_in`` (debootstrap to qcow2, minutes), replaced by
one that makes a tiny image: the lock and the publishing are what is tested, not Debian.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from invoke import Context

from osfleet.errors import ImageInUseError
from osfleet.imaging import build_lock, builder, publisher
from osfleet.imaging.host import Host
from osfleet.vm.images import ImageHold, load
from tests.conftest import VENV_BIN, Sshd

# Locks held by commands started on the host, builds in threads and in a second process.
pytestmark = pytest.mark.system

WAIT = 60.0  # seconds any one step may take on a busy machine before the test fails


class ListeningHost(Host):
    """This machine, keeping what the build says, and telling a waiting test when it said a given thing."""

    def __init__(self) -> None:
        super().__init__(Context(), echo=False)
        self.said: list[str] = []
        self._heard = threading.Condition()

    def say(self, message: str) -> None:
        with self._heard:
            self.said.append(message)
            self._heard.notify_all()

    def heard(self, text: str, timeout: float = WAIT) -> str:
        with self._heard:
            found = self._heard.wait_for(lambda: next((m for m in self.said if text in m), None), timeout)
        assert found, f"never said {text!r}; said: {self.said}"
        return found


class TinyBuild:
    """``builder._build_in`` making a 1 MiB qcow2, a kernel and an initrd; the first call waits for ``release``."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, host: Host, recipe: object, work: str) -> str:
        self.calls.append(work)
        host.run(f"qemu-img create -q -f qcow2 {work}/golden.qcow2 1M")
        Path(work, "vmlinuz").write_text("kernel")
        Path(work, "initrd.img").write_text("initrd")
        self.started.set()
        assert self.release.wait(WAIT), "the test never let the first build finish"
        return "6.1.0-test"


@pytest.fixture
def tiny_build(monkeypatch: pytest.MonkeyPatch) -> TinyBuild:
    fake = TinyBuild()
    monkeypatch.setattr(builder, "_build_in", fake)
    monkeypatch.setattr(builder, "BUILD_DISK_BYTES", 1)  # the tiny build needs no 4 GiB
    return fake


def in_thread(fn: object, *args: object) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn(*args))  # type: ignore[operator]
        except BaseException as exc:  # handed to the test, which asserts on it
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def image_files(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir())


def test_a_second_build_of_one_output_waits_for_the_first_and_finds_its_image(
    tiny_build: TinyBuild, tmp_path: Path
) -> None:
    out = tmp_path / "build"
    first_host, second_host = ListeningHost(), ListeningHost()
    first, first_out = in_thread(builder.build, first_host, builder.DEFAULT_RECIPE, str(out))
    assert tiny_build.started.wait(WAIT)

    second, second_out = in_thread(builder.build, second_host, builder.DEFAULT_RECIPE, str(out))
    waiting = second_host.heard("waiting for the lock of")
    name = f"golden-{builder.image_hash_for(builder.load_recipe(builder.DEFAULT_RECIPE))}"
    assert f"held by: osfleet image build of {name}, pid {os.getpid()}" in waiting  # who holds it

    tiny_build.release.set()
    first.join(WAIT)
    second.join(WAIT)
    assert not first.is_alive() and not second.is_alive()
    assert first_out == second_out and isinstance(first_out[0], builder.ImageFiles)
    assert len(tiny_build.calls) == 1  # built once: the second found the first one's image
    assert second_host.said[-1].endswith(f"{name} is up to date (cache hit): {out}/{name}.qcow2")
    image = load(out / f"{name}.json")  # one complete image, its manifest describing its disk
    assert image.manifest["disk_sha256"] == hashlib.sha256(image.disk.read_bytes()).hexdigest()
    assert image_files(out) == [f"{name}.{ext}" for ext in ("initrd", "json", "qcow2", "vmlinuz")]


def test_a_second_osfleet_image_build_says_it_waits_and_ctrl_c_stops_only_it(
    tiny_build: TinyBuild, tmp_path: Path
) -> None:
    """The reported case, two terminals: the second ``osfleet image build`` of one output waits, saying whose lock
    (this test's build, in a thread), and Ctrl-C ends it without touching the first or its folder."""
    out = tmp_path / "build"
    first, first_out = in_thread(builder.build, ListeningHost(), builder.DEFAULT_RECIPE, str(out))
    assert tiny_build.started.wait(WAIT)
    second = subprocess.Popen(
        [str(VENV_BIN / "osfleet"), "image", "build", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert second.stdout is not None
        line = second.stdout.readline()
        assert line.startswith(f"waiting for the lock of {out}, held by: osfleet image build of golden-"), line
        assert f"pid {os.getpid()} of " in line and line.rstrip().endswith("(Ctrl-C to stop waiting)")
        second.send_signal(signal.SIGINT)
        _, err = second.communicate(timeout=WAIT)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    assert second.returncode == 130, err
    tiny_build.release.set()
    first.join(WAIT)
    assert isinstance(first_out[0], builder.ImageFiles)
    assert len(tiny_build.calls) == 1
    assert [n for n in image_files(out) if n.startswith(".")] == []  # no lock owner or work tree left


def test_a_lock_dies_with_its_holder(tmp_path: Path) -> None:
    """A build killed with SIGKILL cannot release its lock itself: the lock goes with its process (its end of
    the holder's stdin closes), so the next build never waits for a dead one."""
    folder = tmp_path / "build"
    folder.mkdir()
    code = (
        "import sys; from invoke import Context; from osfleet.imaging import build_lock; "
        "from osfleet.imaging.host import Host\n"
        f"with build_lock.folder_lock(Host(Context(), echo=False), {str(folder)!r}, 'a build that dies'):\n"
        "    print('held', flush=True); sys.stdin.read()"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            host = ListeningHost()
            waiting, _ = in_thread(_locked_once, host, folder)
            assert "a build that dies" in host.heard("waiting for the lock of")
        finally:
            holder.kill()
    waiting.join(WAIT)
    assert not waiting.is_alive()
    assert host.said[-1].startswith(f"got the lock of {folder} after ")
    assert list(folder.iterdir()) == []


def _locked_once(host: Host, folder: Path) -> None:
    with build_lock.folder_lock(host, str(folder), "the next build"):
        pass


def test_a_lock_over_ssh_is_released_when_its_connection_drops(sshd: Sshd, tmp_path: Path) -> None:
    """A build on a remote host holds the lock there; if its SSH connection goes (the laptop that ran it slept),
    sshd closes the holder's stdin and the lock is free again."""
    folder = tmp_path / "remote-build"
    folder.mkdir()
    connection = sshd.connection()
    remote = Host(connection, echo=False)
    lock = build_lock.folder_lock(remote, str(folder), "a remote build")
    lock.__enter__()
    try:
        owner = (folder / build_lock.OWNER_FILE).read_text()
        assert owner.startswith("a remote build, pid ")
        host = ListeningHost()
        waiting, _ = in_thread(_locked_once, host, folder)
        host.heard("held by: a remote build")
        connection.close()  # no release: the connection just ends
        waiting.join(WAIT)
        assert not waiting.is_alive() and host.said[-1].startswith("got the lock")
    finally:
        connection.close()
    assert list(folder.iterdir()) == []


def test_a_build_never_replaces_a_disk_that_a_process_holds(tiny_build: TinyBuild, tmp_path: Path) -> None:
    """An incomplete image (no manifest) whose disk a replica's QEMU still holds: the build stops before building,
    naming the process, and leaves the disk as it was."""
    out = tmp_path / "build"
    out.mkdir()
    name = f"golden-{builder.image_hash_for(builder.load_recipe(builder.DEFAULT_RECIPE))}"
    disk = out / f"{name}.qcow2"
    disk.write_bytes(b"the bytes a replica runs on")
    with open(disk, "rb") as held:
        user = subprocess.Popen(["sleep", "600"], stdin=held)
    try:
        with pytest.raises(ImageInUseError, match=rf"{disk} on localhost is in use by pid\(s\) .*{user.pid}"):
            builder.build(ListeningHost(), builder.DEFAULT_RECIPE, str(out))
    finally:
        user.kill()
        user.wait()
    assert tiny_build.calls == [] and disk.read_bytes() == b"the bytes a replica runs on"
    assert image_files(out) == [disk.name]


@pytest.fixture
def built(tiny_build: TinyBuild, tmp_path: Path) -> Iterator[Path]:
    """A tiny image built into ``tmp_path/build``; returns its manifest."""
    tiny_build.release.set()
    files = builder.build(ListeningHost(), builder.DEFAULT_RECIPE, str(tmp_path / "build"))
    yield Path(files.manifest)


def test_a_host_agents_image_is_never_replaced_by_a_publish(built: Path, tmp_path: Path) -> None:
    """A host agent (``ReplicaHost``) holds its image's disk open while it serves it, replicas or not: a publish of
    the same name with other bytes (a rebuild) stops, naming the agent's pid, instead of replacing it."""
    store = tmp_path / "store"
    host = ListeningHost()
    published = load(Path(publisher.publish(host, load(built), str(store))).with_suffix(".json"))
    rebuilt = json.loads(built.read_text()) | {"disk_sha256": "0" * 64}  # the same name, other bytes
    built.chmod(0o644)
    built.write_text(json.dumps(rebuilt))
    hold = ImageHold(published)
    try:
        assert hold.held
        with pytest.raises(ImageInUseError, match=rf"in use by pid\(s\) .*{os.getpid()}: stop its host agent"):
            publisher.publish(host, load(built), str(store))
    finally:
        hold.release()
    assert json.loads(published.manifest_path.read_text())["disk_sha256"] == published.manifest["disk_sha256"]
    assert [p.name for p in store.iterdir() if p.name.startswith(".")] == []
