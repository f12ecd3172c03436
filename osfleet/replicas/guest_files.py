"""Files in and out of a replica's desktop, as its desktop user, through the guest agent.

The guest agent runs as root, so its own file calls never touch the client's path: what the desktop user may
read or write is the user's business, decided by the user's permissions as for anything its desktop does.

- An upload is written by the guest agent to a fresh temporary file (a random name under /tmp, which the agent
  creates exclusively, mode 0600), then the desktop user (``runuser``) copies it into place from a descriptor
  root opened for it: the user makes the file's folder (``mkdir -p``) and writes the file, or is refused.
- A download is the desktop user's copy of the file (a regular file only, at most the cap and one byte more) into
  a fresh root-owned temporary (0600), which the host then reads through the guest agent like every read from a
  guest (``actions.read_file``: bounded in bytes and time, every answer checked); a file over the cap is refused
  whole, never sent cut short.

Temporaries are removed whatever happens. The client's path reaches the guest only as an argument, never in a
command's text, and only once ``allowed_path`` has accepted it: absolute, normalised, under the user's home or
/tmp (``osfleet.protocol.models.FILE_ROOTS``). Exit codes of osfleet's own scripts say why a copy was refused; the
guest's words (stderr) only ever end up, cut short, in an error message.
"""

from __future__ import annotations

import base64
import contextlib
import math
import posixpath
import secrets
import shlex
import time
from dataclasses import dataclass
from typing import Any

from osfleet.errors import GuestCommandKilledError, GuestFileTooLargeError, GuestTimeoutError, OsfleetError
from osfleet.protocol.actions import MAX_READ_BYTES
from osfleet.protocol.models import FILE_ROOTS
from osfleet.replicas.actions import GUEST_TIMEOUT_SLACK_SECONDS, KILLED_BY_TIMEOUT, VERIFIER_ENV, read_file
from osfleet.replicas.errors import GuestFileConflictError, GuestFileNotFoundError, GuestPathRefusedError
from osfleet.vm.virt import GuestAgentUnavailableError, Virt

FILE_SECONDS = 120.0  # one upload or download, guest agent calls and the user's copy together
MAX_DOWNLOAD_BYTES = MAX_READ_BYTES  # the most a host reads from a guest file (a download over it is refused)
# One guest-file-write call. A guest agent message of more than about 256 KiB hangs the guest agent (measured under
# TCG with Debian's qemu-ga: 192 KiB of data, 256 KiB of base64, passes; 224 KiB does not, and the agent answers
# nothing more); 48 KiB (64 KiB of base64) writes 1 MiB in about 0.3 s, as fast as larger chunks.
WRITE_CHUNK_BYTES = 48 * 1024
FILE_CALL_SECONDS = 30  # at most, one guest agent call of a transfer (a chunk takes milliseconds)
CLEANUP_SECONDS = 10.0
TEMP_PREFIX = "/tmp/.osfleet-file-"

# Exit codes of the scripts below (none of runuser's, head's, cat's, sh's or timeout's own).
MISSING, NOT_REGULAR, DENIED, TOO_LARGE, IN_THE_WAY = 70, 71, 72, 73, 74

# As root: run the desktop user's script ("$4", with the arguments after it) as user "$3", reading "$1" and writing
# "$2" (both opened by root: the user never names them), in the verifier's fixed environment. Files root makes are
# its own, mode 0600, and never an existing file (noclobber).
AS_USER = (
    "i=$1; o=$2; u=$3; s=$4; shift 4; umask 077; set -C; "
    f'exec /usr/sbin/runuser -u "$u" -- /usr/bin/env -i {shlex.join(VERIFIER_ENV)} /bin/sh -c "$s" sh "$@" <"$i" >"$o"'
)

# As the desktop user, the file's bytes on stdin: make its folder and write it, or say why not (exit code). Made
# with the usual umask (022), not the 077 root's part ran under.
WRITE = f"""
umask 022
f=$1; d=${{f%/*}}
if [ -d "$f" ]; then exit {IN_THE_WAY}; fi
a=$d
while [ -n "$a" ] && [ ! -e "$a" ]; do a=${{a%/*}}; done
if [ -n "$a" ] && [ ! -d "$a" ]; then printf %s "$a" >&2; exit {IN_THE_WAY}; fi
if [ "$a" != "$d" ]; then
  if [ ! -w "${{a:-/}}" ] || [ ! -x "${{a:-/}}" ]; then exit {DENIED}; fi
  mkdir -p -- "$d" || exit 1
elif [ -e "$f" ]; then
  if [ ! -w "$f" ]; then exit {DENIED}; fi
elif [ ! -w "$d" ] || [ ! -x "$d" ]; then exit {DENIED}; fi
exec cat >"$f"
"""

# As the desktop user: the file on stdout, at most the cap ("$2") and one byte more, or say why not.
READ = f"""
f=$1
if [ ! -e "$f" ]; then exit {MISSING}; fi
if [ ! -f "$f" ]; then exit {NOT_REGULAR}; fi
if [ ! -r "$f" ]; then exit {DENIED}; fi
if [ "$(stat -L -c %s -- "$f")" -gt "$2" ]; then exit {TOO_LARGE}; fi
exec head -c "$(($2 + 1))" -- "$f"
"""


def allowed_path(path: str) -> str:
    """``path`` when a client may move a file there: absolute, normalised (no ``.`` or ``..`` parts, no ``//``,
    no trailing ``/``) and under one of ``FILE_ROOTS``; else ``GuestPathRefusedError`` (403) saying why. A
    symbolic link under them is not followed here: the desktop user's own permissions decide where it leads."""
    if not path.startswith("/") or "\x00" in path:
        raise GuestPathRefusedError(f"{path[:200]!r} is not an absolute path")
    if posixpath.normpath(path) != path or path.startswith("//"):
        raise GuestPathRefusedError(
            f"{path[:200]!r} is not normalised (no '.' or '..' parts, no '//', no trailing '/'): give it as "
            f"{posixpath.normpath(path).replace('//', '/')[:200]!r}"
        )
    if not path.startswith(FILE_ROOTS):
        raise GuestPathRefusedError(f"{path[:200]!r} is outside {' and '.join(FILE_ROOTS)}: files go there only")
    return path


def upload(virt: Virt, domain: str, user: str, path: str, data: bytes, timeout: float = FILE_SECONDS) -> None:
    """Write ``data`` to ``path`` (``allowed_path``'s) in the guest as ``user``, within ``timeout`` seconds."""
    agent = _Agent(virt, domain, f"writing {path}", time.monotonic() + timeout)
    temp = _temp_name()
    try:
        _write_temp(agent, temp, data)
        code, err = _as_user(agent, user, WRITE, [path], stdin=temp)
    finally:
        _remove(virt, domain, temp)
    if code == IN_THE_WAY:
        where = err.strip()[:200]
        raise GuestFileConflictError(f"{where} is a file, not a folder" if where else f"{path} is a folder")
    if code == DENIED:
        raise GuestPathRefusedError(f"the desktop user may not write {path}")
    if code != 0:
        raise GuestFileConflictError(f"writing {path} in the desktop failed: {_reason(err, code)}")


def download(
    virt: Virt, domain: str, user: str, path: str, limit: int = MAX_DOWNLOAD_BYTES, timeout: float = FILE_SECONDS
) -> bytes:
    """The file at ``path`` (``allowed_path``'s) in the guest, read as ``user``, whole: a file over ``limit``
    bytes raises ``GuestFileTooLargeError`` (413), never comes back cut short."""
    agent = _Agent(virt, domain, f"reading {path}", time.monotonic() + timeout)
    temp = _temp_name()
    too_large = GuestFileTooLargeError(
        f"{path} is over {limit / 2**20:g} MiB ({limit} bytes), the most a download reads"
    )
    try:
        code, err = _as_user(agent, user, READ, [path, str(limit)], stdout=temp)
        if code == 0:
            try:
                return read_file(virt, domain, temp, limit, timeout=agent.left(), whole=True)
            except GuestFileTooLargeError:  # grown since it was measured: the same refusal
                raise too_large from None
    finally:
        _remove(virt, domain, temp)
    if code == MISSING:
        raise GuestFileNotFoundError(f"no file {path} in the desktop (or none the desktop user can see)")
    if code == NOT_REGULAR:
        raise GuestFileConflictError(f"{path} is not a regular file (a folder, a device or a pipe)")
    if code == DENIED:
        raise GuestPathRefusedError(f"the desktop user may not read {path}")
    if code == TOO_LARGE:
        raise too_large
    raise GuestFileConflictError(f"reading {path} in the desktop failed: {_reason(err, code)}")


# --- the guest agent's part ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Agent:
    """Guest agent calls of one transfer, sharing its deadline: each gets what is left (at most
    ``FILE_CALL_SECONDS``)."""

    virt: Virt
    domain: str
    doing: str
    deadline: float

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise GuestTimeoutError(f"{self.domain}: {self.doing} did not finish in time")
        return left

    def __call__(self, command: str, arguments: dict[str, Any]) -> Any:
        timeout = max(1, min(FILE_CALL_SECONDS, math.ceil(self.left())))
        return self.virt.agent(self.domain, command, arguments, timeout=timeout)


def _temp_name() -> str:
    return TEMP_PREFIX + secrets.token_hex(16)


def _write_temp(agent: _Agent, temp: str, data: bytes) -> None:
    """``data`` in a new file ``temp`` of the guest's root (the guest agent creates it exclusively, mode 0600)."""
    handle = agent("guest-file-open", {"path": temp, "mode": "w"})
    if not isinstance(handle, int) or isinstance(handle, bool):
        raise GuestAgentUnavailableError(f"{agent.domain}: the guest agent opened a file without a file handle")
    try:
        for start in range(0, len(data), WRITE_CHUNK_BYTES):
            chunk = data[start : start + WRITE_CHUNK_BYTES]
            answer = agent("guest-file-write", {"handle": handle, "buf-b64": base64.b64encode(chunk).decode()})
            if not isinstance(answer, dict) or answer.get("count") != len(chunk):
                raise GuestAgentUnavailableError(f"{agent.domain}: the guest agent did not write what it was given")
    except BaseException:
        with contextlib.suppress(OsfleetError):
            agent("guest-file-close", {"handle": handle})
        raise
    agent("guest-file-close", {"handle": handle})  # it flushes: a failure here is a file not written


def _as_user(
    agent: _Agent, user: str, script: str, args: list[str], stdin: str = "/dev/null", stdout: str = "/dev/null"
) -> tuple[int, str]:
    """Run ``script`` with ``args`` as ``user``, its stdin and stdout files root opened; (exit code, stderr). The
    guest's own ``timeout`` kills it when the transfer's time is up."""
    left = agent.left()
    argv = ["/usr/bin/timeout", "-s", "KILL", f"{left:.3f}", "/bin/sh", "-c", AS_USER, "sh", stdin, stdout, user]
    code, _, err = agent.virt.guest_exec(agent.domain, [*argv, script, *args], left + GUEST_TIMEOUT_SLACK_SECONDS)
    if code == KILLED_BY_TIMEOUT:
        raise GuestCommandKilledError(f"{agent.domain}: {agent.doing} as the desktop user ran out of time")
    return code, err


def _remove(virt: Virt, domain: str, temp: str) -> None:
    """Remove a temporary of ours; a guest that does not answer keeps it (its /tmp is its own problem)."""
    with contextlib.suppress(OsfleetError):
        virt.guest_exec(domain, ["/bin/rm", "-f", "--", temp], CLEANUP_SECONDS)


def _reason(err: str, code: int) -> str:
    last = err.strip().splitlines()[-1][:200] if err.strip() else ""
    return last or f"exit code {code}"
