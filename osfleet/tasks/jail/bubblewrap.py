"""The evaluation jail, host side: who the sandbox's zygote runs as, what it sees, and how it is started.

Everything that touches what a guest wrote (every metric, and ``check_python_file_by_test_suite``'s test suite,
which imports the agent's own file) runs in the evaluation sandbox's zygote and its children
(``osfleet.tasks.jail.sandbox``); this module puts that zygote in a jail made by bubblewrap (Debian's ``bwrap``):

- **A user of its own.** On a host agent that runs as root the jail runs as ``osfleet-jail`` (a system user with
  no home and no shell, made by ``scripts/setup``), never as root and never as the host agent's user: a process
  that is uid 0 inside a user namespace is still uid 0 for every file outside it, and ``/etc/shadow`` or the
  token file would be one ``open`` away. A host agent that is not root runs it as its own user (there is no
  other it could become) and says so in ``Sandbox.info``.
- **Namespaces.** bubblewrap gives the zygote new user, mount, PID, IPC, UTS, network and cgroup namespaces: an
  empty network (no host address, no host abstract socket), no process of the host to see or signal, and a
  root file system that is an empty tmpfs with only this put in it, read-only: ``/usr``, a few files of
  ``/etc`` that programs read (the dynamic linker's cache, time zone, fonts, MIME types), the Python
  installation, the virtualenv and the osfleet package at their own paths (nothing else of the project's
  folder, nothing of ``$OSFLEET_HOME``, no ``/run``, no ``/var``, no ``/home``, no ``/root``), a fresh ``/proc``
  and ``/dev`` (read-only too), and the spool of evaluation folders. No UNIX socket of the host is in it, so
  neither libvirt's nor the host agent's can be reached, whatever the network namespace would allow.
- **One evaluation, one namespace set.** The zygote (``zygote.py``) forks each evaluation as PID 1 of a new
  PID namespace with its own mount, network and IPC namespaces, where it sees only its own folder (read-only)
  and writes only into a tmpfs of its own (its ``/tmp`` and ``/dev/shm``); when the evaluation ends its PID 1
  exits and the kernel kills everything left in that namespace (a ``setsid()`` and a double fork included). Its
  metric process has no capabilities and runs under the evaluation seccomp filter (``seccomp``) with
  ``no_new_privs``; its memory and processes are bounded as a whole by a cgroup of its own (``cgroups``).
- **The host's side of it.** Paths a root host agent may reach but the jail user may not (pyenv's Python under
  ``/root``, mode 0700; a checkout anywhere) are bound first, as root, into a staging tmpfs inside a private
  mount namespace of the launcher (``launch``), which then drops to the jail user and runs bwrap on the
  staged copies: nothing is mounted in the host's own namespace, and nothing is left behind when it exits.

What it relies on: bubblewrap; unprivileged user namespaces (``user.max_user_namespaces`` > 0, and on Ubuntu
kernels no AppArmor restriction on them for bwrap); for a root host agent, ``CAP_SYS_ADMIN`` to make the
launcher's mount namespace (a privileged container has it). See docs/explanation/evaluation-jail.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from osfleet.errors import OsfleetError
from osfleet.tasks.jail import numba_cache

JAIL_USER = "osfleet-jail"
BWRAP = "bwrap"
JOBS = "/jobs"  # the spool of evaluation folders, inside the jail (each evaluation sees only its own, as /eval)
EVAL = "/eval"
# Files and folders of /etc that programs in the jail read; none of them says anything about the host's secrets.
ETC = (
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/timezone", "/etc/fonts",
    "/etc/mime.types", "/etc/alternatives",
)  # fmt: skip
MERGED = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # usr-merged symlinks (or folders) of the root
# Environment of everything in the jail: nothing of the host agent's (its token, its proxies, its paths).
ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "PYTHONDONTWRITEBYTECODE": "1",
    "OPENBLAS_NUM_THREADS": "1",  # no BLAS thread pools in a process that forks
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


class JailError(OsfleetError):
    """The evaluation jail cannot be set up on this host (no bubblewrap, no jail user): infrastructure."""


@dataclass(frozen=True)
class Identity:
    """Whom the jail runs as on the host."""

    uid: int
    gid: int
    name: str
    switch: bool  # the host agent is root and becomes this user (else it already is it)


def identity() -> Identity:
    """The jail's user: ``osfleet-jail`` for a root host agent (``JailError`` when set-up has not made it), the
    host agent's own user otherwise."""
    if os.geteuid() != 0:
        return Identity(os.geteuid(), os.getegid(), pwd.getpwuid(os.geteuid()).pw_name, False)
    try:
        entry = pwd.getpwnam(JAIL_USER)
    except KeyError:
        raise JailError(
            f"the evaluation jail needs the system user {JAIL_USER} (scripts/setup makes it: "
            f"useradd --system --user-group --no-create-home --shell /usr/sbin/nologin {JAIL_USER})"
        ) from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise JailError(f"the user {JAIL_USER} must not be root (uid {entry.pw_uid}, gid {entry.pw_gid})")
    return Identity(entry.pw_uid, entry.pw_gid, JAIL_USER, True)


def python_paths() -> list[str]:
    """What the jail's Python needs, read-only at their own paths: the installation (pyenv's, Debian's or a
    container's), the virtualenv, and the osfleet package (an editable install's source folder is elsewhere)."""
    import osfleet

    exe = Path(os.path.realpath(sys.executable))
    wanted = [sys.base_prefix, sys.prefix, str(exe.parent.parent), str(Path(osfleet.__file__).resolve().parent)]
    return _outermost(os.path.realpath(p) for p in wanted)


def _outermost(paths: Any) -> list[str]:
    """Each path once, leaving out those inside another (a virtualenv inside the checkout binds once)."""
    out: list[str] = []
    for p in sorted(set(paths), key=len):
        if not any(PurePosixPath(p).is_relative_to(q) for q in out):
            out.append(p)
    return out


class Jail:
    """One sandbox's jail: its spool of evaluation folders and the command that starts its zygote. ``close()``
    removes the spool."""

    def __init__(self) -> None:
        self.bwrap = shutil.which(BWRAP)
        if self.bwrap is None:
            raise JailError("the evaluation jail needs bubblewrap (apt-get install bubblewrap; scripts/setup does)")
        self.who = identity()
        self.numba_cache = numba_cache.folder()
        if self.numba_cache is not None:
            self.numba_cache.mkdir(parents=True, exist_ok=True, mode=0o755)
            numba_cache.warm_soon(self.numba_cache)
        self.base = Path(tempfile.mkdtemp(prefix="osfleet-jail-"))
        try:
            os.chmod(self.base, 0o711)
            self.jobs = self.base / "jobs"
            self.jobs.mkdir(mode=0o700)
            os.chown(self.jobs, self.who.uid, self.who.gid)
            self.view = self.base / "view"  # the launcher's staging tmpfs (a root host agent's only)
            self.view.mkdir(mode=0o755)
        except OSError:
            shutil.rmtree(self.base, ignore_errors=True)
            raise

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    # --- the zygote's command --------------------------------------------------------------------------------
    def readonly(self) -> list[str]:
        """Host paths the jail sees read-only at their own paths."""
        etc = [p for p in ETC if os.path.exists(p)]
        return _outermost(["/usr", *etc, *python_paths()])

    def command(self, inner: list[str], seccomp_fd: int, info_fd: int) -> tuple[list[str], dict[str, Any]]:
        """The argv that starts ``inner`` in the jail, and the launcher's spec for a root host agent (empty when
        bwrap runs directly). bwrap reads the outer seccomp filter from ``seccomp_fd`` and writes the zygote's
        host pid to ``info_fd``."""
        binds: list[list[str]] = []
        argv = [
            self.bwrap or BWRAP,
            "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try",  # (no --disable-userns: it nests a second user namespace, which the zygote's
            # setns back to its own PID namespace cannot cross; the seccomp filters forbid new user namespaces)
            # No --die-with-parent: it is PR_SET_PDEATHSIG, which fires when the *thread* that started bwrap ends,
            # and start_soon starts the zygote from a thread that ends at once (every first evaluation then found
            # it killed). The zygote exits when its control socket reads EOF, which the host agent's death gives.
            "--new-session", "--as-pid-1",
            # uid 0 of its own user namespace (which is the jail user on the host): bwrap nests a second user
            # namespace for any other uid, and the zygote could not go back to its PID namespace from there.
            "--uid", "0", "--gid", "0",
            # Within that namespace only: each evaluation's namespaces and mounts, and emptying the metric's
            # bounding set and locking its secure bits (so no execve gives uid 0 a capability back).
            "--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP",
            "--hostname", "osfleet-jail", "--clearenv",
        ]  # fmt: skip
        for key, value in ENV.items():
            argv += ["--setenv", key, value]
        # /tmp first: a Python or checkout under /tmp (a clone in /tmp/ci) is bound on top of it, not hidden by it.
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for path in self.readonly():
            argv += ["--ro-bind", self._staged(path, binds), path]
        for link in MERGED:
            if os.path.islink(link):
                argv += ["--symlink", os.readlink(link), link]
            elif os.path.isdir(link) and not any(PurePosixPath(link).is_relative_to(p) for p in self.readonly()):
                argv += ["--ro-bind", self._staged(link, binds), link]
        argv += ["--ro-bind", self._staged(str(self.jobs), binds), JOBS, "--dir", EVAL]
        if self.numba_cache is not None:  # compiled by the host, read-only here (osfleet.tasks.jail.numba_cache)
            argv += ["--ro-bind", self._staged(str(self.numba_cache), binds), numba_cache.JAIL_PATH]
            argv += ["--setenv", "NUMBA_CACHE_DIR", numba_cache.JAIL_PATH]
        argv += ["--chdir", "/"]
        # The root tmpfs read-only too, and /dev: they are shared by every evaluation of this zygote, and a file one
        # of them left there (an /etc/ld.so.preload, a marker in /dev/shm) would be the next one's. An evaluation
        # writes only into a tmpfs of its own, shown at /tmp and /dev/shm (zygote._isolate).
        argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
        argv += ["--seccomp", str(seccomp_fd), "--info-fd", str(info_fd), "--", *inner]
        if not self.who.switch:
            return argv, {}
        spec = {"uid": self.who.uid, "gid": self.who.gid, "view": str(self.view), "binds": binds, "argv": argv}
        return [sys.executable, "-I", "-m", "osfleet.tasks.jail.launch", json.dumps(spec)], spec

    def _staged(self, path: str, binds: list[list[str]]) -> str:
        """Where bwrap finds ``path``: itself when bwrap runs as the host agent's user, else its staged copy."""
        if not self.who.switch:
            return path
        staged = f"{self.view}/{len(binds)}"
        binds.append([path, staged])
        return staged

    # --- evaluation folders ----------------------------------------------------------------------------------
    def folder(self) -> Path:
        """A new evaluation folder in the spool (its files are written here by the host, read-only in the jail)."""
        folder = Path(tempfile.mkdtemp(prefix="e", dir=self.jobs))
        os.chmod(folder, 0o755)  # readable by the jail user (the spool itself is the jail user's, 0700)
        return folder


STAGE_MAX_FILES = 256  # files copied from one folder of the host (a getter's folder holds one)


def stage(value: Any, folder: Path) -> Any:
    """``value`` with every local file (a ``Path``, as the getters give them) copied into ``folder`` and named by
    its path in the jail. A file comes with the files beside it (a metric may read a sibling by name, as
    ``sheet_print`` reads the CSV exported beside a workbook), each host folder becoming one folder of the jail's.
    Only ``Path`` objects are files: a string is a value, even one that names a host file (a task's ``constant``
    could name ``/etc/shadow``), and is never copied."""
    slots: dict[Path, Path] = {}

    def walk(v: Any) -> Any:
        if isinstance(v, Path):
            return _staged(v, folder, slots)
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, tuple):
            return tuple(walk(x) for x in v)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        return v

    return walk(value)


def _staged(path: Path, folder: Path, slots: dict[Path, Path]) -> Path:
    source = path.absolute().parent
    slot = slots.get(source)
    if slot is None:
        slot = slots[source] = folder / str(len(slots) + 1)
        slot.mkdir(mode=0o755)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for entry in sorted(source.iterdir())[:STAGE_MAX_FILES]:
                if entry.is_file():  # a getter's file, or its link into the asset store
                    shutil.copyfile(entry, slot / entry.name)
                    os.chmod(slot / entry.name, 0o644)
    return Path(EVAL) / slot.relative_to(folder) / (path.name or "file")
