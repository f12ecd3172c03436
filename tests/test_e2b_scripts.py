"""The guest side of ``osfleet e2b serve``'s commands (``osfleet.e2b.guest_commands``), run by bash on this machine
as they are in a guest: launched detached, followed, signalled, removed. In a real guest: tests/test_e2b_vm.py."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from osfleet.e2b import guest_commands as guest
from osfleet.e2b.guest_commands import Frame

pytestmark = pytest.mark.system  # bash and the commands it starts are processes


@pytest.fixture
def nonces() -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for nonce in made:
        sh(guest.remove_command(nonce))


def sh(command: str) -> subprocess.CompletedProcess[str]:
    """As the step's shell runs it: ``sh -c 'cd ~ && COMMAND'``."""
    return subprocess.run(["/bin/sh", "-c", f"cd ~ && {command}"], capture_output=True, text=True, timeout=60)


def launch(nonces: list[str], command: str, envs: dict[str, str] | None = None, cwd: str | None = None) -> Frame:
    nonce = guest.new_nonce()
    nonces.append(nonce)
    done = sh(guest.launch_command(nonce, command, envs or {}, cwd))
    assert done.returncode == 0, done.stderr
    return guest.parse_frame(done.stdout)


def follow(nonces: list[str], out: int, err: int) -> Frame:
    done = sh(guest.follow_command(nonces[-1], out, err))
    assert done.returncode == 0, done.stderr
    return guest.parse_frame(done.stdout)


def test_a_quick_command_ends_within_its_launching_step(nonces: list[str], tmp_path: Path) -> None:
    value = 'it\'s $HOME; `x` "quoted"'
    frame = launch(
        nonces, 'printf "%s|" "$V"; pwd; printf "\\000\\377"; echo err >&2; exit 3', {"V": value}, str(tmp_path)
    )
    assert frame.exit_code == 3 and frame.pid is not None
    assert frame.out == f"{value}|{tmp_path}\n".encode() + b"\x00\xff" and frame.err == b"err\n"
    assert (frame.out_size, frame.err_size) == (len(frame.out), len(frame.err))


def test_a_long_command_is_followed_until_it_ends(nonces: list[str]) -> None:
    frame = launch(nonces, "echo one; sleep 3; echo two")
    out = frame.out
    deadline = time.monotonic() + 30
    while frame.exit_code is None and time.monotonic() < deadline:
        frame = follow(nonces, len(out), 0)
        out += frame.out
    assert frame.exit_code == 0 and out == b"one\ntwo\n"


def test_a_signal_ends_the_commands_whole_group(nonces: list[str]) -> None:
    frame = launch(nonces, "sleep 300 & sleep 300; echo never")
    assert frame.exit_code is None and frame.pid is not None
    assert sh(guest.signal_command(frame.pid, "KILL")).returncode == 0
    deadline = time.monotonic() + 30
    while frame.exit_code is None and time.monotonic() < deadline:
        frame = follow(nonces, 0, 0)
    assert frame.exit_code == 137 and frame.out == b""
    group = subprocess.run(["ps", "-o", "stat=", "-g", str(frame.pid)], capture_output=True, text=True)
    assert [s for s in group.stdout.split() if not s.startswith("Z")] == []  # its background sleep went with it


def test_a_folder_that_is_not_there_fails_the_command_with_the_reason(nonces: list[str], tmp_path: Path) -> None:
    frame = launch(nonces, "echo never", cwd=str(tmp_path / "none"))
    assert frame.exit_code == 1 and b"No such file or directory" in frame.err and frame.out == b""


def test_output_comes_in_bounded_chunks(nonces: list[str]) -> None:
    frame = launch(nonces, f"head -c {guest.MAX_CHUNK * 2 + 5} /dev/zero")
    assert frame.exit_code == 0 and len(frame.out) == guest.MAX_CHUNK and frame.out_size == guest.MAX_CHUNK * 2 + 5
    frame = follow(nonces, guest.MAX_CHUNK * 2, 0)
    assert len(frame.out) == 5


def test_removing_leaves_nothing_behind(nonces: list[str]) -> None:
    launch(nonces, "true")
    folder = Path(guest.folder(nonces[-1]))
    assert folder.is_dir()
    sh(guest.remove_command(nonces[-1]))
    assert not folder.exists()
