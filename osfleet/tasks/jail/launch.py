"""Starts the evaluation jail for a root host agent: ``python -I -m osfleet.tasks.jail.launch SPEC``.

bubblewrap runs as the jail's own unprivileged user, which cannot reach every path the jail must show (pyenv's
Python under ``/root``, mode 0700, or a checkout in a private folder). So this launcher, still root, makes a
mount namespace of its own (private: nothing propagates to the host's), mounts a tmpfs on the spec's ``view``
folder, binds each path there (``binds``: ``[host path, staged path]``), drops to the jail user (``uid``/``gid``,
no supplementary groups), and executes bwrap (``argv``), which binds the staged copies back at their own paths
in the jail. The staging lives only in this process's namespace: it disappears with bwrap, and the host's
``view`` folder stays an empty directory. Standard library only (it runs before anything else is trusted).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE, MS_REMOUNT = 1, 2, 4, 4096, 16384, 1 << 18, 32


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    try:
        _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "making the mounts private")
        view = spec["view"].encode()
        _check(libc.mount(b"tmpfs", view, b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=1m"), "the staging tmpfs")
        for source, staged in spec["binds"]:
            if os.path.isdir(source):
                os.mkdir(staged, 0o755)
            else:
                os.close(os.open(staged, os.O_CREAT | os.O_WRONLY, 0o644))
            _check(libc.mount(source.encode(), staged.encode(), None, MS_BIND | MS_REC, None), f"binding {source}")
            flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
            _check(libc.mount(None, staged.encode(), None, flags, None), f"making {source} read-only")
        os.setgroups([])
        os.setresgid(spec["gid"], spec["gid"], spec["gid"])
        os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        if os.getresuid() != (spec["uid"],) * 3 or 0 in os.getgroups():
            raise OSError("the launcher did not drop root")
        os.execv(spec["argv"][0], spec["argv"])
    except OSError as exc:
        print(f"evaluation jail launcher: {exc}", file=sys.stderr)
    return 70


if __name__ == "__main__":
    sys.exit(main(sys.argv))
