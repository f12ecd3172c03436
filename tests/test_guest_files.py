"""The guest's part of a file transfer (``osfleet.replicas.guest_files``) run for real on this machine, as its
``nobody`` user, through a stand-in for the guest agent that does what qemu-guest-agent does with the same calls
(files opened, written, read and closed by root; programs run by root). The desktop user's permissions decide:
a file it may not read or write, a link to one, a folder in the way, a pipe, a file over the cap are refused with
the right error, and nothing of osfleet's is left behind in /tmp. The same on a real replica: test_files_vm.py."""

from __future__ import annotations

import base64
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from osfleet.errors import GuestFileTooLargeError
from osfleet.replicas import guest_files
from osfleet.replicas.errors import GuestFileConflictError, GuestFileNotFoundError, GuestPathRefusedError

pytestmark = pytest.mark.system
USER = "nobody"  # the desktop user's stand-in: not root, owns nothing here


class LocalGuest:
    """The guest agent's calls that ``guest_files`` makes, carried out here as qemu-guest-agent carries them out
    in a guest: ``guest-file-open`` creates a new file exclusively with mode 0600 ("w") or opens one ("r"); writes
    are of a size it takes; reads report ``eof`` after a short read; ``guest-exec`` runs a program as root and
    gives its exit code and output."""

    def __init__(self) -> None:
        self.handles: dict[int, int] = {}
        self.commands: list[list[str]] = []

    def agent(self, name: str, command: str, arguments: dict[str, Any] | None = None, timeout: int = 5) -> Any:
        args = arguments or {}
        if command == "guest-file-open":
            if args["mode"] == "w":
                fd = os.open(args["path"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            else:
                fd = os.open(args["path"], os.O_RDONLY)
            self.handles[fd] = fd
            return fd
        fd = self.handles[args["handle"]]
        if command == "guest-file-write":
            # qemu-ga hangs on a message much over 256 KiB (guest_files.WRITE_CHUNK_BYTES says what was measured)
            assert len(args["buf-b64"]) <= 128 * 1024, "a guest-file-write the guest agent may not take"
            data = base64.b64decode(args["buf-b64"])
            return {"count": os.write(fd, data), "eof": False}
        if command == "guest-file-read":
            data = os.read(fd, args["count"])
            return {"count": len(data), "buf-b64": base64.b64encode(data).decode(), "eof": len(data) < args["count"]}
        if command == "guest-file-close":
            os.close(self.handles.pop(fd))
            return {}
        raise AssertionError(f"unexpected guest agent command {command}")

    def guest_exec(self, name: str, argv: list[str], timeout: float = 30.0) -> tuple[int, str, str]:
        self.commands.append(argv)
        done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
        return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")


@pytest.fixture
def guest() -> Iterator[LocalGuest]:
    g = LocalGuest()
    yield g
    assert not g.handles, "a guest file handle was left open"


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder under /tmp (one of the roots) that the stand-in desktop user may write in."""
    if os.geteuid() != 0:
        pytest.fail("runs as root, as the guest agent does (the machine's tests run as root)")
    folder = Path(tempfile.mkdtemp(prefix="osfleet-files-test-", dir="/tmp"))
    folder.chmod(0o777)
    before = set(Path("/tmp").glob(".osfleet-file-*"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder)
    assert set(Path("/tmp").glob(".osfleet-file-*")) == before, "a temporary of osfleet's was left in /tmp"


def owner(path: Path) -> str:
    return pwd.getpwuid(path.stat().st_uid).pw_name


def test_a_round_trip_is_the_desktop_users_and_byte_for_byte(guest: LocalGuest, shared: Path) -> None:
    data = bytes(range(256)) * 4096 + b"tail"  # over one guest-file-write chunk, every byte value
    target = shared / "made" / "by the user" / "file.bin"
    guest_files.upload(guest, "d", USER, str(target), data)  # type: ignore[arg-type]
    assert target.read_bytes() == data
    assert owner(target) == owner(target.parent) == owner(target.parent.parent) == USER
    assert (target.stat().st_mode & 0o777, target.parent.stat().st_mode & 0o777) == (0o644, 0o755)
    assert guest_files.download(guest, "d", USER, str(target)) == data  # type: ignore[arg-type]
    guest_files.upload(guest, "d", USER, str(target), b"shorter")  # type: ignore[arg-type]
    assert target.read_bytes() == b"shorter"
    # the client's path is an argument of its own to osfleet's scripts, never part of a command's text
    assert [a for argv in guest.commands for a in argv if str(target) in a] == [str(target)] * 3


def test_the_users_permissions_decide(guest: LocalGuest, shared: Path) -> None:
    secret = shared / "roots-only"
    secret.write_bytes(b"root's secret\n")
    secret.chmod(0o600)
    link = shared / "link-to-it"
    link.symlink_to(secret)
    closed = shared / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(GuestPathRefusedError, match=f"the desktop user may not read {secret}"):
        guest_files.download(guest, "d", USER, str(secret))  # type: ignore[arg-type]
    with pytest.raises(GuestPathRefusedError, match=f"the desktop user may not read {link}"):
        guest_files.download(guest, "d", USER, str(link))  # type: ignore[arg-type]
    with pytest.raises(GuestPathRefusedError, match=f"the desktop user may not write {secret}"):
        guest_files.upload(guest, "d", USER, str(secret), b"overwritten")  # type: ignore[arg-type]
    with pytest.raises(GuestPathRefusedError, match=f"the desktop user may not write {link}"):
        guest_files.upload(guest, "d", USER, str(link), b"overwritten")  # type: ignore[arg-type]
    with pytest.raises(GuestPathRefusedError, match="the desktop user may not write"):
        guest_files.upload(guest, "d", USER, str(closed / "sub" / "x"), b"x")  # type: ignore[arg-type]
    assert secret.read_bytes() == b"root's secret\n" and not (closed / "sub").exists()
    with pytest.raises(GuestFileNotFoundError, match="none the desktop user can see"):
        guest_files.download(guest, "d", USER, str(closed / "x"))  # type: ignore[arg-type]


def test_what_is_not_a_file_is_refused_by_name(guest: LocalGuest, shared: Path) -> None:
    (shared / "folder").mkdir(mode=0o777)
    (shared / "plain").write_bytes(b"x")
    os.mkfifo(shared / "pipe")
    (shared / "pipe").chmod(0o666)
    with pytest.raises(GuestFileConflictError, match="folder is a folder"):
        guest_files.upload(guest, "d", USER, str(shared / "folder"), b"x")  # type: ignore[arg-type]
    with pytest.raises(GuestFileConflictError, match=f"{shared / 'plain'} is a file, not a folder"):
        guest_files.upload(guest, "d", USER, str(shared / "plain" / "deeper" / "x"), b"x")  # type: ignore[arg-type]
    with pytest.raises(GuestFileConflictError, match="folder is not a regular file"):
        guest_files.download(guest, "d", USER, str(shared / "folder"))  # type: ignore[arg-type]
    with pytest.raises(GuestFileConflictError, match="pipe is not a regular file"):  # never blocks on a pipe
        guest_files.download(guest, "d", USER, str(shared / "pipe"))  # type: ignore[arg-type]
    with pytest.raises(GuestFileNotFoundError, match=f"no file {shared / 'absent'} in the desktop"):
        guest_files.download(guest, "d", USER, str(shared / "absent"))  # type: ignore[arg-type]


def test_a_file_over_the_cap_is_refused_whole(guest: LocalGuest, shared: Path) -> None:
    big = shared / "big"
    big.write_bytes(b"\xab" * 5000)
    big.chmod(0o644)
    with pytest.raises(GuestFileTooLargeError, match=f"{big} is over .* MiB \\(4999 bytes\\)"):
        guest_files.download(guest, "d", USER, str(big), limit=4999)  # type: ignore[arg-type]
    assert guest_files.download(guest, "d", USER, str(big), limit=5000) == b"\xab" * 5000  # type: ignore[arg-type]
