"""Fault injectors on real objects: real processes stand in for QEMU and host agents, a tmpfs for a host's
store, a namespace of the test's own for a lab link; one VM test freezes and kills a real replica's QEMU."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from osfleet.chaos import faults as F
from osfleet.chaos.hosts import ChaosHost, lab_hosts, local_host, resolve
from osfleet.chaos.runner import FAULTS_FILE, ChaosPlan, ChaosRunner, FaultSpec
from osfleet.config import Settings
from osfleet.lab.lab import _host, lab_root
from osfleet.lab.state import LabState, save
from osfleet.replicas.manager import ReplicaHost
from osfleet.replicas.records import RecordStore, ReplicaRecord, State
from osfleet.vm.images import GoldenImage
from osfleet.vm.virt import GuestAgentUnavailableError
from tests.conftest import VENV_BIN

OSFLEET = str(VENV_BIN / "osfleet")


# --- stand-ins ---------------------------------------------------------------------------------------------
@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; each is continued, killed and reaped at the end whatever happened."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.kill(p.pid, 18)  # SIGCONT, in case a test left it stopped
            p.kill()
        p.wait(timeout=10)


def sleeper(procs: list[subprocess.Popen[bytes]], stdin: object = None) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(["sleep", "300"], stdin=stdin)  # type: ignore[arg-type]
    procs.append(p)
    return p


def a_host(tmp_path: Path, name: str = "t1") -> ChaosHost:
    home = tmp_path / name
    (home / "replicas").mkdir(parents=True)
    return ChaosHost(name=name, home=home)


def add_replica(host: ChaosHost, rid: str, owner_pid: int = 0, disk: str = "", state: State = State.LEASED) -> None:
    now = time.time()
    RecordStore(host.replicas_dir).save(
        ReplicaRecord(
            id=rid,
            image="golden-x",
            mode="snapshot",
            state=state,
            domain=f"osfleet-t-r-{rid}-g1",
            disk=disk,
            owner_pid=owner_pid,
            created_at=now,
            updated_at=now,
        )  # fmt: skip
    )


def pid_of(p: subprocess.Popen[bytes]) -> F.QemuPidOf:
    return lambda _host, _record: p.pid


def status(pid: int) -> str:
    return str(psutil.Process(pid).status())


# --- replica faults ----------------------------------------------------------------------------------------
@pytest.mark.system
def test_kill_qemu_sigkills_the_process_and_records_it(tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    host = a_host(tmp_path)
    qemu = sleeper(procs)
    add_replica(host, "r-aa")
    before = time.time()
    fault = F.kill_qemu(host, "r-aa", pid_of(qemu))
    assert qemu.wait(timeout=5) == -9
    assert (fault.kind, fault.target, fault.mechanism, fault.undo) == ("kill_qemu", "t1/r-aa", "SIGKILL", None)
    assert fault.injected_at >= before and fault.details == {"pid": qemu.pid, "domain": "osfleet-t-r-r-aa-g1"}
    assert F.heal(fault) == fault  # self-healing: nothing to undo


@pytest.mark.system
def test_freeze_stops_until_healed_and_heal_is_idempotent(tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    host = a_host(tmp_path)
    qemu = sleeper(procs)
    add_replica(host, "r-bb")
    fault = F.freeze_qemu(host, "r-bb", pid_of(qemu))
    assert status(qemu.pid) == psutil.STATUS_STOPPED
    assert isinstance(fault.undo, F.Thaw) and fault.undo.pid == qemu.pid
    healed = F.heal(fault)
    assert status(qemu.pid) != psutil.STATUS_STOPPED
    assert healed.healed == f"SIGCONT to pid {qemu.pid}" and healed.healed_at is not None
    assert F.heal(healed) == healed
    # a frozen process that dies meanwhile: the heal says so instead of failing
    again = F.freeze_qemu(host, "r-bb", pid_of(qemu))
    qemu.kill()
    qemu.wait(timeout=5)
    assert F.heal(again).healed == f"process {qemu.pid} is gone; nothing to thaw"


@pytest.mark.system
def test_delete_overlay_unlinks_the_file_the_process_keeps_open(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    host = a_host(tmp_path)
    disk = host.home / "disk-g1.qcow2"
    disk.write_bytes(b"\0" * 65536)
    with open(disk, "rb") as f:
        qemu = sleeper(procs, stdin=f)
    add_replica(host, "r-cc", disk=str(disk))
    fault = F.delete_overlay(host, "r-cc", pid_of(qemu))
    assert not disk.exists()
    assert os.readlink(f"/proc/{qemu.pid}/fd/0") == f"{disk} (deleted)"
    assert fault.undo is None and fault.details["path"] == str(disk)
    with pytest.raises(F.FaultError, match="already gone"):
        F.delete_overlay(host, "r-cc", pid_of(qemu))


@pytest.mark.system
def test_unknown_replica_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(F.FaultError, match=r"^no replica t1/r-zz \(no record .*r-zz.json\)$"):
        F.kill_qemu(a_host(tmp_path), "r-zz")


# --- host faults -------------------------------------------------------------------------------------------
@pytest.mark.system
def test_kill_host_agent_finds_the_owner_of_the_records(tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    host = a_host(tmp_path)
    agent = sleeper(procs)
    add_replica(host, "r-1", owner_pid=agent.pid)
    add_replica(host, "r-2", owner_pid=agent.pid)
    assert F.host_agent_pids(host) == [agent.pid]
    fault = F.kill_host_agent(host)
    assert agent.wait(timeout=5) == -9
    assert (fault.kind, fault.target, fault.details) == ("kill_host_agent", "t1", {"pid": agent.pid})
    with pytest.raises(F.FaultError, match="no live process owns replicas"):
        F.kill_host_agent(host)


@pytest.mark.system
def test_a_process_younger_than_the_records_is_not_taken_for_their_owner(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    host = a_host(tmp_path)
    newcomer = sleeper(procs)  # as if the dead agent's pid had been reused
    add_replica(host, "r-1", owner_pid=newcomer.pid)
    written = time.time() - 60  # the record was written a minute before the newcomer started
    os.utime(host.replicas_dir / "r-1.json", (written, written))
    assert F.host_agent_pids(host) == []
    assert newcomer.poll() is None


@pytest.fixture
def small_store(tmp_path: Path) -> Iterator[ChaosHost]:
    """A host whose image store is a 64 MiB tmpfs (unmounted afterwards)."""
    host = a_host(tmp_path)
    host.image_store.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(host.image_store)], check=True)
    try:
        yield host
    finally:
        subprocess.run(["umount", str(host.image_store)], check=True)


@pytest.mark.system
def test_fill_leaves_the_floor_free_and_heal_gives_it_back(small_store: ChaosHost) -> None:
    host = small_store
    free = lambda: os.statvfs(host.image_store).f_bavail * os.statvfs(host.image_store).f_frsize  # noqa: E731
    before = free()
    fault = F.fill_image_store(host, floor_bytes=8 * 2**20)
    assert 8 * 2**20 - 2**20 <= free() <= 8 * 2**20
    path = Path(fault.details["path"])
    assert path.parent == host.image_store and path.stat().st_blocks * 512 == fault.details["bytes"]
    with pytest.raises(OSError, match="No space left"):
        (host.image_store / "more").write_bytes(b"\1" * 9 * 2**20)
    (host.image_store / "more").unlink()
    healed = F.heal(fault)
    assert free() == before and not path.exists()
    assert healed.healed is not None and healed.healed.startswith(f"removed {path}")
    assert F.heal(healed) == healed


@pytest.mark.system
def test_fill_of_a_big_file_system_needs_a_bound_and_keeps_the_reserve(tmp_path: Path) -> None:
    host = a_host(tmp_path)
    st = os.statvfs(tmp_path)
    if st.f_blocks * st.f_frsize <= F.SMALL_FS_BYTES:
        pytest.skip("the test's temporary directory is on a small file system")
    with pytest.raises(F.FaultError, match="give a size bound"):
        F.fill_image_store(host)
    fault = F.fill_image_store(host, max_bytes=2**20)
    assert fault.details["bytes"] == 2**20 and Path(fault.details["path"]).parent == host.home
    F.heal(fault)
    assert not Path(fault.details["path"]).exists()


# --- link faults on a namespace of the test's own ----------------------------------------------------------
NS = f"ochaos{os.getpid() % 100000}"


@pytest.fixture
def link_host(tmp_path: Path) -> Iterator[tuple[ChaosHost, str]]:
    """A namespace with a veth link on 198.18.77.0/30 (a benchmarking range) and a TCP echo server in it."""
    outside, inside = f"{NS}h", f"{NS}n"
    ip = lambda *a: subprocess.run(["ip", *a], check=True, capture_output=True)  # noqa: E731
    ip("netns", "add", NS)
    server = None
    try:
        ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        ip("link", "set", inside, "netns", NS)
        ip("addr", "add", "198.18.77.1/30", "dev", outside)
        ip("link", "set", outside, "up")
        ip("netns", "exec", NS, "ip", "addr", "add", "198.18.77.2/30", "dev", inside)
        ip("netns", "exec", NS, "ip", "link", "set", inside, "up")
        server = subprocess.Popen(["ip", "netns", "exec", NS, sys.executable, "-c", ECHO])
        assert round_trip(timeout=10) is not None, "echo server in the namespace did not answer"
        yield ChaosHost(name="t1", home=tmp_path, netns=NS, link=inside), inside
    finally:
        if server is not None:
            server.kill()
            server.wait(timeout=10)
        subprocess.run(["ip", "link", "delete", outside], capture_output=True)
        subprocess.run(["ip", "netns", "delete", NS], check=True)


ECHO = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("198.18.77.2", 7007)); s.listen()
while True:
    c, _ = s.accept(); c.sendall(c.recv(16)); c.close()
"""


def round_trip(timeout: float) -> float | None:
    """Seconds for one connect + echo to the namespace, or None when nothing answered within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        start = time.monotonic()
        try:
            with socket.create_connection(("198.18.77.2", 7007), timeout=1.0) as s:
                s.sendall(b"ping")
                if s.recv(16) == b"ping":
                    return time.monotonic() - start
        except OSError:
            time.sleep(0.05)
    return None


@pytest.mark.system
def test_cut_link_drops_everything_until_healed(link_host: tuple[ChaosHost, str]) -> None:
    host, dev = link_host
    fault = F.cut_link(host, mechanism="iptables")
    assert fault.mechanism == "iptables DROP" and fault.target == "t1"
    assert round_trip(timeout=2) is None
    with pytest.raises(F.FaultError, match="already cut"):
        F.cut_link(host, mechanism="iptables")
    healed = F.heal(fault)
    assert healed.healed == f"removed the {F.CUT_CHAIN} rules on {dev} in {NS}"
    assert round_trip(timeout=5) is not None
    assert F.heal(healed) == healed


@pytest.mark.system
def test_cut_link_with_netem(link_host: tuple[ChaosHost, str]) -> None:
    host, _dev = link_host
    if not F.netem_available(host):
        pytest.skip("this kernel has no sch_netem (CONFIG_NET_SCH_NETEM unset)")
    fault = F.cut_link(host, mechanism="netem")
    assert fault.mechanism == "tc netem"
    assert round_trip(timeout=2) is None
    F.heal(fault)
    assert round_trip(timeout=5) is not None


@pytest.mark.system
def test_delay_link_adds_its_delay(link_host: tuple[ChaosHost, str]) -> None:
    host, _dev = link_host
    fault = F.delay_link(host, delay_ms=300)
    assert fault.mechanism == ("tc netem" if F.netem_available(host) else "nfqueue delay")
    took = round_trip(timeout=5)
    assert took is not None and took >= 0.3  # the SYN-ACK and the echo each wait 300 ms
    healed = F.heal(fault)
    took = round_trip(timeout=5)
    assert took is not None and took < 0.3
    assert F.heal(healed) == healed


@pytest.mark.system
def test_a_dead_delayer_lets_packets_pass_and_heal_still_cleans_up(link_host: tuple[ChaosHost, str]) -> None:
    host, dev = link_host
    fault = F.delay_link(host, delay_ms=300, mechanism="nfqueue")
    assert isinstance(fault.undo, F.StopDelayer)
    os.kill(fault.undo.pid, 9)
    psutil.Process(fault.undo.pid).wait(timeout=5)
    took = round_trip(timeout=5)
    assert took is not None and took < 0.3  # --queue-bypass: no delayer bound, no delay
    healed = F.heal(fault)
    assert (
        healed.healed
        == f"removed the {F.DELAY_CHAIN} rules on {dev} in {NS}; the delayer (pid {fault.undo.pid}) was gone"
    )


@pytest.mark.system
def test_without_netem_asking_for_it_is_one_line(link_host: tuple[ChaosHost, str]) -> None:
    host, _dev = link_host
    if F.netem_available(host):
        pytest.skip("this kernel has sch_netem")
    with pytest.raises(
        F.FaultError, match=r"^delay_link t1: this kernel has no sch_netem \(CONFIG_NET_SCH_NETEM unset\)$"
    ):
        F.delay_link(host, delay_ms=100, mechanism="netem")


@pytest.mark.system
def test_link_faults_need_a_lab_host(tmp_path: Path) -> None:
    with pytest.raises(F.FaultError, match="only lab hosts have a link"):
        F.cut_link(a_host(tmp_path))


# --- the runner --------------------------------------------------------------------------------------------
@pytest.mark.system
def test_runner_injects_on_time_heals_after_its_duration_and_writes_jsonl(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    host = a_host(tmp_path)
    qemu = sleeper(procs)
    add_replica(host, "r-1")
    plan = ChaosPlan(
        faults=[
            FaultSpec(at=0.0, kind="freeze_qemu", host="t1", replica="leased", seconds=0.5),
            FaultSpec(at=0.2, kind="kill_host_agent", host="t1"),  # no owner recorded: refused, run goes on
            FaultSpec(at=0.8, kind="kill_qemu", host="t1", replica="r-1"),
        ]
    )
    active = F.ActiveFaults(tmp_path / "active")
    runner = ChaosRunner(plan, [host], run_dir=tmp_path / "run", active=active, pid_of=pid_of(qemu))
    start = time.time()
    faults = runner.run_until(threading.Event())
    assert [f.kind for f in faults] == ["freeze_qemu", "kill_qemu"]
    freeze, kill = faults
    assert freeze.healed_at is not None and 0.45 <= freeze.healed_at - freeze.injected_at < 1.0
    assert kill.injected_at - start >= 0.8 and qemu.wait(timeout=5) == -9
    assert [f.spec.kind for f in runner.failures] == ["kill_host_agent"]
    lines = [line for line in (tmp_path / "run" / FAULTS_FILE).read_text().splitlines()]
    events = [json.loads(line) for line in lines]
    assert [(e["event"], e["kind"]) for e in events] == [
        ("failed", "kill_host_agent"),
        ("fault", "freeze_qemu"),
        ("fault", "kill_qemu"),
    ]
    assert {"kind", "target", "injected_at", "healed_at"} <= set(events[1])
    assert active.all() == []


@pytest.mark.system
def test_stopping_the_runner_heals_what_is_active(tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    host = a_host(tmp_path)
    qemu = sleeper(procs)
    add_replica(host, "r-1")
    plan = ChaosPlan(faults=[FaultSpec(at=0, kind="freeze_qemu", host="t1", replica="r-1", seconds=600)])
    stop = threading.Event()
    runner = ChaosRunner(plan, [host], pid_of=pid_of(qemu))
    t = threading.Thread(target=lambda: runner.run_until(stop))
    t.start()
    deadline = time.monotonic() + 5
    while not runner.faults and time.monotonic() < deadline:
        time.sleep(0.02)
    assert status(qemu.pid) == psutil.STATUS_STOPPED
    stop.set()
    t.join(timeout=5)
    assert not t.is_alive() and status(qemu.pid) != psutil.STATUS_STOPPED
    assert runner.faults[0].healed_at is not None


@pytest.mark.system
def test_plan_file_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "plan.yaml"
    bad.write_text("faults:\n  - {at: 5, kind: melt_cpu}\n")
    with pytest.raises(F.OsfleetError, match=r"chaos plan .*plan.yaml: faults.0.kind: Input should be"):
        ChaosPlan.load(bad)
    spread = ChaosPlan.spread([ChaosHost("a", tmp_path), ChaosHost("b", tmp_path)], every_s=5)
    assert [(s.at, s.host, s.kind) for s in spread.faults][:3] == [
        (10.0, "a", "kill_qemu"),
        (15.0, "b", "freeze_qemu"),
        (20.0, "a", "delete_overlay"),
    ]


# --- the command line --------------------------------------------------------------------------------------
def osfleet(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OSFLEET_HOME": str(home)}
    return subprocess.run([OSFLEET, *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.system
def test_cli_inject_ls_undo(small_store: ChaosHost) -> None:
    home = small_store.home
    out = osfleet("chaos", "inject", "fill_image_store", "--floor-mib", "16", "--json", home=home)
    assert out.returncode == 0, out.stderr
    fault = F.Fault.model_validate_json(out.stdout)
    assert fault.target == "local" and Path(fault.details["path"]).exists()
    listed = osfleet("chaos", "ls", home=home)
    assert listed.stdout.startswith(fault.id)
    undone = osfleet("chaos", "undo", "--all", home=home)
    assert undone.returncode == 0 and "removed" in undone.stdout
    assert not Path(fault.details["path"]).exists()
    assert osfleet("chaos", "ls", home=home).stdout.strip() == "no active faults"


@pytest.mark.system
def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    out = osfleet("chaos", "inject", "kill_qemu", "--replica", "r-nope", home=tmp_path)
    assert out.returncode == 1
    assert out.stderr.startswith("osfleet: error: no replica local/r-nope") and out.stderr.count("\n") == 1
    out = osfleet("chaos", "undo", "f-0000", home=tmp_path)
    assert out.stderr == "osfleet: error: no active fault f-0000 (see 'osfleet chaos ls')\n"


@pytest.mark.system
def test_cli_inject_with_seconds_heals_by_itself(small_store: ChaosHost) -> None:
    out = osfleet("chaos", "inject", "fill_image_store", "--seconds", "0.2", "--json", home=small_store.home)
    fault = F.Fault.model_validate_json(out.stdout)
    assert fault.healed_at is not None and not Path(fault.details["path"]).exists()
    assert F.ActiveFaults(small_store.home / "chaos" / "active").all() == []


# --- a real replica ----------------------------------------------------------------------------------------
@pytest.mark.vm
def test_freeze_and_kill_a_real_replicas_qemu_found_from_its_record(
    golden: GoldenImage, settings: Settings, no_leftovers: None
) -> None:
    h = ReplicaHost(golden, settings, mode="snapshot", auto_recover=False)
    rid = None
    try:
        rid = h.create().replica
        host = local_host(settings)
        domain = F.replica_record(host, rid).domain
        h.virt.agent(domain, "guest-ping", timeout=5)
        frozen = F.freeze_qemu(host, rid)
        assert frozen.details["pid"] == h.virt.qemu_pid(domain) and status(frozen.details["pid"]) == "stopped"
        with pytest.raises(GuestAgentUnavailableError):
            h.virt.agent(domain, "guest-ping", timeout=2)
        F.heal(frozen)
        h.virt.wait_for_agent(domain, timeout=30)
        killed = F.kill_qemu(host, rid)
        assert killed.details == {"pid": frozen.details["pid"], "domain": domain}
        deadline = time.monotonic() + 10
        while h.virt.is_running(domain) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not h.virt.is_running(domain)
    finally:
        h.stop_background()
        if rid is not None:
            h.down([rid])
        h.close()


@pytest.mark.system
def test_hosts_resolve_to_this_machine_or_a_lab_host_from_the_lab_state(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    assert lab_hosts(settings) == [] and resolve("local", settings) == ChaosHost(name="local", home=tmp_path)
    root = lab_root(settings)
    lab1 = _host(1, ipaddress.IPv4Network("10.233.9.0/24"), root)
    save(LabState(root=str(root), subnet="10.233.9.0/24", key="k", known_hosts="kh", hosts=[lab1]))
    host = resolve("lab1", settings)
    assert (host.netns, host.link, host.home) == ("osfl-lab1", "osfl-lab1-n", root / "lab1" / "home")
    with pytest.raises(F.OsfleetError, match=r"^no host 'lab9' \(known: local, lab1;"):
        resolve("lab9", settings)


@pytest.mark.system
def test_a_planned_fill_can_name_the_folder_whose_file_system_it_fills(small_store: ChaosHost) -> None:
    sub = small_store.image_store / "replicas-fs"
    sub.mkdir()
    spec = FaultSpec(at=0, kind="fill_image_store", host="t1", dir=str(sub), floor_mib=8, seconds=0.1)
    (fault,) = ChaosRunner(ChaosPlan(faults=[spec]), [small_store]).run_until(threading.Event())
    assert Path(fault.details["path"]).parent == sub and fault.healed_at is not None
    assert list(sub.iterdir()) == []


@pytest.mark.system
def test_cli_run_plays_a_plan_file(small_store: ChaosHost, procs: list[subprocess.Popen[bytes]]) -> None:
    agent = sleeper(procs)
    plan = small_store.home / "plan.yaml"
    plan.write_text(
        "faults:\n"
        "  - {at: 0, kind: fill_image_store, host: local, floor_mib: 8, seconds: 0.3}\n"
        f"  - {{at: 0.1, kind: kill_host_agent, host: local, pid: {agent.pid}}}\n"
        "  - {at: 0.2, kind: cut_link, host: local}\n"
    )
    run_dir = small_store.home / "run"
    out = osfleet("chaos", "run", str(plan), "--run-dir", str(run_dir), home=small_store.home)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == (
        f"chaos: 2 fault(s) injected (1 healed, 1 self-healing), 1 refused; {run_dir / FAULTS_FILE}"
    )
    assert agent.wait(timeout=5) == -9
    events = [json.loads(line) for line in (run_dir / FAULTS_FILE).read_text().splitlines()]
    assert sorted((e["event"], e["kind"]) for e in events) == [
        ("failed", "cut_link"),
        ("fault", "fill_image_store"),
        ("fault", "kill_host_agent"),
    ]
    assert list(small_store.image_store.iterdir()) == []
