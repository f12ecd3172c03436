"""Files in and out of a real replica through a real host agent (``osfleet host serve``, one replica under TCG):
bytes round-trip unchanged and belong to the desktop user in the guest; paths elsewhere, ``..``, a root-only
file and one over the cap are refused with the right status; nothing of osfleet's is left in the guest's /tmp;
and examples/files.py runs as documented."""

from __future__ import annotations

import hashlib
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

from osfleet.bench.load import LocalAgent
from osfleet.client import Fleet, ForbiddenError, InvalidRequestError, NotFoundError, Session
from osfleet.config import DEFAULT_MAX_BODY_BYTES
from osfleet.protocol.actions import MAX_READ_BYTES
from osfleet.vm.images import GoldenImage
from tests.conftest import local_agent
from tests.test_sdk_vm import example

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def agent(golden: GoldenImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalAgent, Path]]:
    with local_agent(golden, tmp_path_factory.mktemp("files"), 1) as served:
        yield served


def shell(s: Session, command: str, as_root: bool = False) -> str:
    (result,) = s.step({"type": "shell", "command": command, "as_root": as_root}, observe=False).results
    assert result.ok and result.exit_code == 0, result
    return result.stdout or ""


def test_a_file_round_trips_as_the_desktop_users_and_refusals_are_precise(agent: tuple[LocalAgent, Path]) -> None:
    a, _ = agent
    data = os.urandom(3 * 2**20 + 17)  # several guest agent chunks, every byte value
    with Fleet(a.url, a.token) as fleet, fleet.lease(holder="files-vm") as s:
        assert s.upload("/home/user/in/a folder/data.bin", data) == len(data)
        assert s.download("/home/user/in/a folder/data.bin") == data
        # the desktop user's, made as it makes files (its usual umask, not the root's 077 around it)
        assert shell(s, "stat -c '%U %a' ~/in/'a folder'/data.bin ~/in") == "user 644\nuser 755\n"
        assert shell(s, "sha256sum < ~/in/'a folder'/data.bin").split()[0] == hashlib.sha256(data).hexdigest()

        with pytest.raises(ForbiddenError, match="is outside /home/user/ and /tmp/"):
            s.upload("/etc/osfleet-was-here", b"x")
        with pytest.raises(ForbiddenError, match="is not normalised"):
            s.download("/home/user/../../etc/shadow")
        shell(s, "echo secret > /tmp/roots && chmod 600 /tmp/roots", as_root=True)
        with pytest.raises(ForbiddenError, match="the desktop user may not read /tmp/roots"):
            s.download("/tmp/roots")
        with pytest.raises(ForbiddenError, match="the desktop user may not write /tmp/roots"):
            s.upload("/tmp/roots", b"overwritten")
        with pytest.raises(NotFoundError, match="no file /home/user/nothing"):
            s.download("/home/user/nothing")
        shell(s, f"head -c {MAX_READ_BYTES + 1} /dev/zero > /tmp/big")
        with pytest.raises(InvalidRequestError, match=r"/tmp/big is over 8 MiB \(8388608 bytes\)") as big:
            s.download("/tmp/big")
        assert big.value.status == 413

        # Over the server's body limit: the SDK refuses it with the figure the server publishes; sent anyway,
        # the server answers 413 from the declared length, before a byte of the body is read.
        with pytest.raises(InvalidRequestError, match=f"over the server's limit of {DEFAULT_MAX_BODY_BYTES} bytes"):
            s.upload("/tmp/huge", bytes(DEFAULT_MAX_BODY_BYTES + 1))
        query = urlencode({"lease_id": s.lease_id, "path": "/tmp/huge"})
        head = [f"PUT /v1/replicas/{s.replica_id}/files?{query} HTTP/1.1", "Host: 127.0.0.1"]
        head += [f"Authorization: Bearer {a.token}", f"Content-Length: {DEFAULT_MAX_BODY_BYTES + 1}", "", ""]
        with socket.create_connection(("127.0.0.1", a.port), timeout=30) as conn:
            conn.sendall("\r\n".join(head).encode())
            answer = conn.makefile("rb").read()  # the server closes after its answer
        assert answer.startswith(b"HTTP/1.1 413") and b"too_large" in answer, answer[:300]

        assert shell(s, "cat /tmp/roots; ls -A /tmp | grep -c '^.osfleet-file-' || true", as_root=True) == "secret\n0\n"
        assert shell(s, "test -e /etc/osfleet-was-here || echo absent") == "absent\n"


def test_the_files_example_runs(agent: tuple[LocalAgent, Path]) -> None:
    a, token = agent
    out = example("files.py", "--url", a.url, "--token-file", str(token))
    assert "uploaded 33 bytes to /home/user/data/scores.csv" in out, out
    assert "ranked in the desktop: alice,9 bob,8 carol,7" in out, out
    assert "1 MiB of random bytes back unchanged: True" in out, out
    assert len(re.findall(r"^refused: download /etc/passwd|^refused: download /home/user/\.\./", out, re.M)) == 2, out
    assert "not found: download /home/user/no-such-file" in out, out
