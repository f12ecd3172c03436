"""E2B's filesystem calls (stat, list, make, move, remove) as the desktop user's shell commands in the guest.

E2B's daemon answers them from its own process in the sandbox; here each is one step's shell command, run as the
desktop user (so it sees and changes only what that user may), printing GNU ``find``'s fields separated by NUL
bytes. What the guest prints is hostile: at most ``MAX_LISTING`` bytes are read, every record must have exactly its
fields with numbers where numbers go, and anything else is an error, never half-used. File contents go through the
fleet's own files endpoint (``/files``, ``envd``), not through here.

Paths are the client's as E2B takes them: absolute, or relative to the desktop user's home (``~`` too).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass

from osfleet.client.fleet import AsyncSession
from osfleet.protocol.models import MAX_GUEST_PATH
from osfleet.protocol.osworld_paths import GUEST_USER

HOME = f"/home/{GUEST_USER}"
MAX_LISTING = 4 * 2**20  # bytes of a listing read from the guest
MAX_DEPTH = 16  # levels a listing may descend
FIELDS = "%y\\0%s\\0%m\\0%u\\0%g\\0%T@\\0%l\\0%p\\0\\n"  # type, size, mode, owner, group, mtime, link target, path
NUMBER = re.compile(r"^\d{1,20}$")
MTIME = re.compile(r"^\d{1,12}(\.\d{1,10})?$")
TYPES = {"f": "file", "d": "dir", "l": "symlink"}
STATUS_NOT_FOUND = 44  # what the commands below exit with when the path is not there
STATUS_EXISTS = 45  # and when it is there already (make_dir)
STEP_TIMEOUT = 60.0


class GuestFileError(Exception):
    """A filesystem call refused or failed; ``status``: the HTTP status that says why (400, 404, 409, 502)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Entry:
    """One file, folder or link as GNU find reports it."""

    name: str
    type: str  # file, dir, symlink, other
    path: str
    size: int
    mode: int
    owner: str
    group: str
    mtime: float
    symlink_target: str | None


def resolve(path: str) -> str:
    """The absolute, normalised path of what the client named (relative to the desktop user's home)."""
    if not path or "\x00" in path or len(path) > MAX_GUEST_PATH:
        raise GuestFileError(400, "a path is 1 to 4096 characters without NUL")
    if path == "~" or path.startswith("~/"):
        path = HOME + path[1:]
    if not path.startswith("/"):
        path = f"{HOME}/{path}"
    return posixpath.normpath(path).replace("//", "/")


def _find(path: str, depth: int) -> str:
    q = shlex.quote(path)
    find = f"find {q} -mindepth {depth and 1} -maxdepth {depth} -printf '{FIELDS}'"
    return f"{_there(q)}; {find} | head -c {MAX_LISTING + 1}"


async def _run(session: AsyncSession, command: str) -> tuple[int, str, str]:
    result = await session.step({"type": "cli_command", "command": command, "timeout": STEP_TIMEOUT}, observe=False)
    (outcome,) = result.results
    if not outcome.ok:
        raise GuestFileError(502, f"the guest could not run the filesystem call: {outcome.error}")
    return outcome.exit_code or 0, outcome.stdout or "", outcome.stderr or ""


def parse_listing(text: str) -> list[Entry]:
    """The records of ``FIELDS`` (hostile text: strict, bounded)."""
    if len(text.encode()) > MAX_LISTING:
        raise GuestFileError(502, f"the guest's listing is over {MAX_LISTING} bytes")
    if text and not text.endswith("\0\n"):
        raise GuestFileError(502, "the guest's listing ends inside a record: not find's records")
    entries = []
    for record in text.split("\0\n"):
        if not record:
            continue
        fields = record.split("\0")
        if len(fields) != 8:
            raise GuestFileError(502, "the guest's listing is not find's records")
        kind, size, mode, owner, group, mtime, link, path = fields
        if not (NUMBER.match(size) and re.match(r"^[0-7]{1,6}$", mode) and MTIME.match(mtime) and path.startswith("/")):
            raise GuestFileError(502, "the guest's listing has a record that is not find's")
        entries.append(
            Entry(
                name=posixpath.basename(path) or path,
                type=TYPES.get(kind, "other"),
                path=path,
                size=int(size),
                mode=int(mode, 8),
                owner=owner[:64],
                group=group[:64],
                mtime=float(mtime),
                symlink_target=link or None,
            )
        )
    return entries


async def stat(session: AsyncSession, path: str) -> Entry:
    path = resolve(path)
    entries = parse_listing(await _checked(session, _find(path, 0), "stat", path))
    if len(entries) != 1:
        raise GuestFileError(502, f"stat {path}: the guest answered {len(entries)} records, not 1")
    return entries[0]


async def _checked(session: AsyncSession, command: str, what: str, path: str) -> str:
    """Run ``command``; its exit statuses as errors (``STATUS_NOT_FOUND`` 404, ``STATUS_EXISTS`` 409, any other
    failure 400 with what it printed); its output when it succeeded."""
    code, out, err = await _run(session, command)
    if code == STATUS_NOT_FOUND:
        raise GuestFileError(404, f"{path} does not exist")
    if code == STATUS_EXISTS:
        raise GuestFileError(409, f"{path} exists already")
    if code != 0:
        raise GuestFileError(400, f"{what} {path}: {err.strip()[:300]}")
    return out


def _there(q: str) -> str:
    """A shell test that exits ``STATUS_NOT_FOUND`` unless the (quoted) path is there, a dangling link too."""
    return f"[ -e {q} ] || [ -L {q} ] || exit {STATUS_NOT_FOUND}"


async def list_dir(session: AsyncSession, path: str, depth: int) -> list[Entry]:
    path = resolve(path)
    if not 1 <= depth <= MAX_DEPTH:
        raise GuestFileError(400, f"depth {depth}: 1 to {MAX_DEPTH}")
    q = shlex.quote(path)
    return parse_listing(
        await _checked(session, f"[ -d {q} ] || exit {STATUS_NOT_FOUND}; {_find(path, depth)}", "list", path)
    )


async def make_dir(session: AsyncSession, path: str) -> Entry:
    path = resolve(path)
    q = shlex.quote(path)
    await _checked(session, f"[ -e {q} ] && exit {STATUS_EXISTS}; mkdir -p -- {q}", "make", path)
    return await stat(session, path)


async def move(session: AsyncSession, source: str, destination: str) -> Entry:
    source, destination = resolve(source), resolve(destination)
    q, d = shlex.quote(source), shlex.quote(destination)
    await _checked(session, f'{_there(q)}; mkdir -p -- "$(dirname -- {d})" && mv -- {q} {d}', "move", source)
    return await stat(session, destination)


async def remove(session: AsyncSession, path: str) -> None:
    path = resolve(path)
    q = shlex.quote(path)
    await _checked(session, f"{_there(q)}; rm -rf -- {q}", "remove", path)
