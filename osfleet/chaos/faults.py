"""Fault injectors: one function per kind of fault, each by its own real mechanism.

Every injector returns a ``Fault`` record (kind, target, when, what it did and how to undo it). Faults the
fleet heals by itself (a killed QEMU, an unlinked overlay, a killed host agent: the recovery layers rebuild
or drain) have no undo; the others (a frozen QEMU, a filled store, a cut or delayed link) are healed with
``heal(fault)``, which is idempotent and safe when the target has gone away meanwhile.

Targets are named ``<host>/<replica>`` (``lab1/r-1a2b3c``) or ``<host>`` for host-wide faults; hosts are
``ChaosHost`` objects (``osfleet.chaos.hosts``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import psutil
from pydantic import BaseModel, Field, ValidationError

from osfleet.chaos.hosts import ChaosHost
from osfleet.errors import CommandFailedError, OsfleetError
from osfleet.lab.proc import run
from osfleet.replicas.records import ReplicaRecord

Kind = Literal[
    "kill_qemu", "freeze_qemu", "delete_overlay", "kill_host_agent", "fill_image_store", "cut_link", "delay_link"
]
KINDS: tuple[str, ...] = get_args(Kind)
REPLICA_KINDS = frozenset({"kill_qemu", "freeze_qemu", "delete_overlay"})
LINK_KINDS = frozenset({"cut_link", "delay_link"})

# Filling a filesystem: never below DEFAULT_FLOOR_BYTES free; on a filesystem bigger than SMALL_FS_BYTES
# (the machine's real disk, not one made for the fault) only with an explicit size bound, and never below
# SAFE_RESERVE_BYTES free.
DEFAULT_FLOOR_BYTES = 16 * 2**20
SMALL_FS_BYTES = 8 * 2**30
SAFE_RESERVE_BYTES = 4 * 2**30
FILL_CHUNK_BYTES = 64 * 2**20
FILLER_PREFIX = ".osfleet-chaos-fill-"
# The chains the fallbacks of cut_link and delay_link add inside a lab host's namespace, and the netfilter
# queue the delayer serves (queues are per network namespace, so one number serves every lab host).
CUT_CHAIN = "OSFLEET-CHAOS-CUT"
DELAY_CHAIN = "OSFLEET-CHAOS-DELAY"
DELAY_QUEUE = 7477
_DELAYER_READY_S = 10.0
_NETEM_MISSING = "qdisc kind is unknown"
_SIGNAL_WAIT_S = 5.0


class FaultError(OsfleetError):
    """A fault could not be injected or healed; the message names the target and the reason."""


# --- how each fault is undone ------------------------------------------------------------------------------
class Thaw(BaseModel):
    """SIGCONT to a process stopped with SIGSTOP (only if it is still the same process)."""

    action: Literal["sigcont"] = "sigcont"
    pid: int
    started: float  # the process's start time, so a reused pid is never signalled


class RemoveFile(BaseModel):
    action: Literal["unlink"] = "unlink"
    path: str


class DeleteQdisc(BaseModel):
    """``tc qdisc del dev <dev> root`` inside the namespace."""

    action: Literal["tc_qdisc_del"] = "tc_qdisc_del"
    netns: str
    dev: str


class DeleteChain(BaseModel):
    """Remove the jumps to ``chain`` for ``dev`` from INPUT/OUTPUT, then the chain, inside the namespace."""

    action: Literal["iptables_chain_del"] = "iptables_chain_del"
    netns: str
    dev: str
    chain: str


class StopDelayer(BaseModel):
    """Remove the NFQUEUE rules of ``chain`` inside the namespace, then SIGTERM the delayer process."""

    action: Literal["nfqueue_delayer_stop"] = "nfqueue_delayer_stop"
    netns: str
    dev: str
    chain: str
    pid: int
    started: float


Undo = Annotated[Thaw | RemoveFile | DeleteQdisc | DeleteChain | StopDelayer, Field(discriminator="action")]


class Fault(BaseModel):
    """One injected fault: what was hit, when, by which mechanism, and how it is undone (None: self-healing)."""

    id: str
    kind: Kind
    host: str
    replica: str | None = None
    target: str  # "lab1/r-1a2b3c" or "lab1"
    injected_at: float  # wall-clock seconds (time.time())
    mechanism: str  # "SIGKILL", "SIGSTOP", "unlink", "fallocate", "tc netem", "iptables DROP", "nfqueue delay"
    did: str  # one line: what the injector did
    undo: Undo | None = None
    healed_at: float | None = None
    healed: str | None = None  # one line: what the heal did
    details: dict[str, Any] = {}

    @property
    def self_healing(self) -> bool:
        return self.undo is None

    def line(self) -> str:
        """The fault as one JSON line (runs' ``faults.jsonl``)."""
        return self.model_dump_json()


def _new(kind: Kind, host: ChaosHost, replica: str | None, mechanism: str, did: str, **kw: Any) -> Fault:
    return Fault(
        id=f"f-{secrets.token_hex(4)}",
        kind=kind,
        host=host.name,
        replica=replica,
        target=f"{host.name}/{replica}" if replica else host.name,
        injected_at=time.time(),
        mechanism=mechanism,
        did=did,
        **kw,
    )


# --- finding targets ---------------------------------------------------------------------------------------
def replica_record(host: ChaosHost, replica: str) -> ReplicaRecord:
    """The replica's record on ``host`` (``$OSFLEET_HOME/replicas/<id>.json``)."""
    path = host.replicas_dir / f"{replica}.json"
    try:
        return ReplicaRecord.model_validate(json.loads(path.read_text()))
    except FileNotFoundError:
        raise FaultError(f"no replica {host.name}/{replica} (no record {path})") from None
    except (OSError, ValueError, ValidationError) as exc:
        raise FaultError(f"unreadable record of {host.name}/{replica}: {str(exc).splitlines()[0]}") from None


def replica_records(host: ChaosHost) -> list[ReplicaRecord]:
    """Every readable record on ``host`` (unreadable ones are skipped)."""
    out = []
    for path in sorted(host.replicas_dir.glob("*.json")) if host.replicas_dir.exists() else []:
        with contextlib.suppress(OSError, ValueError, ValidationError):
            out.append(ReplicaRecord.model_validate(json.loads(path.read_text())))
    return out


QemuPidOf = Callable[[ChaosHost, ReplicaRecord], int]


def libvirt_qemu_pid(host: ChaosHost, record: ReplicaRecord) -> int:
    """The QEMU pid of the record's domain, from libvirt's pid file, checked to be that domain's QEMU."""
    from osfleet.vm.virt import Virt

    where = f"{host.name}/{record.id}"
    if not record.domain:
        raise FaultError(f"{where} has no domain (state {record.state})")
    with Virt(host.libvirt_uri) as virt:
        pid = virt.qemu_pid(record.domain)
    if pid is None:
        raise FaultError(f"{where}: domain {record.domain} is not running (no live QEMU in libvirt's pid file)")
    try:
        cmdline = psutil.Process(pid).cmdline()
    except psutil.Error:
        raise FaultError(f"{where}: QEMU pid {pid} of {record.domain} went away") from None
    if not any(f"guest={record.domain}" in arg for arg in cmdline):
        raise FaultError(f"{where}: pid {pid} from libvirt's pid file is not the QEMU of {record.domain}")
    return pid


def _started(pid: int, what: str) -> float:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        raise FaultError(f"{what}: process {pid} is gone") from None


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait(predicate: Callable[[], bool], timeout: float = _SIGNAL_WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _signal(pid: int, sig: signal.Signals, what: str) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        raise FaultError(f"{what}: process {pid} is gone") from None
    except PermissionError:
        raise FaultError(f"{what}: not allowed to signal process {pid} (run as root)") from None


# --- replica faults ----------------------------------------------------------------------------------------
def kill_qemu(host: ChaosHost, replica: str, pid_of: QemuPidOf = libvirt_qemu_pid) -> Fault:
    """SIGKILL the replica's QEMU (found from its record's domain through libvirt's pid file).

    Self-healing: the host agent's monitor sees the domain gone and rebuilds the replica.
    """
    record = replica_record(host, replica)
    pid = pid_of(host, record)
    what = f"kill_qemu {host.name}/{replica}"
    _signal(pid, signal.SIGKILL, what)
    if not _wait(lambda: _gone(pid)):
        raise FaultError(f"{what}: QEMU pid {pid} still runs {_SIGNAL_WAIT_S:.0f} s after SIGKILL")
    return _new(
        "kill_qemu", host, replica, "SIGKILL", f"SIGKILL to QEMU pid {pid} of {record.domain}",
        details={"pid": pid, "domain": record.domain},
    )  # fmt: skip


def freeze_qemu(host: ChaosHost, replica: str, pid_of: QemuPidOf = libvirt_qemu_pid) -> Fault:
    """SIGSTOP the replica's QEMU: the guest, its agent and QEMU's monitor all hang until ``heal`` (SIGCONT)."""
    record = replica_record(host, replica)
    pid = pid_of(host, record)
    what = f"freeze_qemu {host.name}/{replica}"
    started = _started(pid, what)
    _signal(pid, signal.SIGSTOP, what)
    if not _wait(lambda: _stopped(pid)):
        _signal(pid, signal.SIGCONT, what)
        raise FaultError(f"{what}: QEMU pid {pid} did not stop after SIGSTOP")
    return _new(
        "freeze_qemu", host, replica, "SIGSTOP", f"SIGSTOP to QEMU pid {pid} of {record.domain}",
        undo=Thaw(pid=pid, started=started), details={"pid": pid, "domain": record.domain},
    )  # fmt: skip


def _stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.NoSuchProcess:
        return False


def delete_overlay(host: ChaosHost, replica: str, pid_of: QemuPidOf = libvirt_qemu_pid) -> Fault:
    """Unlink the replica's own top overlay while its QEMU runs (QEMU keeps writing to the open, nameless file).

    Self-healing: the next reset or rebuild finds the overlay gone and makes the replica anew. The file
    cannot be given its name back, so there is no undo.
    """
    record = replica_record(host, replica)
    what = f"delete_overlay {host.name}/{replica}"
    if not record.disk:
        raise FaultError(f"{what}: the record names no overlay (state {record.state})")
    pid = pid_of(host, record)  # only while it runs
    disk = Path(record.disk)
    try:
        size = disk.stat().st_blocks * 512
        disk.unlink()
    except FileNotFoundError:
        raise FaultError(f"{what}: overlay {disk} is already gone") from None
    except OSError as exc:
        raise FaultError(f"{what}: cannot unlink {disk}: {exc.strerror}") from None
    return _new(
        "delete_overlay", host, replica, "unlink", f"unlinked overlay {disk} while QEMU pid {pid} runs",
        details={"path": str(disk), "allocated_bytes": size, "pid": pid},
    )  # fmt: skip


# --- host faults -------------------------------------------------------------------------------------------
def host_agent_pids(host: ChaosHost) -> list[int]:
    """Live processes that manage replicas on ``host`` (records' ``owner_pid``), started before they wrote
    those records (the record file's modification time), so a pid reused by a newer process is never taken
    for the agent."""
    last_write: dict[int, float] = {}
    for path in sorted(host.replicas_dir.glob("*.json")) if host.replicas_dir.exists() else []:
        try:
            record = ReplicaRecord.model_validate(json.loads(path.read_text()))
            written = path.stat().st_mtime
        except (OSError, ValueError, ValidationError):
            continue
        if record.owner_pid > 0 and record.owner_pid != os.getpid():
            last_write[record.owner_pid] = max(last_write.get(record.owner_pid, 0.0), written)
    pids = []
    for pid, written in sorted(last_write.items()):
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE and p.create_time() <= written + 1.0:
                pids.append(pid)
        except psutil.Error:
            continue
    return pids


def kill_host_agent(host: ChaosHost, pid: int | None = None) -> Fault:
    """SIGKILL the host's agent: ``pid``, or the one live process its replica records name as their owner.

    Self-healing at the fleet level: the gateway drains the host; a supervisor (or the bench) restarts the
    agent, which adopts the replicas from their records.
    """
    what = f"kill_host_agent {host.name}"
    if pid is None:
        pids = host_agent_pids(host)
        if not pids:
            raise FaultError(f"{what}: no live process owns replicas in {host.replicas_dir}")
        if len(pids) > 1:
            raise FaultError(f"{what}: several processes own replicas ({', '.join(map(str, pids))}); give a pid")
        pid = pids[0]
    try:
        name = psutil.Process(pid).name()
    except psutil.Error:
        raise FaultError(f"{what}: process {pid} is gone") from None
    _signal(pid, signal.SIGKILL, what)
    if not _wait(lambda: _gone(pid)):
        raise FaultError(f"{what}: pid {pid} still runs {_SIGNAL_WAIT_S:.0f} s after SIGKILL")
    return _new(
        "kill_host_agent", host, None, "SIGKILL", f"SIGKILL to host agent pid {pid} ({name})", details={"pid": pid}
    )


def fill_image_store(
    host: ChaosHost,
    floor_bytes: int = DEFAULT_FLOOR_BYTES,
    max_bytes: int | None = None,
    directory: Path | None = None,
) -> Fault:
    """Fill the filesystem of the host's image store (or its OSFLEET_HOME when it has no store yet, or
    ``directory``: e.g. its replicas folder when that is on another file system) with one filler file until
    ``floor_bytes`` stay free; ``heal`` removes the file.

    Free space is what ``df`` calls available (``f_bavail``); root can still write into an ext4 file
    system's reserved blocks, so give a host a store it can really fill: a small loop file system
    (``truncate -s 1G f && mkfs.ext4 -q -m 0 f && mount -o loop f <home>/images``) or a tmpfs
    (``mount -t tmpfs -o size=1g tmpfs <home>/images``). A file system bigger than 8 GiB (this machine's real
    disk) is filled only with ``max_bytes`` given, and never below 4 GiB free. Blocks are reserved with
    ``fallocate`` in 64 MiB steps, so even a large fill takes well under a second.
    """
    where = directory or (host.image_store if host.image_store.is_dir() else host.home)
    what = f"fill_image_store {host.name}"
    try:
        st = os.statvfs(where)
    except OSError as exc:
        raise FaultError(f"{what}: cannot stat {where}: {exc.strerror}") from None
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    want = free - floor_bytes
    if total > SMALL_FS_BYTES:
        if max_bytes is None:
            raise FaultError(
                f"{what}: {where} is on a {total / 2**30:.0f} GiB file system (the real disk?): give a size bound, "
                f"or mount a small file system for the host's store (see 'osfleet chaos inject --help')"
            )
        want = min(want, free - SAFE_RESERVE_BYTES)
    if max_bytes is not None:
        want = min(want, max_bytes)
    if want <= 0:
        raise FaultError(
            f"{what}: {where} has {free / 2**20:.0f} MiB free; nothing to fill above the floor "
            f"({max(floor_bytes, SAFE_RESERVE_BYTES if total > SMALL_FS_BYTES else 0) / 2**20:.0f} MiB)"
        )
    fid = f"f-{secrets.token_hex(4)}"
    path = where / f"{FILLER_PREFIX}{fid}"
    written = _reserve(path, want)
    after = os.statvfs(where).f_bavail * st.f_frsize
    fault = _new(
        "fill_image_store", host, None, "fallocate",
        f"filler {path}: {written / 2**20:.0f} MiB, {after / 2**20:.0f} MiB left free of {total / 2**20:.0f} MiB",
        undo=RemoveFile(path=str(path)),
        details={"path": str(path), "bytes": written, "free_before": free, "free_after": after, "fs_bytes": total},
    )  # fmt: skip
    return fault.model_copy(update={"id": fid})


def _reserve(path: Path, size: int) -> int:
    """Allocate ``size`` bytes to a new file (fallocate, zeros where unsupported); stops early when full."""
    done = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while done < size:
            step = min(FILL_CHUNK_BYTES, size - done)
            try:
                os.posix_fallocate(fd, done, step)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    break
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise FaultError(f"filling {path}: {exc.strerror}") from None
                try:
                    os.pwrite(fd, b"\0" * step, done)
                except OSError as wexc:
                    if wexc.errno in (errno.ENOSPC, errno.EDQUOT):
                        break
                    raise FaultError(f"filling {path}: {wexc.strerror}") from None
            done += step
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    return done


# --- link faults (lab hosts) -------------------------------------------------------------------------------
def _in_ns(host: ChaosHost, argv: list[str], what: str) -> str:
    assert host.netns is not None
    return run(["ip", "netns", "exec", host.netns, *argv], what)


def _link(host: ChaosHost, kind: str) -> tuple[str, str]:
    if not host.netns or not host.link:
        raise FaultError(f"{kind} {host.name}: only lab hosts have a link to cut or delay (osfleet lab up)")
    return host.netns, host.link


def _netem(host: ChaosHost, kind: str, params: list[str]) -> DeleteQdisc | None:
    """Add a root netem qdisc on the host's link end inside its namespace; None when the kernel has no netem."""
    netns, dev = _link(host, kind)
    try:
        _in_ns(host, ["tc", "qdisc", "add", "dev", dev, "root", "netem", *params], f"{kind} {host.name}")
    except CommandFailedError as exc:
        if _NETEM_MISSING in str(exc):
            return None
        raise FaultError(str(exc)) from None
    return DeleteQdisc(netns=netns, dev=dev)


def netem_available(host: ChaosHost) -> bool:
    """True when ``tc ... netem`` works in the host's namespace (the kernel has sch_netem)."""
    undo = _netem(host, "netem probe", ["delay", "0ms"])
    if undo is None:
        return False
    _heal_qdisc(undo)
    return True


def cut_link(host: ChaosHost, mechanism: Literal["auto", "netem", "iptables"] = "auto") -> Fault:
    """Drop every packet on the lab host's link: ``tc netem loss 100%`` on its end inside its namespace.

    Kernels without sch_netem (``CONFIG_NET_SCH_NETEM`` unset, as on the machine this was written on) get
    the same effect from iptables DROP rules for that interface inside the namespace (``auto``); the fault
    record names the mechanism used. ``heal`` removes the qdisc or the rules.
    """
    netns, dev = _link(host, "cut_link")
    if mechanism in ("auto", "netem"):
        undo = _netem(host, "cut_link", ["loss", "100%"])
        if undo is not None:
            return _new(
                "cut_link", host, None, "tc netem", f"netem loss 100% on {dev} in {netns}",
                undo=undo, details={"netns": netns, "dev": dev},
            )  # fmt: skip
        if mechanism == "netem":
            raise FaultError(f"cut_link {host.name}: this kernel has no sch_netem (CONFIG_NET_SCH_NETEM unset)")
    chain = CUT_CHAIN
    what = f"cut_link {host.name}"
    try:
        _in_ns(host, ["iptables", "-w", "-N", chain], what)
    except CommandFailedError as exc:
        raise FaultError(f"{what}: {exc} (is the link already cut?)") from None
    undo_chain = DeleteChain(netns=netns, dev=dev, chain=chain)
    try:
        _in_ns(host, ["iptables", "-w", "-A", chain, "-j", "DROP"], what)
        _in_ns(host, ["iptables", "-w", "-I", "INPUT", "-i", dev, "-j", chain], what)
        _in_ns(host, ["iptables", "-w", "-I", "OUTPUT", "-o", dev, "-j", chain], what)
    except CommandFailedError as exc:
        _heal_chain(undo_chain)
        raise FaultError(str(exc)) from None
    return _new(
        "cut_link", host, None, "iptables DROP", f"iptables DROP of all traffic on {dev} in {netns} (no sch_netem)",
        undo=undo_chain, details={"netns": netns, "dev": dev},
    )  # fmt: skip


def delay_link(
    host: ChaosHost, delay_ms: int = 200, jitter_ms: int = 0, mechanism: Literal["auto", "netem", "nfqueue"] = "auto"
) -> Fault:
    """Delay every packet the lab host sends on its link by ``delay_ms`` (tc netem delay on its end inside its
    namespace), so each round trip through the link takes that much longer.

    Kernels without sch_netem get the same from a packet delayer (``osfleet.chaos.delayer``) started in the
    namespace on an NFQUEUE that an iptables rule feeds with the link's outgoing packets (``auto``; the rule
    has ``--queue-bypass``, so packets pass undelayed if the delayer dies). ``heal`` removes the qdisc, or the
    rules and then the delayer.
    """
    if delay_ms <= 0:
        raise FaultError("delay_link: the delay must be a positive number of milliseconds")
    netns, dev = _link(host, "delay_link")
    details = {"netns": netns, "dev": dev, "delay_ms": delay_ms, "jitter_ms": jitter_ms}
    if mechanism in ("auto", "netem"):
        params = ["delay", f"{delay_ms}ms"] + ([f"{jitter_ms}ms"] if jitter_ms else [])
        undo = _netem(host, "delay_link", params)
        if undo is not None:
            return _new(
                "delay_link", host, None, "tc netem", f"netem delay {delay_ms} ms on {dev} in {netns}",
                undo=undo, details=details,
            )  # fmt: skip
        if mechanism == "netem":
            raise FaultError(f"delay_link {host.name}: this kernel has no sch_netem (CONFIG_NET_SCH_NETEM unset)")
    if jitter_ms:
        raise FaultError(f"delay_link {host.name}: jitter needs sch_netem, which this kernel does not have")
    undo_delayer = _start_delayer(host, netns, dev, delay_ms)
    return _new(
        "delay_link", host, None, "nfqueue delay",
        f"NFQUEUE delayer pid {undo_delayer.pid} holds each packet {delay_ms} ms on {dev} in {netns} (no sch_netem)",
        undo=undo_delayer, details={**details, "pid": undo_delayer.pid},
    )  # fmt: skip


def _start_delayer(host: ChaosHost, netns: str, dev: str, delay_ms: int) -> StopDelayer:
    """Start the delayer detached (``setsid -f``: not our child, so it outlives a CLI call) and wait until it
    has bound the queue; then send the link's outgoing packets to that queue."""
    what = f"delay_link {host.name}"
    argv = ["setsid", "-f", "ip", "netns", "exec", netns, sys.executable, "-m", "osfleet.chaos.delayer"]
    argv += ["--queue", str(DELAY_QUEUE), "--delay-ms", str(delay_ms)]
    try:
        _in_ns(host, ["iptables", "-w", "-N", DELAY_CHAIN], what)
    except CommandFailedError as exc:
        raise FaultError(f"{what}: {exc} (is the link already delayed?)") from None
    undo = StopDelayer(netns=netns, dev=dev, chain=DELAY_CHAIN, pid=0, started=0.0)
    try:
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL) as p:
            assert p.stdout is not None
            ready, _, _ = select.select([p.stdout], [], [], _DELAYER_READY_S)
            line = p.stdout.readline().decode().strip() if ready else ""
        words = line.split()
        if len(words) != 2 or words[0] != "ready":
            raise FaultError(f"{what}: the packet delayer did not start: {line or 'no answer'}")
        pid = int(words[1])
        undo = undo.model_copy(update={"pid": pid, "started": _started(pid, what)})
        rule = ["-j", "NFQUEUE", "--queue-num", str(DELAY_QUEUE), "--queue-bypass"]
        _in_ns(host, ["iptables", "-w", "-A", DELAY_CHAIN, *rule], what)
        _in_ns(host, ["iptables", "-w", "-I", "OUTPUT", "-o", dev, "-j", DELAY_CHAIN], what)
    except BaseException as exc:
        _heal_delayer(undo)
        if isinstance(exc, CommandFailedError):
            raise FaultError(str(exc)) from None
        raise
    return undo


# --- healing -----------------------------------------------------------------------------------------------
def heal(fault: Fault) -> Fault:
    """Undo ``fault`` and return it with ``healed_at`` and what was done; a self-healing fault is returned
    as it is. Safe to call twice, and when the target is already gone."""
    if fault.undo is None or fault.healed_at is not None:
        return fault
    u = fault.undo
    if isinstance(u, Thaw):
        note = _heal_thaw(u)
    elif isinstance(u, RemoveFile):
        note = _heal_file(u)
    elif isinstance(u, DeleteQdisc):
        note = _heal_qdisc(u)
    elif isinstance(u, DeleteChain):
        note = _heal_chain(u)
    else:
        note = _heal_delayer(u)
    return fault.model_copy(update={"healed_at": time.time(), "healed": note})


def _heal_thaw(u: Thaw) -> str:
    try:
        p = psutil.Process(u.pid)
        if abs(p.create_time() - u.started) > 0.01:
            return f"pid {u.pid} is another process now; nothing to thaw"
        p.send_signal(signal.SIGCONT)
    except psutil.NoSuchProcess:
        return f"process {u.pid} is gone; nothing to thaw"
    except psutil.Error as exc:
        raise FaultError(f"cannot thaw pid {u.pid}: {exc}") from None
    return f"SIGCONT to pid {u.pid}"


def _heal_file(u: RemoveFile) -> str:
    path = Path(u.path)
    try:
        size = path.stat().st_blocks * 512
        path.unlink()
    except FileNotFoundError:
        return f"{path} is already gone"
    except OSError as exc:
        raise FaultError(f"cannot remove filler {path}: {exc.strerror}") from None
    return f"removed {path} ({size / 2**20:.0f} MiB)"


def _heal_qdisc(u: DeleteQdisc) -> str:
    try:
        run(["ip", "netns", "exec", u.netns, "tc", "qdisc", "del", "dev", u.dev, "root"], f"healing {u.dev}")
    except CommandFailedError as exc:
        if _netns_gone(u.netns) or "handle of zero" in str(exc) or "Cannot find device" in str(exc):
            return f"no qdisc on {u.dev} in {u.netns} any more"
        raise FaultError(str(exc)) from None
    return f"deleted the netem qdisc on {u.dev} in {u.netns}"


def _heal_chain(u: DeleteChain) -> str:
    if _netns_gone(u.netns):
        return f"namespace {u.netns} is gone"
    ns = ["ip", "netns", "exec", u.netns, "iptables", "-w"]
    for rule in (["INPUT", "-i", u.dev], ["OUTPUT", "-o", u.dev]):
        # a rule added twice (never by us) would need two deletions; loop until it is gone
        for _ in range(8):
            try:
                run([*ns, "-D", rule[0], *rule[1:], "-j", u.chain], f"healing {u.dev}")
            except CommandFailedError:
                break
    for flag in ("-F", "-X"):
        try:
            run([*ns, flag, u.chain], f"healing {u.dev}")
        except CommandFailedError as exc:
            if "No chain" in str(exc) or "does not exist" in str(exc):
                return f"no {u.chain} chain in {u.netns} any more"
            raise FaultError(str(exc)) from None
    return f"removed the {u.chain} rules on {u.dev} in {u.netns}"


def _heal_delayer(u: StopDelayer) -> str:
    rules = _heal_chain(DeleteChain(netns=u.netns, dev=u.dev, chain=u.chain))
    if u.pid <= 0:
        return rules
    try:
        p = psutil.Process(u.pid)
        if abs(p.create_time() - u.started) > 0.01:
            return f"{rules}; the delayer (pid {u.pid}) was gone"
        p.terminate()
        if not _wait(lambda: _gone(u.pid)):
            p.kill()
            _wait(lambda: _gone(u.pid))
        with contextlib.suppress(psutil.Error, ChildProcessError):
            p.wait(timeout=0)  # reap it when it is ours
    except psutil.NoSuchProcess:
        return f"{rules}; the delayer (pid {u.pid}) was gone"
    return f"{rules}; stopped the delayer (pid {u.pid})"


def _netns_gone(netns: str) -> bool:
    return not Path("/run/netns", netns).exists()


# --- faults not yet healed, kept on disk so a later command (or a crashed run's successor) can heal them ----
class ActiveFaults:
    """Faults with an undo that are not healed yet, one JSON file each in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def save(self, fault: Fault) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{fault.id}.tmp"
        tmp.write_text(fault.model_dump_json(indent=2))
        tmp.replace(self.dir / f"{fault.id}.json")

    def remove(self, fault_id: str) -> None:
        (self.dir / f"{fault_id}.json").unlink(missing_ok=True)

    def all(self) -> list[Fault]:
        out = []
        for path in sorted(self.dir.glob("*.json")) if self.dir.exists() else []:
            try:
                out.append(Fault.model_validate_json(path.read_text()))
            except (OSError, ValidationError) as exc:
                raise FaultError(f"unreadable fault file {path}: {str(exc).splitlines()[0]}") from None
        return sorted(out, key=lambda f: f.injected_at)

    def get(self, fault_id: str) -> Fault:
        for f in self.all():
            if f.id == fault_id:
                return f
        raise FaultError(f"no active fault {fault_id} (see 'osfleet chaos ls')")

    def heal(self, fault: Fault) -> Fault:
        healed = heal(fault)
        self.remove(fault.id)
        return healed
