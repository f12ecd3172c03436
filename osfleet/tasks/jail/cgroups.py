"""One cgroup per evaluation: its memory and its processes bounded as a whole, not per process.

Why: ``RLIMIT_AS`` is per process, so an evaluation that forks six children holds six times its memory; and
``RLIMIT_NPROC`` counts the processes of a user (of a user namespace), and every evaluation of a sandbox runs as
the same user of the same namespace: it is one pool for all of them, and a fork loop in one tenant's evaluation
would leave none for another tenant's. A cgroup per evaluation bounds each one alone: ``memory`` (what its
processes allocate, and the files of its own ``/tmp`` and ``/dev/shm``, which live in RAM) and ``pids`` (its
processes and threads). The kernel's OOM killer then ends a process of that evaluation only, and a fork over the
bound fails (``EAGAIN``) in that evaluation only.

How: the host agent (root) makes a folder for its sandbox in its own cgroup on each hierarchy that has the
controller (cgroup v1: ``memory`` and ``pids`` are two hierarchies; v2: one), and per evaluation a child with the
limits written, into which it moves the evaluation's first process (the PID 1 of its namespace, found through the
zygote's children) before it sends the job: nothing of the guest's runs before the evaluation is inside, and
everything it forks is born inside. A child is removed once its evaluation has ended (the kernel has reaped its
whole PID namespace by then); one the kernel still holds is removed at a later evaluation or when the sandbox
closes. Nothing of the cgroup file system is visible in the jail, so an evaluation cannot raise its own limits.

Where (``Groups.for_sandbox``):

- v1: ``<controller's mount>/<own cgroup>/osfleet-jail-<pid>-<n>/e<k>``, for ``memory`` and ``pids`` both;
- v2: a cgroup with processes cannot have children with controllers (the "no internal processes" rule), so the
  sandbox's folder goes in the host agent's own cgroup when that cgroup can enable ``memory`` and ``pids`` for
  its children (the root, or a cgroup the agent's processes are not in), else beside it when the parent already
  enables them and the agent may write there (systemd's ``Delegate=yes`` with ``DelegateSubgroup=``, which puts
  the agent's processes in a child of its delegated cgroup).

Where neither holds (a host agent that is not root, a container without a delegated cgroup) there is no cgroup:
the sandbox says why (``Sandbox.info["cgroup"]``) and bounds the jail's processes with ``RLIMIT_NPROC`` alone,
which is the one pool above (see docs/explanation/evaluation-jail.md).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import threading
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = "/proc/self/mountinfo"
OWN = "/proc/self/cgroup"
CONTROLLERS = ("memory", "pids")
PREFIX = "osfleet-jail-"
_sandboxes = itertools.count(1)


@dataclass(frozen=True)
class Bounds:
    """What one evaluation may hold as a whole."""

    memory_bytes: int  # its processes' memory and its tmpfs files together
    tasks: int  # processes and threads


@dataclass(frozen=True)
class Usage:
    """What the kernel counted for one evaluation's cgroup."""

    oom_kills: int  # processes its memory bound made the kernel end
    refused_forks: int  # forks its task bound refused
    peak_bytes: int | None  # the most memory it held (None where the kernel does not say)


@dataclass(frozen=True)
class Mount:
    point: Path
    root: str  # the folder of the hierarchy mounted there
    fstype: str
    options: frozenset[str]


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts(text: str) -> list[Mount]:
    """The cgroup file systems of a ``/proc/self/mountinfo``."""
    found = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        options = frozenset(tail[2].split(",")) | frozenset(fields[5].split(",") if len(fields) > 5 else ())
        found.append(Mount(Path(_unescape(fields[4])), _unescape(fields[3]), tail[0], options))
    return found


def own_cgroups(text: str) -> dict[str, str]:
    """A ``/proc/self/cgroup`` as {controller: path}; the v2 hierarchy's path under ``""``."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, names, path = parts
        for name in names.split(",") if names else [""]:
            found[name] = path
    return found


def _inside(mount: Mount, path: str) -> Path | None:
    """The folder of cgroup ``path`` under ``mount`` (None when the mount does not show it)."""
    root = mount.root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None
    return mount.point / path[len(root) :].lstrip("/")


def _read(path: Path) -> str:
    with open(path) as f:
        return f.read()


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _counter(text: str, key: str) -> int:
    """``key N`` in a flat keyed file (``memory.events``, ``pids.events``, v1's ``memory.oom_control``)."""
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == key and words[1].isdigit():
            return int(words[1])
    return 0


def v1_limits(bounds: Bounds) -> dict[str, dict[str, str]]:
    """What an evaluation's cgroup v1 folders get, per controller, in the order they are written (``memsw``, the
    bound on memory and swap together, only where swap accounting exists, and never below ``limit_in_bytes``)."""
    memory = str(bounds.memory_bytes)
    return {
        "memory": {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory},
        "pids": {"pids.max": str(bounds.tasks)},
    }


def v2_limits(bounds: Bounds) -> dict[str, str]:
    """What an evaluation's cgroup v2 folder gets (``memory.swap.max`` only where swap accounting exists)."""
    return {"memory.max": str(bounds.memory_bytes), "memory.swap.max": "0", "pids.max": str(bounds.tasks)}


class Group:
    """One evaluation's cgroup (a folder per hierarchy it is in)."""

    def __init__(self, folders: list[Path], version: int) -> None:
        self.folders = folders
        self.version = version

    def add(self, pid: int) -> None:
        """Move process ``pid`` (as the host sees it) in; ``ProcessLookupError`` when it has ended already."""
        for folder in self.folders:
            _write(folder / "cgroup.procs", str(pid))

    def usage(self) -> Usage:
        files = {name: path for folder in self.folders for name, path in _files(folder)}
        oom = files.get("memory.events") or files.get("memory.oom_control")
        peak = files.get("memory.peak") or files.get("memory.max_usage_in_bytes")
        events = files.get("pids.events")
        try:
            peak_bytes = int(_read(peak).split()[0]) if peak else None
        except (OSError, ValueError, IndexError):
            peak_bytes = None
        return Usage(
            _counter(_read(oom), "oom_kill") if oom else 0,
            _counter(_read(events), "max") if events else 0,
            peak_bytes,
        )

    def remove(self) -> bool:
        """Remove its folders; False when the kernel still holds one (a task not yet released): try later."""
        done = True
        for folder in self.folders:
            try:
                folder.rmdir()
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                done = False
        return done


def _files(folder: Path) -> list[tuple[str, Path]]:
    names = ("memory.events", "memory.oom_control", "memory.peak", "memory.max_usage_in_bytes", "pids.events")
    return [(n, folder / n) for n in names if (folder / n).exists()]


class Groups:
    """A sandbox's cgroup folders (one per hierarchy) and its evaluations' groups in them. Thread-safe."""

    def __init__(self, bases: dict[str, Path], version: int) -> None:
        self.bases = bases  # controller -> folder (v2: the same folder for every controller)
        self.version = version
        self._next = itertools.count(1)
        self._lock = threading.Lock()
        self._busy: list[Group] = []  # ended evaluations whose folders the kernel still held

    @classmethod
    def for_sandbox(
        cls, controllers: tuple[str, ...] = CONTROLLERS, version: int | None = None
    ) -> tuple[Groups | None, str]:
        """This host's groups for a new sandbox, with a line saying where; (None, why) when it has none usable.
        ``version``: only that cgroup version (else v1 where a v1 hierarchy has each controller, then v2)."""
        try:
            found = mounts(_read(Path(MOUNTINFO)))
            own = own_cgroups(_read(Path(OWN)))
        except OSError as exc:
            return None, f"cannot read this process's cgroups: {exc}"
        name = f"{PREFIX}{os.getpid()}-{next(_sandboxes)}"
        v1 = _v1_parents(found, own, controllers) if version in (None, 1) else None
        if v1 is not None:
            return cls._made({c: p / name for c, p in v1.items()}, 1)
        v2 = next((m for m in found if m.fstype == "cgroup2"), None) if version in (None, 2) else None
        if v2 is None:
            return None, f"no cgroup hierarchy has {' and '.join(controllers)}"
        here = _inside(v2, own.get("", "/"))
        if here is None:
            return None, "this process's cgroup v2 folder is not mounted here"
        parent, why = _v2_parent(v2, here, controllers)
        if parent is None:
            return None, why
        groups, said = cls._made({c: parent / name for c in controllers} or {"": parent / name}, 2)
        if groups is not None and controllers:
            try:
                _write(parent / name / "cgroup.subtree_control", " ".join(f"+{c}" for c in controllers))
            except OSError as exc:
                groups.close()
                return None, f"cannot enable {', '.join(controllers)} in {parent / name}: {exc}"
        return groups, said

    @classmethod
    def _made(cls, bases: dict[str, Path], version: int) -> tuple[Groups | None, str]:
        made: list[Path] = []
        try:
            for folder in dict.fromkeys(bases.values()):
                _sweep(folder.parent)
                folder.mkdir(mode=0o755)
                made.append(folder)
        except OSError as exc:
            for folder in made:
                with contextlib.suppress(OSError):
                    folder.rmdir()
            return None, f"cannot make the sandbox's cgroup: {exc}"
        where = ", ".join(str(f) for f in dict.fromkeys(bases.values()))
        return cls(bases, version), f"cgroup v{version}: {where}"

    def evaluation(self, bounds: Bounds) -> Group:
        """A new, empty group with ``bounds`` written; folders of earlier evaluations that the kernel had not let
        go are removed first."""
        with self._lock:
            self._busy = [g for g in self._busy if not g.remove()]
            key = f"e{next(self._next)}"
        folders = list(dict.fromkeys(base / key for base in self.bases.values()))
        group = Group(folders, self.version)
        try:
            for folder in folders:
                folder.mkdir(mode=0o755)
            if self.version == 1:
                for controller, values in v1_limits(bounds).items():
                    if controller in self.bases:
                        _write_limits(self.bases[controller] / key, values)
            else:
                wanted = set(self.bases)
                values = {k: v for k, v in v2_limits(bounds).items() if k.split(".")[0] in wanted}
                _write_limits(folders[0], values)
        except OSError:
            group.remove()
            raise
        return group

    def release(self, group: Group) -> None:
        """An ended evaluation's group: removed now, or at a later evaluation when the kernel still holds it."""
        if not group.remove():
            with self._lock:
                self._busy.append(group)

    def close(self) -> None:
        with self._lock:
            busy, self._busy = self._busy, []
        for group in busy:
            with contextlib.suppress(OSError):
                group.remove()
        for folder in dict.fromkeys(self.bases.values()):
            with contextlib.suppress(OSError):
                folder.rmdir()


def _write_limits(folder: Path, values: dict[str, str]) -> None:
    for name, value in values.items():
        path = folder / name
        if name in ("memory.memsw.limit_in_bytes", "memory.swap.max") and not path.exists():
            continue  # no swap accounting in this kernel: nothing to bound
        _write(path, value)


def _v1_parents(found: list[Mount], own: dict[str, str], controllers: tuple[str, ...]) -> dict[str, Path] | None:
    parents = {}
    for controller in controllers:
        mount = next((m for m in found if m.fstype == "cgroup" and controller in m.options), None)
        where = _inside(mount, own.get(controller, "/")) if mount is not None else None
        if where is None:
            return None
        parents[controller] = where
    return parents


def _v2_parent(mount: Mount, here: Path, controllers: tuple[str, ...]) -> tuple[Path | None, str]:
    """Where a v2 sandbox folder may go (see the module docstring), or (None, why)."""
    wanted = set(controllers)
    try:
        available = set(_read(here / "cgroup.controllers").split())
        if not wanted <= available:
            missing = ", ".join(sorted(wanted - available))
            return None, f"cgroup v2: {missing} not available to {here} (a controller still on a v1 hierarchy?)"
        if wanted <= set(_read(here / "cgroup.subtree_control").split()):
            return here, ""
        if wanted:
            _write(here / "cgroup.subtree_control", " ".join(f"+{c}" for c in controllers))
        return here, ""
    except OSError as exc:
        why = f"cgroup v2: {here} cannot enable {', '.join(controllers)} for its children ({exc.strerror})"
    parent = here.parent
    if here != mount.point and os.access(parent, os.W_OK):
        with contextlib.suppress(OSError):
            if wanted <= set(_read(parent / "cgroup.subtree_control").split()):
                return parent, ""
    return None, why + "; run the host agent in a delegated cgroup (systemd: Delegate=yes, DelegateSubgroup=agent)"


def _sweep(parent: Path) -> None:
    """Folders of sandboxes whose host process has ended (a killed host agent leaves its empty folders)."""
    with contextlib.suppress(OSError):
        for folder in parent.glob(f"{PREFIX}*"):
            pid = folder.name[len(PREFIX) :].split("-")[0]
            if not pid.isdigit() or int(pid) == os.getpid() or Path(f"/proc/{pid}").exists():
                continue
            with contextlib.suppress(OSError):
                for child in folder.iterdir():
                    if child.is_dir():
                        child.rmdir()
                folder.rmdir()
