"""``osfleet bench chaos``: Locust trajectories through the fleet gateway while faults are injected, then an
audit of what the faults cost.

The fleet is made here: N host agents on loopback, each with its own OSFLEET_HOME on a small tmpfs (so a
filled store is really full without touching the machine's disk), its own replica-name prefix, and a
restart loop (a killed agent comes back, as under its service manager); a fleet gateway in front. Faults
come from ``osfleet.chaos`` (kill QEMU, freeze QEMU, delete an overlay, kill a host agent, fill a host's
store). Afterwards:

- every step the gateway acknowledged to a client must be in its host's audit log exactly once
  (``lost_actions``, ``duplicated_actions``);
- every aborted episode must have a fault behind it: one that hit its replica, or its host for host-wide
  faults, while the episode ran (``collateral_aborts`` counts those without);
- every fault's target must serve again (``recovered_after_s``; ``unrecovered_faults`` otherwise);
- after teardown nothing of the bench may remain (``leaks``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from osfleet.bench.load import _get, free_port, run_locust
from osfleet.chaos import faults as F
from osfleet.chaos.hosts import ChaosHost
from osfleet.chaos.runner import ChaosPlan, ChaosRunner, FaultSpec
from osfleet.config import Settings
from osfleet.errors import OsfleetError, as_osfleet
from osfleet.measure.host_facts import describe
from osfleet.measure.stats import percentile
from osfleet.vm.images import GoldenImage
from osfleet.vm.virt import Virt

Say = Callable[[str], None]
KINDS = ("kill_qemu", "freeze_qemu", "delete_overlay", "kill_host_agent", "fill_image_store")
HOST_KINDS = {"kill_host_agent", "fill_image_store", "cut_link", "delay_link"}
LAYER = {
    "kill_qemu": "rebuild",
    "freeze_qemu": "rebuild",
    "delete_overlay": "rebuild",
    "fill_image_store": "rebuild",
    "kill_host_agent": "drain",
    "cut_link": "drain",
    "delay_link": "retry",
}
HOME_TMPFS = "3g"
SUMMARY_KEYS = (
    "fault_kinds",
    "scored_episodes",
    "aborted_episodes",
    "collateral_aborts",
    "lost_actions",
    "duplicated_actions",
    "unrecovered_faults",
    "leaks",
)
SAMPLE_SECONDS = 2.0
OVERHEAD_ROUNDS = 100
OVERHEAD_WARMUP = 5
FREEZE_SECONDS = 60.0  # longer than liveness needs to call the guest dead (3 pings, 10 s apart, 5 s timeout)
RECOVERY_GRACE_SECONDS = 120.0  # a fault "touches" an episode from its injection until this long after it heals
AGENT_START_SECONDS = 600.0


@dataclass
class BenchHost:
    """A host agent on loopback with a home of its own, restarted whenever it exits."""

    name: str
    index: int
    root: Path
    image: GoldenImage
    warm: int
    port: int = field(default_factory=free_port)
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    _stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def prefix(self) -> str:
        return f"osfleet-ch{self.index + 1}-"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "OSFLEET_HOME": str(self.home), "OSFLEET_NAME_PREFIX": self.prefix}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def chaos(self) -> ChaosHost:
        return ChaosHost(name=self.name, home=self.home)

    def prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={HOME_TMPFS},mode=0755", f"osfleet-{self.name}", str(self.home)],
            check=True,
            capture_output=True,
        )
        (self.root / "token").write_text(self.token + "\n")
        (self.root / "token").chmod(0o600)

    def start(self) -> None:
        self._spawn()
        self._thread = threading.Thread(target=self._supervise, name=f"supervise-{self.name}", daemon=True)
        self._thread.start()

    def _spawn(self) -> None:
        cmd = [sys.executable, "-m", "osfleet", "host", "serve", "--port", str(self.port), "--warm", str(self.warm)]
        cmd += ["--image", str(self.image.disk), "--token-file", str(self.root / "token")]
        with open(self.root / "agent.log", "a") as log:
            self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def _supervise(self) -> None:
        while not self._stopping.wait(1.0):
            if self.proc is not None and self.proc.poll() is not None:
                self._stopping.wait(2.0)  # as a service manager would, after a short pause
                if not self._stopping.is_set():
                    self.restarts += 1
                    self._spawn()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(10)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def teardown(self) -> None:
        """Its replicas, saved states and home; the tmpfs is unmounted."""
        subprocess.run(
            [sys.executable, "-m", "osfleet", "replicas", "down", "--all", "--states", "--force"],
            env=self.env,
            capture_output=True,
            timeout=600,
            check=False,
        )
        subprocess.run(["umount", str(self.home)], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


class HostEndpoint(Protocol):
    """What the gateway and its overhead probe need of a host agent (a ``BenchHost`` here, the lab's agents
    deployed by ``pulumi up`` in the main job)."""

    @property
    def name(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def token(self) -> str: ...


class Gateway:
    """``osfleet fleet serve`` over ``hosts`` on a free loopback port; ``ca_file``: the CA that signed the
    hosts' certificates (https hosts); ``clients``: its tenants, name -> token (a clients file is written)."""

    def __init__(
        self,
        hosts: Sequence[HostEndpoint],
        run_dir: Path,
        ca_file: Path | None = None,
        clients: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.token = secrets.token_urlsafe(24)
        spec: list[dict[str, Any]] = [{"name": h.name, "url": h.url, "token": h.token} for h in hosts]
        if ca_file is not None:
            spec = [{**entry, "ca_file": str(ca_file)} for entry in spec]
        (run_dir / "hosts.json").write_text(json.dumps(spec))
        (run_dir / "hosts.json").chmod(0o600)
        (run_dir / "gateway-token").write_text(self.token)
        cmd = [sys.executable, "-m", "osfleet", "fleet", "serve", "--port", str(self.port)]
        cmd += ["--hosts-file", str(run_dir / "hosts.json"), "--token-file", str(run_dir / "gateway-token")]
        if clients:
            (run_dir / "clients").write_text("".join(f"{name} {token}\n" for name, token in clients.items()))
            (run_dir / "clients").chmod(0o600)
            cmd += ["--clients-file", str(run_dir / "clients")]
        self.log_path = run_dir / "gateway.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Sampler:
    """The fleet as the gateway sees it, every ``SAMPLE_SECONDS``: host health and replicas by state."""

    def __init__(self, gateway: Gateway, out: Path) -> None:
        self.gateway = gateway
        self.out = out
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def now(self) -> dict[str, Any]:
        sample: dict[str, Any] = {"time": time.time(), "hosts": {}, "replicas": []}
        try:
            _, health = _get(f"{self.gateway.url}/health", headers=self.gateway.headers, timeout=5)
            sample["hosts"] = {n: h["healthy"] for n, h in (health or {}).get("hosts", {}).items()}
            status, reps = _get(f"{self.gateway.url}/v1/replicas", headers=self.gateway.headers, timeout=10)
            if status == 200:
                sample["replicas"] = [{"id": r["id"], "state": r["state"], "generation": r["generation"]} for r in reps]
        except (OSError, ValueError):
            sample["error"] = "gateway did not answer"
        return sample

    def _loop(self) -> None:
        with open(self.out, "a") as f:
            while not self._stop.wait(SAMPLE_SECONDS):
                s = self.now()
                self.samples.append(s)
                f.write(json.dumps(s) + "\n")
                f.flush()


# --- the audit ------------------------------------------------------------------------------------------------
def _episodes(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(run_dir.glob("trajectories-*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def _phases(episodes: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Where a scored episode's time goes: p50, p95 and share of the total per phase (lease, reset with the
    task's set-up, steps, evaluate, release), from the clients' own clocks."""
    out: dict[str, dict[str, float]] = {}
    totals = [sum(e.get("seconds", {}).values()) for e in episodes]
    whole = sum(totals) or 1.0
    for phase in ("lease", "reset", "steps", "evaluate", "release"):
        values = [e["seconds"][phase] for e in episodes if phase in e.get("seconds", {})]
        if values:
            out[phase] = {
                "p50": round(percentile(values, 50), 3),
                "p95": round(percentile(values, 95), 3),
                "share": round(sum(values) / whole, 3),
            }
    return out


def _audit_entries(hosts: list[BenchHost]) -> Counter[tuple[str, str, str]]:
    """(fleet replica id, lease, action id) -> times applied, from every host's audit log."""
    seen: Counter[tuple[str, str, str]] = Counter()
    for h in hosts:
        for path in (h.home / "audit").glob("*.jsonl"):
            for line in path.read_text().splitlines():
                if line.strip():
                    e = json.loads(line)
                    seen[(f"{h.name}.{e['replica']}", f"{h.name}.{e['lease']}", str(e["action_id"]))] += 1
    return seen


def _touched(episode: dict[str, Any], faults: list[F.Fault]) -> bool:
    host, _, replica = str(episode.get("replica", "")).partition(".")
    start, end = float(episode["t_start"]), float(episode["t_end"])
    for f in faults:
        hit = f.host == host and (f.kind in HOST_KINDS or f.replica == replica)
        until = (f.healed_at or f.injected_at) + RECOVERY_GRACE_SECONDS
        if hit and f.injected_at <= end and until >= start:
            return True
    return False


def _recovered_at(fault: F.Fault, samples: list[dict[str, Any]]) -> float | None:
    """When the fault's target served again: for a replica fault, the replica ready or leased in a later
    generation (rebuilt, whether or not the fault was healed yet) or, failing that, again after the heal;
    for a host fault, the host healthy after the heal with none of its replicas failed."""
    rid = f"{fault.host}.{fault.replica}" if fault.replica else None
    gen_before = None
    for s in samples:
        reps = {r["id"]: r for r in s["replicas"]}
        if rid and s["time"] <= fault.injected_at and rid in reps:
            gen_before = reps[rid]["generation"]
    after_heal = max(fault.injected_at, fault.healed_at or 0.0)
    for s in samples:
        if s["time"] < fault.injected_at or not s["hosts"].get(fault.host):
            continue
        reps = {r["id"]: r for r in s["replicas"]}
        if rid:
            r = reps.get(rid)
            if not r or r["state"] not in ("ready", "leased"):
                continue
            rebuilt = gen_before is None or r["generation"] > gen_before
            if rebuilt or (fault.healed_at is not None and s["time"] >= fault.healed_at):
                return float(s["time"])
        elif s["time"] >= after_heal:
            mine = [r for r in s["replicas"] if r["id"].startswith(f"{fault.host}.")]
            if mine and not any(r["state"] in ("failed", "recovering") for r in mine):
                return float(s["time"])
    return None


def _layer(fault: F.Fault, samples: list[dict[str, Any]]) -> str:
    """The recovery layer that acted, as seen from the fleet: a replica rebuilt (a later generation), a
    host drained (unhealthy at the gateway after the fault), or a fault healed in place before either."""
    after = [s for s in samples if s["time"] >= fault.injected_at]
    if fault.replica:
        rid = f"{fault.host}.{fault.replica}"
        gens = [r["generation"] for s in samples for r in s["replicas"] if r["id"] == rid]
        return "rebuild" if gens and max(gens) > min(gens) else "healed in place"
    if any(s["hosts"].get(fault.host) is False for s in after):
        return "drain"
    failed = any(
        r["state"] in ("failed", "recovering")
        for s in after
        for r in s["replicas"]
        if r["id"].startswith(f"{fault.host}.")
    )
    return "rebuild" if failed else LAYER.get(fault.kind, "rebuild")


def _leaks(hosts: list[BenchHost], settings: Settings) -> dict[str, int]:
    prefixes = tuple(h.prefix for h in hosts)
    with Virt(settings.libvirt_uri) as virt:
        domains = [n for p in prefixes for n in virt.names(p)]
    qemu = 0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"qemu-system" in cmdline and any(p.encode() in cmdline for p in prefixes):
                qemu += 1
    files = sum(1 for h in hosts if h.root.exists())
    mounts = sum(1 for h in hosts if str(h.home) in Path("/proc/mounts").read_text())
    agents = sum(1 for h in hosts if h.proc is not None and h.proc.poll() is None)
    return {"domains": len(domains), "qemu_processes": qemu, "homes": files, "mounts": mounts, "agents": agents}


def run(
    image: GoldenImage,
    settings: Settings,
    run_dir: Path,
    hosts: int = 2,
    warm: int = 2,
    users: int = 4,
    duration_s: int = 300,
    every_s: float = 25.0,
    kinds: tuple[str, ...] = KINDS,
    say: Say = print,
    pick: str = "any",
) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    bench_root = settings.scratch_dir / f"chaos-{run_dir.name}"
    fleet = [BenchHost(f"h{i + 1}", i, bench_root / f"h{i + 1}", image, warm) for i in range(hosts)]
    gateway: Gateway | None = None
    sampler: Sampler | None = None
    runner: ChaosRunner | None = None
    stop_chaos = threading.Event()
    result: dict[str, Any] = {"hosts": hosts, "users": users, "duration_s": duration_s, "machine": describe()}
    try:
        say(f"[1/5] {hosts} host agents on loopback (own tmpfs home, prefix and restart loop), {warm} warm each")
        for h in fleet:
            h.prepare()
            h.start()
        _wait(lambda: all(_ready(h) >= warm for h in fleet), AGENT_START_SECONDS, "the hosts' warm pools", say)
        say("[2/5] fleet gateway in front of them")
        gateway = Gateway(fleet, run_dir)
        gw = gateway
        _wait(lambda: _get(f"{gw.url}/health", timeout=2)[0] == 200, 60, "the gateway", say)
        say("      gateway overhead: the same step, straight to a host and through the gateway, alternating")
        result["gateway_overhead"] = gateway_overhead(gateway, fleet)
        sampler = Sampler(gateway, run_dir / "fleet-samples.jsonl")
        sampler.start()
        plan = _plan(fleet, kinds, every_s, pick) if kinds else ChaosPlan(faults=[])
        runner = ChaosRunner(plan, [h.chaos for h in fleet], say=say, run_dir=run_dir)
        chaos_thread = threading.Thread(target=runner.run_until, args=(stop_chaos,), name="chaos", daemon=True)
        say(f"[3/5] Locust: {users} agents through the gateway for {duration_s} s; {len(plan.faults)} faults planned")
        started = time.time()
        chaos_thread.start()
        run_locust(
            "trajectories",
            gateway.url,
            gateway.token,
            run_dir,
            users=users,
            run_time=f"{duration_s}s",
            extra=["--policy", "oracle"],
        )
        stop_chaos.set()
        chaos_thread.join(120)
        say("[4/5] waiting for every fault's target to serve again, then auditing")
        ran, seen = runner, sampler
        _wait(lambda: _all_recovered(ran.faults, seen.samples), RECOVERY_GRACE_SECONDS, "recovery", say, fail=False)
        sampler.stop()
        result.update(_audit(run_dir, fleet, runner, sampler.samples, started))
    except Exception as exc:  # what was measured is still reported, with the failure named (exit code 1)
        result["failure"] = str(as_osfleet(exc, "the chaos benchmark"))
        say(f"chaos bench failed: {result['failure']}")
    finally:
        stop_chaos.set()
        say("[5/5] teardown")
        if sampler is not None:
            sampler.stop()
        teardown(gateway, fleet, bench_root)
    result["leaks"] = _leaks(fleet, settings)
    (run_dir / "chaos.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def teardown(gateway: Gateway | None, fleet: list[BenchHost], bench_root: Path) -> None:
    """The gateway, then every host agent, then their replicas, homes and the bench's folder."""
    if gateway is not None:
        gateway.stop()
    for h in fleet:
        h.stop()
    for h in fleet:
        h.teardown()
    if bench_root.exists():
        shutil.rmtree(bench_root, ignore_errors=True)


def _audit(
    run_dir: Path, fleet: list[BenchHost], runner: ChaosRunner, samples: list[dict[str, Any]], started: float
) -> dict[str, Any]:
    episodes = _episodes(run_dir)
    faults = list(runner.faults)
    applied = _audit_entries(fleet)
    acked = [(e["replica"], e["lease"], str(a)) for e in episodes for a in e.get("acked", [])]
    fault_rows = []
    for f in faults:
        back = _recovered_at(f, samples)
        fault_rows.append(
            {
                "kind": f.kind,
                "target": f.target,
                "mechanism": f.mechanism,
                "injected_at": round(f.injected_at - started, 1),
                "healed_at": round(f.healed_at - started, 1) if f.healed_at else None,
                "recovered_after_s": round(back - f.injected_at, 1) if back else None,
                "layer": _layer(f, samples),
            }
        )
    aborted = [e for e in episodes if e.get("status") == "aborted"]
    scored = [e for e in episodes if e.get("status") == "scored"]
    unscored = len(episodes) - len(scored)
    minutes = (max((e.get("t_end", started) for e in episodes), default=started) - started) / 60
    return {
        "episodes_per_minute": round(len(scored) / minutes, 2) if minutes > 0 else None,
        "episode_phase_seconds": _phases(scored),
        "started_at": started,
        "abort_rate": round(unscored / len(episodes), 4) if episodes else None,
        "fault_kinds": len({f.kind for f in faults}),
        "faults": fault_rows,
        "faults_refused": [x.to_json() for x in runner.failures],
        "unrecovered_faults": sum(1 for r in fault_rows if r["recovered_after_s"] is None),
        "episodes": len(episodes),
        "scored_episodes": sum(1 for e in episodes if e.get("status") == "scored"),
        "aborted_episodes": len(aborted),
        "error_episodes": sum(1 for e in episodes if e.get("status") == "error"),
        "collateral_aborts": sum(1 for e in aborted if not _touched(e, faults)),
        "acknowledged_steps": len(acked),
        "lost_actions": sum(1 for a in acked if applied[a] == 0),
        "duplicated_actions": sum(1 for n in applied.values() if n > 1),
        "agent_restarts": {h.name: h.restarts for h in fleet},
        "recovery_layers": Counter(r["layer"] for r in fault_rows),
    }


def gateway_overhead(
    gateway: Gateway,
    fleet: Sequence[HostEndpoint],
    rounds: int = OVERHEAD_ROUNDS,
    warmup: int = OVERHEAD_WARMUP,
    ca_file: Path | None = None,
) -> dict[str, Any]:
    """What the gateway adds to one step (a zero-second wait, no observation) on one leased replica.

    Each round sends the step straight to its host and through the gateway back to back, over kept-alive
    connections, the order swapped every round (so neither path always meets the host just after the other);
    the figure is the p50 of the per-round differences, after ``warmup`` rounds that are not counted (first
    connections). A slow spell of a busy host (a spare being made, a neighbour's burst) then weighs on both calls
    of a round instead of on one path's p50."""
    import httpx2 as httpx

    from osfleet.tls import client_context

    direct: list[float] = []
    proxied: list[float] = []
    verify: Any = client_context(ca_file) if ca_file is not None else True  # https hosts under a private CA
    with httpx.Client(timeout=60, verify=verify) as client:
        lease = client.post(f"{gateway.url}/v1/leases", json={"holder": "overhead"}, headers=gateway.headers)
        if lease.status_code != 201:
            raise OsfleetError(f"gateway overhead: no lease ({lease.status_code}: {lease.text[:200]})")
        rid, lid = lease.json()["replica_id"], lease.json()["lease_id"]
        host_name, local = rid.split(".", 1)
        host = next(h for h in fleet if h.name == host_name)
        local_lease = lid.split(".", 1)[1]
        step = {"actions": [{"type": "wait", "seconds": 0}], "observe": False}
        ways = [
            ("d", host.url, local, local_lease, {"Authorization": f"Bearer {host.token}"}, direct),
            ("g", gateway.url, rid, lid, gateway.headers, proxied),
        ]
        try:
            for i in range(warmup + rounds):
                for via, url, rep, lease_id, headers, out in ways if i % 2 == 0 else ways[::-1]:
                    body = {**step, "lease_id": lease_id, "action_id": f"overhead-{via}{i}"}
                    start = time.perf_counter()
                    r = client.post(f"{url}/v1/replicas/{rep}/step", json=body, headers=headers)
                    if i >= warmup:
                        out.append(time.perf_counter() - start)
                    if r.status_code != 200:
                        raise OsfleetError(f"gateway overhead: step answered {r.status_code}: {r.text[:200]}")
        finally:
            client.post(f"{gateway.url}/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=gateway.headers)
    added = [p - d for d, p in zip(direct, proxied, strict=True)]
    return {
        "rounds": rounds,
        "warmup_rounds": warmup,
        "direct_p50_ms": percentile(direct, 50) * 1000,
        "gateway_p50_ms": percentile(proxied, 50) * 1000,
        "added_p50_ms": percentile(added, 50) * 1000,
        "added_iqr_ms": (percentile(added, 75) - percentile(added, 25)) * 1000,  # how steady the rounds were
        "added_p95_ms": percentile(added, 95) * 1000,
    }


def _plan(fleet: list[BenchHost], kinds: tuple[str, ...], every_s: float, pick: str = "leased") -> ChaosPlan:
    """One fault of each kind, ``every_s`` apart, round-robin over the hosts, on replicas in state ``pick``
    (leased: mid-episode). A frozen QEMU stays frozen long enough to be noticed; a full store is freed after
    20 s."""
    specs = [
        FaultSpec(
            at=30.0 + i * every_s,
            kind=kind,  # type: ignore[arg-type]  # checked by pydantic
            host=fleet[i % len(fleet)].name,
            replica=pick,
            seconds=FREEZE_SECONDS if kind == "freeze_qemu" else 20.0,
        )
        for i, kind in enumerate(kinds)
    ]
    return ChaosPlan(faults=specs)


def _ready(host: BenchHost) -> int:
    try:
        status, reps = _get(f"{host.url}/v1/replicas", headers={"Authorization": f"Bearer {host.token}"}, timeout=5)
    except (OSError, ValueError):
        return 0
    return sum(r["state"] == "ready" for r in reps) if status == 200 else 0


def _all_recovered(faults: list[F.Fault], samples: list[dict[str, Any]]) -> bool:
    return all(_recovered_at(f, samples) is not None for f in faults)


def _wait(check: Callable[[], bool], timeout: float, what: str, say: Say, fail: bool = True) -> None:
    deadline = time.monotonic() + timeout
    last = 0.0
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, ValueError):
            pass
        if time.monotonic() - last > 30:
            say(f"      ... waiting for {what}")
            last = time.monotonic()
        time.sleep(1.0)
    if fail:
        raise OsfleetError(f"timed out after {timeout:.0f} s waiting for {what}")
