"""Fabric tasks for real over SSH (the test's own sshd on 127.0.0.1), and their error cases."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from invoke import Context

from osfleet.config import Settings
from osfleet.errors import CommandFailedError, DiskFullError, HostUnreachableError, ImageInUseError
from osfleet.imaging import builder, publisher
from osfleet.imaging.host import Host
from osfleet.vm import qcow2
from osfleet.vm.images import GoldenImage, find_image, load
from tests.conftest import REPO, VENV_BIN, Sshd, free_port


def fab(sshd: Sshd, *args: str) -> subprocess.CompletedProcess[str]:
    return sshd.fab(*args)


def osfleet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "osfleet"), *args], capture_output=True, text=True, timeout=600, env=env)


def other_recipe(tmp_path: Path) -> Path:
    """The default recipe with another hostname: a different image name, so never a cache hit."""
    text = builder.DEFAULT_RECIPE.read_text().replace("hostname: osfleet", "hostname: osfleet-test")
    path = tmp_path / "other.yaml"
    path.write_text(text)
    return path


@pytest.mark.vm
def test_build_over_ssh_is_a_cache_hit_for_an_unchanged_recipe(sshd: Sshd, golden: GoldenImage) -> None:
    proc = fab(sshd, "build")
    assert proc.returncode == 0, proc.stderr
    assert f"{golden.name} is up to date (cache hit)" in proc.stdout


@pytest.mark.vm
@pytest.mark.slow
def test_publish_over_ssh_once_then_skip(sshd: Sshd, golden: GoldenImage, tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = fab(sshd, "publish", "--image", golden.name, "--store", str(store))
    assert proc.returncode == 0, proc.stderr
    published = load(store / f"{golden.name}.json")
    assert published.manifest["disk_sha256"] == golden.manifest["disk_sha256"]
    assert published.manifest["published_to"].startswith("root@127.0.0.1")
    for f in (published.disk, published.kernel, published.initrd, published.manifest_path):
        assert f.stat().st_mode & 0o777 == 0o444
    assert not list(store.glob(".*part*"))
    again = fab(sshd, "publish", "--image", golden.name, "--store", str(store))
    assert again.returncode == 0 and "already published" in again.stdout


@pytest.mark.vm
def test_overlay_task_over_ssh_makes_real_backing_chains(
    sshd: Sshd, golden: GoldenImage, settings: Settings, tmp_path: Path
) -> None:
    dest = tmp_path / "replicas"
    proc = fab(
        sshd,
        "overlay",
        "--image",
        golden.name,
        "--dest",
        str(dest),
        "--count",
        "3",
        "--osfleet",
        str(VENV_BIN / "osfleet"),
    )
    assert proc.returncode == 0, proc.stderr
    made = sorted(dest.glob("replica-*.qcow2"))
    assert len(made) == 3
    on_host = find_image(golden.name, settings)  # the published copy when there is one
    for ov in made:
        chain = qcow2.info(ov, backing_chain=True)
        assert [layer["filename"] for layer in chain] == [str(ov), str(on_host.disk)]
    full = fab(
        sshd,
        "overlay",
        "--image",
        golden.name,
        "--dest",
        str(dest),
        "--strategy",
        "full",
        "--osfleet",
        str(VENV_BIN / "osfleet"),
    )
    assert full.returncode == 0 and (dest / "replica-0000.img").stat().st_size == on_host.disk.stat().st_size


@pytest.mark.system
def test_unreachable_host_is_one_clear_line(tmp_path: Path) -> None:
    proc = osfleet("image", "build", "--host", "root@127.0.0.1", "--port", str(free_port()))
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("osfleet: error: cannot reach host root@127.0.0.1")
    assert len(proc.stderr.strip().splitlines()) == 1
    with pytest.raises(HostUnreachableError):
        from fabric import Connection

        Host(Connection("127.0.0.1", port=free_port(), connect_timeout=5)).run("true")


@pytest.mark.system
def test_unreachable_host_through_fab(tmp_path: Path) -> None:
    cmd = [
        str(VENV_BIN / "fab"),
        "-r",
        str(REPO / "golden_images"),
        "-H",
        f"root@127.0.0.1:{free_port()}",
        "build",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 1 and "error: cannot reach host" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.system
def test_missing_tool_is_named_with_its_package(tmp_path: Path) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env = {**os.environ, "PATH": str(empty_bin)}
    proc = osfleet("image", "build", "--recipe", str(other_recipe(tmp_path)), "--out", str(tmp_path / "o"), env=env)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "osfleet: error: missing tool on localhost: debootstrap (apt-get install debootstrap)"


@pytest.mark.system
def test_bad_recipe_through_fab(sshd: Sshd, tmp_path: Path) -> None:
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("name: desktop\npackages: []\nkernel_modules: []\ninitrd_modules: []\nbackground: pink\n")
    proc = fab(sshd, "build", "--recipe", str(recipe))
    assert proc.returncode == 1 and "error: bad recipe" in proc.stderr and "background" in proc.stderr


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.system
def test_full_disk_is_refused_before_building(sshd: Sshd, small_fs: Path, tmp_path: Path) -> None:
    proc = fab(sshd, "build", "--recipe", str(other_recipe(tmp_path)), "--out", str(small_fs / "out"))
    assert proc.returncode == 1
    assert "not enough free disk for an image build" in proc.stderr
    assert [p.name for p in (small_fs / "out").iterdir()] == []


@pytest.mark.vm
def test_publish_to_a_full_disk_is_refused(sshd: Sshd, golden: GoldenImage, small_fs: Path) -> None:
    with sshd.connection() as c, pytest.raises(DiskFullError, match="not enough free disk"):
        publisher.publish(Host(c, echo=False), golden, str(small_fs / "store"))


@pytest.mark.vm
@pytest.mark.slow
def test_an_image_in_use_is_never_replaced(sshd: Sshd, golden: GoldenImage, tmp_path: Path) -> None:
    store = tmp_path / "store"
    with sshd.connection() as c:
        host = Host(c, echo=False)
        disk = Path(publisher.publish(host, golden, str(store)))
        # The published copy no longer matches the build (as after a non-reproducible rebuild) ...
        disk.chmod(0o644)
        with open(disk, "r+b") as f:
            f.seek(disk.stat().st_size - 1)
            f.write(b"\x01")
        changed = disk.read_bytes()[-16:]
        # ... and a process (as a replica's QEMU would) holds it open.
        with open(disk, "rb") as held:
            holder = subprocess.Popen(["sleep", "600"], stdin=held)  # outlives a slow /proc scan on a busy host
        try:
            with pytest.raises(ImageInUseError, match=f"in use by pid.*{holder.pid}"):
                publisher.publish(host, golden, str(store))
            assert disk.read_bytes()[-16:] == changed  # untouched
        finally:
            holder.kill()
            holder.wait()
        publisher.publish(host, golden, str(store))  # no longer in use: replaced by the good build
        meta = json.loads((store / f"{golden.name}.json").read_text())
        assert (
            subprocess.run(["sha256sum", str(disk)], capture_output=True, text=True).stdout.split()[0]
            == meta["disk_sha256"]
        )


@pytest.mark.system
def test_an_interrupted_build_leaves_nothing_behind(sshd: Sshd, tmp_path: Path) -> None:
    """A build killed part-way (Ctrl-C) removes its temporary tree; no half-built image appears."""
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            str(VENV_BIN / "osfleet"),
            "image",
            "build",
            "--recipe",
            str(other_recipe(tmp_path)),
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("[1/7]"):
            break
    proc.send_signal(2)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert list(out.iterdir()) == []
    assert shutil.which("debootstrap")


# --- shell quoting, with a harmless fake toolchain -----------------------------------------------------------
class SandboxHost(Host):
    """This machine, but every command runs in ``cwd`` with fake build tools first on PATH (they log their
    arguments, one per line, to ``<tool>.args`` and fail), so a build goes as far as its first tool."""

    def __init__(self, cwd: Path, fake_bin: Path) -> None:
        super().__init__(Context(), echo=False)
        self.cwd, self.fake_bin = cwd, fake_bin
        self.commands: list[str] = []

    def _run(self, command: str, timeout: float | None) -> Any:
        self.commands.append(command)
        env = {**os.environ, "PATH": f"{self.fake_bin}:{os.environ['PATH']}"}
        p = subprocess.run(["bash", "-c", command], cwd=self.cwd, env=env, capture_output=True, text=True)
        return SimpleNamespace(exited=p.returncode, stdout=p.stdout, stderr=p.stderr)


def fake_tools(directory: Path) -> Path:
    directory.mkdir()
    for tool in [*builder.BUILD_TOOLS, "mount", "umount"]:
        script = directory / tool
        log = f"{directory}/{tool}.args"
        script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}\necho "{tool}: fake" >&2\nexit 1\n')
        script.chmod(0o755)
    return directory


@pytest.mark.system
def test_an_output_path_with_a_space_and_a_semicolon_stays_one_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    neighbour = sandbox / "out"  # what an unquoted "rm -rf .../out dir;x/..." would delete
    neighbour.mkdir()
    (neighbour / "keep.txt").write_text("keep")
    out = sandbox / "out dir;x"
    bin_dir = fake_tools(tmp_path / "bin")
    host = SandboxHost(sandbox, bin_dir)
    monkeypatch.setattr(builder, "BUILD_DISK_BYTES", 1)

    with pytest.raises(CommandFailedError) as info:
        builder.build(host, builder.DEFAULT_RECIPE, str(out))

    assert (neighbour / "keep.txt").read_text() == "keep"
    assert sorted(p.name for p in sandbox.iterdir()) == ["out", "out dir;x"]
    assert list(out.iterdir()) == []  # the temporary tree was removed, and nothing else
    assert "debootstrap failed: debootstrap: fake" in str(info.value)
    variant, suite, rootfs, mirror = (bin_dir / "debootstrap.args").read_text().splitlines()
    assert (variant, suite, mirror) == ("--variant=minbase", "bookworm", "http://deb.debian.org/debian")
    assert Path(rootfs).parent.parent == out and Path(rootfs).name == "rootfs"
    assert any(c.startswith("umount -l ") and "rm -rf " in c for c in host.commands)


@pytest.mark.system
def test_an_interrupted_local_command_is_ended_with_everything_it_started(tmp_path: Path) -> None:
    """Ctrl-C during a local command ends its whole process group before the caller's clean-up runs: a child
    that keeps writing (as debootstrap's downloads do) cannot recreate what the clean-up removed. The
    interrupt is raised from a timer thread's signal, at a moment the command is surely running."""
    marker = tmp_path / "started"
    tree = tmp_path / "tree"
    # The writer ignores SIGTERM, like a child that does not stop when asked: only SIGKILL ends it.
    command = (
        f"mkdir -p {tree}; (trap '' TERM; while :; do touch {tree}/f.$RANDOM; sleep 0.05; done) & touch {marker}; wait"
    )

    def interrupt_when_started() -> None:
        while not marker.exists():
            threading.Event().wait(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Thread(target=interrupt_when_started, daemon=True)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        Host(Context(), echo=False).run(command)
    shutil.rmtree(tree)
    threading.Event().wait(0.5)
    assert not tree.exists(), "a child of the interrupted command went on writing after the clean-up"


@pytest.mark.system
def test_a_local_command_past_its_timeout_fails_in_one_line() -> None:
    with pytest.raises(CommandFailedError, match="did not finish within 1 s"):
        Host(Context(), echo=False).run("sleep 30", timeout=1)


@pytest.mark.system
def test_ctrl_c_while_a_local_command_starts_is_handled_once_it_has_started() -> None:
    """A Ctrl-C that lands while ``Popen`` forks is held until the child's pid is known (then the caller ends
    it), instead of escaping with the child left running unseen."""
    from osfleet.imaging import host as host_module

    reached_the_end = False
    with pytest.raises(KeyboardInterrupt), host_module._signals_held():
        os.kill(os.getpid(), signal.SIGINT)
        threading.Event().wait(0.1)  # the signal is delivered here, and held
        reached_the_end = True
    assert reached_the_end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def running(pid: int) -> bool:
    """Alive and not a zombie (this machine's init may not reap orphans)."""
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.system
def test_what_an_interrupted_remote_build_left_running_is_stopped_before_its_tree_goes(
    sshd: Sshd, tmp_path: Path
) -> None:
    """Over SSH an interrupted command keeps running on the host (Fabric has no terminal to send ^C to): the
    build's clean-up first ends what works in its tree, found by command line or working directory (or root),
    and leaves every other process alone."""
    tree = tmp_path / ".tmp-build"
    (tree / "rootfs").mkdir(parents=True)
    host = Host(sshd.connection(), echo=False)
    # In {0}, a shell that ignores SIGTERM with {1} on its command line.
    spawn = "(cd {} && exec setsid sh -c 'trap \"\" TERM; while :; do sleep 1; done' {}) >/dev/null 2>&1 <&- & echo $!"
    by_cmdline = int(host.run(spawn.format("/", f"{tree}/rootfs/x")))
    by_cwd = int(host.run(spawn.format(tree, "")))
    bystander = int(host.run(spawn.format("/", f"{tmp_path}/elsewhere")))
    try:
        threading.Event().wait(0.3)
        host.stop_strays(str(tree))
        threading.Event().wait(0.3)
        assert [running(pid) for pid in (by_cmdline, by_cwd, bystander)] == [False, False, True]
    finally:
        for pid in (by_cmdline, by_cwd, bystander):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.system
def test_a_local_command_that_cannot_start_fails_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_shell(*_args: Any, **_kwargs: Any) -> None:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(subprocess, "Popen", no_shell)
    with pytest.raises(CommandFailedError, match="^localhost: cannot run debootstrap: No such file or directory$"):
        Host(Context(), echo=False).run("debootstrap --variant=minbase bookworm /x")
