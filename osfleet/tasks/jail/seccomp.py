"""The evaluation jail's system-call filters (seccomp, built with libseccomp through ``pyseccomp``).

Two filters, stacked (the kernel applies every filter a process has loaded; the strictest answer wins):

- ``outer``: handed to bubblewrap (``--seccomp FD``), so the zygote and everything it forks live under it. It
  stops what no evaluation and no zygote needs and what reaches the kernel's largest attack surfaces: tracing
  other processes, keyrings, eBPF, perf events, kernel modules, kexec, io_uring (whose operations bypass
  seccomp), userfaultfd, file handles, the kernel log, clocks, swap, accounting, raw and netlink sockets and
  32-bit system calls (the i386 ABI reaches a second copy of every table). The zygote still needs ``unshare``
  and ``mount`` to give each evaluation namespaces of its own, so those stay open here.
- ``evaluation``: loaded by each evaluation's own process after its namespaces are made, before a metric runs:
  the same list plus ``mount``, ``unshare``, ``setns``, ``clone`` with a namespace flag, ``pivot_root``,
  ``chroot``, the new mount API and host names, so nothing in an evaluation can build a namespace or a mount of
  its own (where the kernel's remaining user-namespace bugs live).

A forbidden call kills the process (``SIGSYS``): the evaluation then scores 0 "denied by the evaluation jail"
and says which signal; a metric has no business with any of these calls, so there is nothing to fall back to.
Socket families are the exception: a library may probe for netlink (``getaddrinfo``), so a refused family
fails with ``EAFNOSUPPORT`` instead. ``clone3`` answers ``ENOSYS`` (its flags sit in memory a filter cannot
read), which makes glibc fall back to ``clone``, whose flags are checked.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket

KILLED_BY = "a system call denied by the evaluation jail (SIGSYS)"
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2

# Stopped for every process in the jail (the zygote too).
OUTER_DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "keyctl", "add_key", "request_key",
    "bpf", "perf_event_open", "userfaultfd",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "open_by_handle_at", "name_to_handle_at",
    "syslog", "acct", "swapon", "swapoff", "quotactl", "quotactl_fd", "lookup_dcookie", "vhangup",
    "iopl", "ioperm", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "fanotify_init", "nfsservctl", "uselib", "personality",
)  # fmt: skip
# Stopped once an evaluation's namespaces are made (the zygote needs these to make them).
EVALUATION_DENIED = (
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    "sethostname", "setdomainname",
)  # fmt: skip
CLONE_NEWUSER = 0x10000000
CLONE_NAMESPACES = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
)  # (CLONE_NEWTIME shares clone()'s exit-signal byte: unshare, which makes it, is denied)
# Socket families a metric may open: local ones (there is nothing to reach in its empty network namespace).
SOCKET_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)
SOCK_TYPE_MASK = 0xF  # the type without SOCK_NONBLOCK / SOCK_CLOEXEC
DENIED_SOCKET_TYPES = (socket.SOCK_RAW, 10)  # SOCK_PACKET


def build(evaluation: bool):  # type: ignore[no-untyped-def]
    """The filter (a ``pyseccomp.SyscallFilter``, not loaded): ``evaluation`` adds the namespace and mount calls."""
    import pyseccomp as sc

    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)  # 32-bit and x32 calls: never
    denied = OUTER_DENIED + (EVALUATION_DENIED if evaluation else ())
    for name in denied:
        try:
            f.add_rule(sc.KILL_PROCESS, name)
        except OSError:  # a call this libseccomp does not know: it cannot be named, nor made through glibc
            continue
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    # No new user namespace for anyone in the jail (where the kernel's namespace bugs are reachable without
    # privileges); an evaluation may not make any namespace at all.
    for flag in _bits(CLONE_NAMESPACES if evaluation else CLONE_NEWUSER):
        f.add_rule(sc.KILL_PROCESS, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    if not evaluation:
        f.add_rule(sc.KILL_PROCESS, "unshare", sc.Arg(0, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
        f.add_rule(sc.KILL_PROCESS, "setns", sc.Arg(1, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    # socket(): only local families, and no raw or packet sockets among them.
    f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.GT, max(SOCKET_FAMILIES)))
    for family in range(max(SOCKET_FAMILIES)):
        if family not in SOCKET_FAMILIES:
            f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.EQ, family))
    for kind in DENIED_SOCKET_TYPES:
        f.add_rule(sc.ERRNO(errno.EPERM), "socket", sc.Arg(1, sc.MASKED_EQ, SOCK_TYPE_MASK, kind))
    return f


def _bits(mask: int) -> list[int]:
    return [1 << i for i in range(mask.bit_length()) if mask >> i & 1]


def program(evaluation: bool) -> bytes:
    """The filter compiled to a classic BPF program (what ``load`` and ``bwrap --seccomp`` take)."""
    fd = os.memfd_create("osfleet-jail-seccomp", os.MFD_CLOEXEC)
    try:
        with os.fdopen(os.dup(fd), "wb", closefd=True) as out:
            build(evaluation).export_bpf(out)
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def bpf_fd(evaluation: bool = False) -> int:
    """The program in a memory file, read from its start (``bwrap --seccomp FD``). The caller closes it."""
    fd = os.memfd_create("osfleet-jail-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, program(evaluation))
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load(compiled: bytes) -> None:
    """Install ``compiled`` (from ``program``) on this process: ``prctl(PR_SET_SECCOMP)`` with a program made
    once in the zygote, so each evaluation does not pay libseccomp's compilation (~14 ms here). Needs
    ``no_new_privs``, which bubblewrap sets for everything in the jail."""
    if not compiled or len(compiled) % 8:
        raise OSError("no seccomp program to load")
    buf = ctypes.create_string_buffer(compiled, len(compiled))
    prog = _SockFprog(len(compiled) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"loading the seccomp filter: {os.strerror(err)}")
