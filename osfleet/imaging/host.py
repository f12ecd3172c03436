"""One host to act on, local or over SSH: commands, file writes and error translation in one place.

Tasks are written against this wrapper of an Invoke ``Context`` or a Fabric ``Connection`` so the same
task builds an image on the local machine or on a remote KVM host.
"""

from __future__ import annotations

import base64
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import paramiko
from fabric import Connection
from invoke import Context
from invoke.runners import Result

from osfleet.errors import CommandFailedError, DiskFullError, HostUnreachableError, MissingToolError

HEARTBEAT_SECONDS = 30.0
# How long a local command stopped by Ctrl-C gets to exit on SIGTERM before its whole process group is killed.
STOP_GRACE_SECONDS = 5.0

# Tools each operation needs on the host, with the Debian package that provides them.
TOOL_PACKAGES = {
    "debootstrap": "debootstrap",
    "qemu-img": "qemu-utils",
    "mkfs.ext4": "e2fsprogs",
    "busybox": "busybox-static",
    "cpio": "cpio",
    "gzip": "gzip",
    "chroot": "coreutils",
    "sha256sum": "coreutils",
    "flock": "util-linux",
    "virsh": "libvirt-clients",
    "qemu-system-x86_64": "qemu-system-x86",
}


class Host:
    """A host reached through ``c``; every failure surfaces as an ``OsfleetError`` with one line."""

    def __init__(self, c: Context | Connection, echo: bool = True) -> None:
        self.c = c
        self.echo = echo
        self.name = f"{c.user}@{c.host}:{c.port}" if isinstance(c, Connection) else "localhost"
        self.remote = isinstance(c, Connection)

    def run(self, command: str, *, timeout: float | None = None, what: str | None = None) -> str:
        """Run ``command``; return stdout, or raise with the command's own last error line."""
        result = self._run(command, timeout=timeout)
        if result.exited != 0:
            text = (result.stderr.strip() or result.stdout.strip()).splitlines()
            last = text[-1] if text else f"exit status {result.exited}"
            if "No space left on device" in result.stderr + result.stdout:
                raise DiskFullError(f"{self.name}: disk full during {what or command.split()[0]}")
            raise CommandFailedError(f"{self.name}: {what or command.split()[0]} failed: {last}")
        return str(result.stdout)

    def probe(self, command: str, timeout: float | None = None) -> bool:
        """True when ``command`` succeeds; for checks that branch instead of failing."""
        return self._run(command, timeout=timeout).exited == 0

    def _run(self, command: str, timeout: float | None) -> Result:
        if not self.remote:
            return _run_local(command, timeout)
        try:
            result = self.c.run(command, hide=True, warn=True, timeout=timeout, in_stream=False)
        except (
            paramiko.ssh_exception.NoValidConnectionsError,
            paramiko.AuthenticationException,
            paramiko.SSHException,
            socket.gaierror,
            TimeoutError,
            OSError,
        ) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise HostUnreachableError(f"cannot reach host {self.name}: {reason}") from None
        if result is None:
            raise CommandFailedError(f"{self.name}: {command.split()[0]} did not run")
        return result

    def stop_strays(self, tree: str) -> None:
        """End what a command interrupted over SSH left running in ``tree`` (a build's work tree), before the
        tree is removed: Fabric does not stop a remote command when we are interrupted (it has no terminal to
        send ^C to), and a ``debootstrap`` or ``apt-get`` would go on writing into it. Found by command line or
        by a root or working directory inside the tree (chroot'ed package scripts); SIGTERM, then SIGKILL.
        Locally each command's whole process group is already ended when interrupted."""
        if not self.remote:
            return
        t = shlex.quote(tree.rstrip("/"))
        find = (
            f't={t}; for p in /proc/[0-9]*; do n=${{p#/proc/}}; [ "$n" = $$ ] && continue; '
            'for l in root cwd; do case "$(readlink "$p/$l" 2>/dev/null)/" in "$t"/*) echo "$n"; break;; esac; done; '
            'tr "\\0" " " < "$p/cmdline" 2>/dev/null | grep -qF -- "$t/" && echo "$n"; done | sort -u'
        )
        self.probe(
            f'pids=$({find}); [ -z "$pids" ] || {{ kill -TERM $pids; sleep 2; kill -KILL $pids; }} 2>/dev/null; true'
        )

    def start(self, command: str) -> Running:
        """Start ``command`` on the host and return while it runs: its stdout is read line by line, and closing
        its stdin (``Running.finish``) is how it is told to end. If this process dies, its end of the pipe (or of
        the SSH channel) closes with it, so a command that waits for the end of its input never outlives us
        (``build_lock`` holds a lock this way)."""
        if not self.remote:
            return _LocalRunning(command)
        try:
            self.c.open()
            transport = self.c.client.get_transport()
            if transport is None:
                raise paramiko.SSHException("no SSH transport")
            channel = transport.open_session()
            channel.exec_command(command)
        except (paramiko.SSHException, socket.gaierror, TimeoutError, OSError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise HostUnreachableError(f"cannot reach host {self.name}: {reason}") from None
        return _RemoteRunning(channel)

    def require_tools(self, tools: list[str]) -> None:
        for tool in tools:
            if not self.probe(f"command -v {shlex.quote(tool)} >/dev/null"):
                raise MissingToolError(tool, TOOL_PACKAGES.get(tool), where=self.name)

    def write_file(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write a small text file on the host (base64 in the command line: same path locally and over SSH)."""
        data = base64.b64encode(text.encode()).decode()
        q = shlex.quote(path)
        self.run(f"echo {data} | base64 -d > {q} && chmod {mode:o} {q}", what=f"writing {path}")

    def read_file(self, path: str) -> str:
        return self.run(f"cat {shlex.quote(path)}", what=f"reading {path}")

    def exists(self, path: str) -> bool:
        return self.probe(f"test -e {shlex.quote(path)}")

    def free_bytes(self, path: str) -> int:
        """Free bytes on the filesystem that holds ``path`` (or its nearest existing parent)."""
        q = shlex.quote(path)
        out = self.run(f'p={q}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; df -B1 --output=avail "$p"')
        return int(out.split()[-1])

    def require_free(self, path: str, needed: int, what: str) -> None:
        free = self.free_bytes(path)
        if free < needed:
            raise DiskFullError(
                f"{self.name}: not enough free disk for {what} at {path}: "
                f"{free / 2**30:.2f} GiB free, {needed / 2**30:.2f} GiB needed"
            )

    def put(self, local: Path, remote: str) -> None:
        """Copy a local file to the host (a plain copy when the host is this machine)."""
        if self.remote:
            try:
                self.c.put(str(local), remote)
            except OSError as exc:
                if "No space left" in str(exc) or getattr(exc, "errno", None) == 28:
                    raise DiskFullError(f"{self.name}: disk full while copying {local.name}") from None
                raise CommandFailedError(f"{self.name}: copying {local} failed: {exc}") from None
        else:
            self.run(f"cp {shlex.quote(str(local))} {shlex.quote(remote)}", what=f"copying {local.name}")

    def get(self, remote: str, local: Path) -> None:
        if self.remote:
            self.c.get(remote, str(local))
        else:
            self.run(f"cp {shlex.quote(remote)} {shlex.quote(str(local))}", what=f"copying {remote}")

    def say(self, message: str) -> None:
        if self.echo:
            print(message, flush=True)

    @contextmanager
    def step(self, index: int, total: int, title: str) -> Iterator[None]:
        """Announce a long step, print a heartbeat while it runs, and its duration when done."""
        self.say(f"[{index}/{total}] {title} ...")
        start = time.monotonic()
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(HEARTBEAT_SECONDS):
                self.say(f"      ... {title}: {time.monotonic() - start:.0f} s")

        ticker = threading.Thread(target=beat, daemon=True)
        if self.echo:
            ticker.start()
        try:
            yield
        finally:
            stop.set()
        self.say(f"      done in {time.monotonic() - start:.1f} s")


class Running:
    """A command started by ``Host.start`` that runs until it ends or is told to (its stdin closed)."""

    stderr = ""  # what it wrote to stderr, once ``finish`` has returned

    def readline(self) -> str:
        """The command's next line of output, or ``""`` once it has closed its output."""
        raise NotImplementedError

    def finish(self) -> int:
        """Close the command's stdin and wait for it to exit; its exit status (``stderr`` is then known)."""
        raise NotImplementedError

    def stop(self) -> None:
        """End the command now, whatever it is doing (we were interrupted)."""
        raise NotImplementedError

    def last_error(self) -> str:
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else ""


class _LocalRunning(Running):
    def __init__(self, command: str) -> None:
        self.proc = _start_group(command, subprocess.PIPE)

    def readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def finish(self) -> int:
        try:
            _, self.stderr = self.proc.communicate()  # closes its stdin, reads the rest, waits
        except BaseException:
            self.stop()
            raise
        return self.proc.returncode

    def stop(self) -> None:
        _end_group(self.proc)
        if self.proc.stdin is not None:
            with suppress(OSError):
                self.proc.stdin.close()


class _RemoteRunning(Running):
    """Over SSH: sshd closes the command's stdin when the channel closes or the connection drops."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self.channel = channel
        self.out = channel.makefile("r")

    def readline(self) -> str:
        return _text(self.out.readline())

    def finish(self) -> int:
        try:
            self.channel.shutdown_write()
            status = self.channel.recv_exit_status()
            self.stderr = _text(self.channel.makefile_stderr("r").read())
        finally:
            self.channel.close()
        return int(status)

    def stop(self) -> None:
        self.channel.close()  # a command still waiting on the host ends at its own timeout (``build_lock``)


def _text(data: str | bytes) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _run_local(command: str, timeout: float | None) -> Result:
    """Run ``command`` on this machine in a process group of its own, and end that whole group when the caller is
    interrupted or the timeout passes, before returning or re-raising.

    Why not Invoke's local runner: on Ctrl-C it only writes ``\\x03`` to the command's stdin (a pipe, so nothing),
    and an interrupt that lands inside ``Popen``, after its fork, loses the child's pid. Either way a build's
    clean-up (``rm -rf`` of its work tree) raced a ``debootstrap`` that went on writing into that tree (CI: an
    interrupted build left its work tree behind; here 1 build in 8 interrupted right after it started)."""
    proc: subprocess.Popen[str] | None = None
    try:
        proc = _start_group(command, subprocess.DEVNULL)
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException as exc:  # interrupted, past its timeout, or never started: nothing of it runs on
        if proc is not None:
            _end_group(proc)
        if isinstance(exc, subprocess.TimeoutExpired):
            raise CommandFailedError(f"localhost: {command.split()[0]} did not finish within {timeout:.0f} s") from None
        if isinstance(exc, OSError):  # no shell to start it with (an exec that failed), or its pipes broke
            raise CommandFailedError(f"localhost: cannot run {command.split()[0]}: {exc.strerror or exc}") from None
        raise
    return Result(stdout=stdout, stderr=stderr, exited=proc.returncode, command=command)


def _start_group(command: str, stdin: int) -> subprocess.Popen[str]:
    """Start ``command`` under bash in a process group of its own (ours to end; a terminal's Ctrl-C reaches us,
    not it). A Ctrl-C that arrives while it starts is held until its pid is known, then the whole group is ended
    before the interrupt goes on: nothing is left running unseen."""
    proc: subprocess.Popen[str] | None = None
    try:
        with _signals_held():
            proc = subprocess.Popen(
                ["/bin/bash", "-c", command],
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                start_new_session=True,
            )
    except BaseException:
        if proc is not None:
            _end_group(proc)
            if proc.stdin is not None:
                proc.stdin.close()
        raise
    return proc


_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP while a child starts, then handle them as before: their Python handlers
    (which raise ``KeyboardInterrupt``) run only in the main thread, between two steps of ``Popen`` otherwise.
    Elsewhere than in the main thread nothing can interrupt, and nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in _HELD_SIGNALS}
    held: list[int] = []
    for sig, handler in before.items():
        if handler is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(sig, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:
                signal.signal(sig, handler)
        for signum in held:
            handler = before[signal.Signals(signum)]
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)


def _end_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to the command's group, SIGKILL to whatever is left after a grace period; returns once the
    command has exited, so nothing it started writes after the caller's clean-up."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(STOP_GRACE_SECONDS)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # children that outlived the shell still hold the group id
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe:
                pipe.close()
