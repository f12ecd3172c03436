"""``osfleet bench gateway``: the fleet gateway alone, at thousands of leases, in front of simulated hosts.

The gateway is the real one (``osfleet fleet serve``, in a process of its own, with a clients file: the bench is a
tenant, as trainers are); the hosts are ``sim_hosts`` (real HTTP servers in another process that answer as host
agents do and count what reaches them), so only the gateway's own work is measured. On a machine of two or more
CPUs the gateway gets one of its own and the hosts and the load the others (``_pin``). Phases, in one run:

1. idle: the gateway polls its hosts and serves nothing; its CPU then is the cost of health polls (``idle``);
2. leases: ``--leases N`` leases through the gateway, ``--concurrency`` at a time (placement on every one);
3. steps: ``--concurrency`` agents step for ``--seconds``, each step on a lease drawn at random from all N, as
   fast as the gateway answers; ``steps_per_s_per_core`` is steps over the gateway process's CPU seconds
   (user + system, from the kernel), so the load generator and the hosts sharing the machine do not count;
4. added latency: ``--probe-rounds`` rounds, each one step on a random lease straight to its host and one through
   the gateway, back to back, the order swapped every round (as ``bench chaos``'s gateway overhead), while a
   background load of ``--probe-load`` steps a second goes through the gateway; ``added_p99_ms`` is the p99 of
   the per-round differences;
5. releases: every lease released through the gateway.

Afterwards the hosts' tallies must agree with what the gateway acknowledged: every acknowledged step counted once
on the host that holds its replica (``misrouted`` and ``duplicate_steps`` 0), every lease released.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import psutil

from osfleet.api.auth import ON_BEHALF_OF, VOUCHED_BY, gateway_id
from osfleet.bench.chaos import Gateway
from osfleet.bench.sim_hosts import HostSpec, SimHosts, total
from osfleet.cli_support import emit, friendly
from osfleet.errors import OsfleetError
from osfleet.fleet.hostclient import HostCallError, HostClient
from osfleet.measure.host_facts import describe
from osfleet.measure.stats import percentile

Say = Callable[[str], None]
CLIENT = "bench"
IDLE_SECONDS = 6.0  # three of the gateway's poll rounds
START_SECONDS = 60.0
CALL_SECONDS = 30.0
GOAL_STEPS_PER_S_PER_CORE = 2000.0
GOAL_ADDED_P99_MS = 5.0
STEP_BODY = {"actions": [{"type": "wait", "seconds": 0}], "observe": False}


@dataclass
class Lease:
    replica: str  # fleet ids: <host>.<local>
    lease: str

    @property
    def host(self) -> str:
        return self.replica.split(".", 1)[0]

    def local(self) -> tuple[str, str]:
        return self.replica.split(".", 1)[1], self.lease.split(".", 1)[1]


@dataclass
class Counts:
    ok: int = 0
    failed: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)

    def fail(self, why: str) -> None:
        self.failed += 1
        self.reasons[why[:120]] = self.reasons.get(why[:120], 0) + 1


@dataclass(frozen=True)
class SimEndpoint:
    """A simulated host as ``chaos.Gateway`` names it in the gateway's hosts file."""

    name: str
    url: str
    token: str


class GatewayProcess(Gateway):
    """``osfleet fleet serve`` over the simulated hosts (``chaos.Gateway``), with the bench as its one tenant; its
    CPU read from the kernel."""

    def __init__(self, specs: list[HostSpec], urls: list[str], folder: Path) -> None:
        self.client_token = secrets.token_urlsafe(24)
        hosts = [SimEndpoint(s.name, u, s.token) for s, u in zip(specs, urls, strict=True)]
        super().__init__(hosts, folder, clients={CLIENT: self.client_token})
        self.ps = psutil.Process(self.proc.pid)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.client_token}"}

    def cpu_seconds(self) -> float:
        """User + system CPU of the gateway's process (all its threads) so far."""
        t = self.ps.cpu_times()
        return float(t.user + t.system)


def run(
    leases: int,
    hosts: int,
    concurrency: int,
    seconds: float,
    probe_rounds: int,
    probe_load: float,
    say: Say = print,
) -> dict[str, Any]:
    """The whole bench (see the module's docstring); the result is one JSON document."""
    if hosts > leases:
        raise OsfleetError(f"--hosts {hosts} is more than --leases {leases}: every host holds at least one lease")
    per_host = -(-leases // hosts)
    specs = [HostSpec(f"h{i + 1}", secrets.token_urlsafe(16), per_host) for i in range(hosts)]
    result: dict[str, Any] = {
        "benchmark": "gateway",
        "leases": leases,
        "hosts": hosts,
        "replicas_per_host": per_host,
        "concurrency": concurrency,
        "machine": describe(),
    }
    with tempfile.TemporaryDirectory(prefix="osfleet-bench-gateway-") as tmp:
        say(f"[1/6] {hosts} simulated hosts with {per_host} replicas each (one process, one port per host)")
        with SimHosts(specs) as sim:
            say("[2/6] the gateway (osfleet fleet serve) in front of them, the bench as its tenant")
            gateway = GatewayProcess(specs, sim.urls, Path(tmp))
            ours = os.sched_getaffinity(0)
            try:
                result["cpus"] = _pin(gateway.proc.pid, sim.pid)
                asyncio.run(_phases(gateway, specs, sim, leases, concurrency, seconds, probe_rounds, probe_load,
                                    result, say))  # fmt: skip
            finally:
                os.sched_setaffinity(0, ours)
                gateway.stop()
    result["goal_met"] = bool(
        result.get("steps_per_s_per_core", 0) >= GOAL_STEPS_PER_S_PER_CORE
        and result.get("added_p99_ms", 1e9) <= GOAL_ADDED_P99_MS
        and result.get("misrouted") == 0
    )
    return result


def _pin(gateway: int, sim_hosts: int) -> dict[str, list[int]]:
    """The gateway on a CPU of its own, the simulated hosts and the load (this process) on the others, where the
    machine has two or more: then the load the bench makes does not take the gateway's CPU from it, and what the
    probe rounds see is the gateway's own latency, not the scheduler's turns between the bench's processes."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return {"gateway": cpus, "bench": cpus}
    mine, rest = cpus[-1:], cpus[:-1]
    os.sched_setaffinity(gateway, mine)
    for pid in (sim_hosts, os.getpid()):
        os.sched_setaffinity(pid, rest)
    return {"gateway": mine, "bench": rest}


async def _phases(
    gateway: GatewayProcess,
    specs: list[HostSpec],
    sim: SimHosts,
    leases: int,
    concurrency: int,
    seconds: float,
    probe_rounds: int,
    probe_load: float,
    result: dict[str, Any],
    say: Say,
) -> None:
    async with HostClient() as client:
        await _wait_healthy(client, gateway)
        say(f"[3/6] idle for {IDLE_SECONDS:.0f} s: what the gateway's health polls cost")
        before, cpu = total(sim.tallies()), gateway.cpu_seconds()
        await asyncio.sleep(IDLE_SECONDS)
        after = total(sim.tallies())
        polls = after["health"] + after["samples"] - before["health"] - before["samples"]
        result["idle"] = {
            "gateway_cores": round((gateway.cpu_seconds() - cpu) / IDLE_SECONDS, 4),
            "host_polls_per_s": round(polls / IDLE_SECONDS, 1),
        }

        say(f"[4/6] {leases} leases through the gateway, {concurrency} at a time")
        held, lease_counts, took, cpu = await _lease_all(client, gateway, leases, concurrency)
        result["lease"] = {
            **_latencies(lease_counts),
            "per_s": round(len(held) / took, 1),
            "gateway_cpu_ms_per_lease": round(cpu * 1000 / max(1, len(held)), 3),
            "failed": lease_counts.failed,
            "failure_reasons": lease_counts.reasons,
            "hosts_asked_in_vain": total(sim.tallies())["leases_refused"],
        }
        if len(held) < leases:
            raise OsfleetError(f"only {len(held)} of {leases} leases were granted: {lease_counts.reasons}")

        say(f"[5/6] {concurrency} agents step on random leases for {seconds:.0f} s, then {probe_rounds} probe rounds")
        steps, took, cpu = await _step_load(client, gateway, held, concurrency, seconds)
        result.update(
            steps=steps.ok,
            steps_failed=steps.failed,
            step_failure_reasons=steps.reasons,
            steps_per_s=round(steps.ok / took, 1),
            gateway_cpu_seconds=round(cpu, 3),
            gateway_cores_busy=round(cpu / took, 3),
            gateway_cpu_ms_per_step=round(cpu * 1000 / max(1, steps.ok), 4),
            steps_per_s_per_core=round(steps.ok / cpu, 1) if cpu > 0 else None,
            loaded_p50_ms=round(percentile(steps.latencies, 50) * 1000, 3),
            loaded_p99_ms=round(percentile(steps.latencies, 99) * 1000, 3),
        )
        probe, probed = await _probe(client, gateway, specs, sim.urls, held, probe_rounds, probe_load)
        result.update(probe)

        say("[6/6] releasing every lease through the gateway; the hosts' tallies")
        released = await _release_all(client, gateway, held, concurrency)
    tallies = sim.tallies()
    seen = total(tallies)
    acknowledged = steps.ok + probed
    result.update(
        released=released.ok,
        misrouted=seen["misrouted"],
        duplicate_steps=seen["duplicate_steps"],
        steps_counted_by_hosts=seen["steps"],
        steps_acknowledged=acknowledged,
        hosts_used=sum(1 for t in tallies.values() if t["steps"]),
    )
    if seen["steps"] != acknowledged or seen["misrouted"] or released.ok != len(held):
        result["failure"] = (
            f"the hosts counted {seen['steps']} steps for {acknowledged} acknowledged, {seen['misrouted']} misrouted, "
            f"{released.ok} of {len(held)} leases released"
        )


async def _wait_healthy(client: HostClient, gateway: GatewayProcess) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if gateway.proc.poll() is not None:
            raise OsfleetError(f"the gateway exited with {gateway.proc.returncode}; see {gateway.log_path}")
        try:
            if (await client.get(f"{gateway.url}/health", timeout=2)).status_code == 200:
                return
        except HostCallError:
            pass
        await asyncio.sleep(0.2)
    raise OsfleetError(f"the gateway did not answer /health within {START_SECONDS:.0f} s")


async def _workers(concurrency: int, work: Callable[[int], Awaitable[bool]]) -> None:
    """``concurrency`` tasks calling ``work(worker)`` until it returns False."""

    async def loop(worker: int) -> None:
        while await work(worker):
            pass

    await asyncio.gather(*(loop(w) for w in range(concurrency)))


async def _lease_all(
    client: HostClient, gateway: GatewayProcess, n: int, concurrency: int
) -> tuple[list[Lease], Counts, float, float]:
    held: list[Lease] = []
    counts = Counts()
    left = [n]

    async def one(worker: int) -> bool:
        if left[0] <= 0:
            return False
        left[0] -= 1
        start = time.perf_counter()
        try:
            r = await client.request(
                "POST", f"{gateway.url}/v1/leases", json={"holder": "bench"}, headers=gateway.headers,
                timeout=CALL_SECONDS,
            )  # fmt: skip
        except HostCallError as exc:
            counts.fail(str(exc))
            return True
        if r.status_code == 201:
            counts.ok += 1
            counts.latencies.append(time.perf_counter() - start)
            body = r.json()
            held.append(Lease(body["replica_id"], body["lease_id"]))
        else:
            counts.fail(f"{r.status_code}: {r.text[:80]}")
        return True

    cpu, start = gateway.cpu_seconds(), time.perf_counter()
    await _workers(concurrency, one)
    return held, counts, time.perf_counter() - start, gateway.cpu_seconds() - cpu


async def _step(client: HostClient, url: str, replica: str, lease: str, action: str, headers: dict[str, str]) -> int:
    body = {**STEP_BODY, "lease_id": lease, "action_id": action}
    r = await client.request("POST", f"{url}/v1/replicas/{replica}/step", json=body, headers=headers,
                             timeout=CALL_SECONDS)  # fmt: skip
    return r.status_code


async def _step_load(
    client: HostClient, gateway: GatewayProcess, held: list[Lease], concurrency: int, seconds: float
) -> tuple[Counts, float, float]:
    counts = Counts()
    rng = random.Random(1)
    n = [0]
    end = time.perf_counter() + seconds

    async def one(worker: int) -> bool:
        if time.perf_counter() >= end:
            return False
        lease = held[rng.randrange(len(held))]
        n[0] += 1
        start = time.perf_counter()
        try:
            status = await _step(client, gateway.url, lease.replica, lease.lease, f"load-{n[0]}", gateway.headers)
        except HostCallError as exc:
            counts.fail(str(exc))
            return True
        if status == 200:
            counts.ok += 1
            counts.latencies.append(time.perf_counter() - start)
        else:
            counts.fail(f"HTTP {status}")
        return True

    cpu, start = gateway.cpu_seconds(), time.perf_counter()
    await _workers(concurrency, one)
    if not counts.ok:
        raise OsfleetError(f"no step went through the gateway: {counts.reasons}")
    return counts, time.perf_counter() - start, gateway.cpu_seconds() - cpu


async def _probe(
    client: HostClient,
    gateway: GatewayProcess,
    specs: list[HostSpec],
    urls: list[str],
    held: list[Lease],
    rounds: int,
    load: float,
) -> tuple[dict[str, Any], int]:
    """Added latency: the same step straight to its host and through the gateway, per round, under a paced
    background load through the gateway."""
    hosts = {s.name: (u, s.token) for s, u in zip(specs, urls, strict=True)}
    vouched = gateway_id(gateway.token)
    rng = random.Random(2)
    direct: list[float] = []
    proxied: list[float] = []
    background = Counts()
    stop = asyncio.Event()

    async def paced() -> None:
        if load <= 0:
            return
        started, sent = time.perf_counter(), 0
        pending: set[asyncio.Task[None]] = set()
        while not stop.is_set():
            due = int((time.perf_counter() - started) * load)
            while sent < due:
                sent += 1
                task = asyncio.create_task(one_background(sent))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.sleep(0.001)
        await asyncio.gather(*pending)

    async def one_background(i: int) -> None:
        lease = held[rng.randrange(len(held))]
        try:
            status = await _step(client, gateway.url, lease.replica, lease.lease, f"bg-{i}", gateway.headers)
        except HostCallError as exc:
            background.fail(str(exc))
            return
        if status == 200:
            background.ok += 1
        else:
            background.fail(f"HTTP {status}")

    async def rounds_() -> None:
        try:
            for i in range(rounds):
                lease = held[rng.randrange(len(held))]
                url, token = hosts[lease.host]
                replica, local_lease = lease.local()
                direct_headers = {"Authorization": f"Bearer {token}", ON_BEHALF_OF: CLIENT, VOUCHED_BY: vouched}
                ways = [
                    ("d", url, replica, local_lease, direct_headers, direct),
                    ("g", gateway.url, lease.replica, lease.lease, gateway.headers, proxied),
                ]
                for via, u, rep, lid, headers, out in ways if i % 2 == 0 else ways[::-1]:
                    start = time.perf_counter()
                    status = await _step(client, u, rep, lid, f"probe-{via}{i}", headers)
                    out.append(time.perf_counter() - start)
                    if status != 200:
                        raise OsfleetError(f"a probe step ({'direct' if via == 'd' else 'gateway'}) answered {status}")
        finally:
            stop.set()

    await asyncio.gather(paced(), rounds_())
    added = [p - d for d, p in zip(direct, proxied, strict=True)]
    figures = {
        "probe_rounds": rounds,
        "probe_load_steps_per_s": load,
        "probe_background_steps": background.ok,
        "probe_background_failed": background.failed,
        "direct_p50_ms": round(percentile(direct, 50) * 1000, 3),
        "gateway_p50_ms": round(percentile(proxied, 50) * 1000, 3),
        "added_p50_ms": round(percentile(added, 50) * 1000, 3),
        "added_p99_ms": round(percentile(added, 99) * 1000, 3),
    }
    return figures, 2 * rounds + background.ok


async def _release_all(client: HostClient, gateway: GatewayProcess, held: list[Lease], concurrency: int) -> Counts:
    counts = Counts()
    todo = list(held)

    async def one(worker: int) -> bool:
        if not todo:
            return False
        lease = todo.pop()
        try:
            r = await client.request(
                "POST", f"{gateway.url}/v1/replicas/{lease.replica}/release", json={"lease_id": lease.lease},
                headers=gateway.headers, timeout=CALL_SECONDS,
            )  # fmt: skip
        except HostCallError as exc:
            counts.fail(str(exc))
            return True
        if r.status_code == 200:
            counts.ok += 1
        else:
            counts.fail(f"{r.status_code}: {r.text[:80]}")
        return True

    await _workers(concurrency, one)
    return counts


def _latencies(counts: Counts) -> dict[str, float]:
    if not counts.latencies:
        return {}
    return {
        "p50_ms": round(percentile(counts.latencies, 50) * 1000, 3),
        "p99_ms": round(percentile(counts.latencies, 99) * 1000, 3),
    }


def summary(r: dict[str, Any]) -> str:
    """The result in a few lines (``--json`` prints all of it)."""
    lines = [
        f"gateway over {r['hosts']} simulated hosts, {r['leases']} leases, {r['concurrency']} agents at once",
        f"  steps: {r.get('steps')} in all, {r.get('steps_per_s')}/s; gateway CPU "
        f"{r.get('gateway_cpu_ms_per_step')} ms a step: {r.get('steps_per_s_per_core')} steps/s per core "
        f"(goal >= {GOAL_STEPS_PER_S_PER_CORE:.0f})",
        f"  added by the gateway: p50 {r.get('added_p50_ms')} ms, p99 {r.get('added_p99_ms')} ms "
        f"(goal <= {GOAL_ADDED_P99_MS:g}) under {r.get('probe_load_steps_per_s')} steps/s of background",
        f"  leases: {(r.get('lease') or {}).get('per_s')}/s; idle gateway: "
        f"{(r.get('idle') or {}).get('gateway_cores')} cores for {(r.get('idle') or {}).get('host_polls_per_s')} "
        "host polls/s",
        f"  misrouted {r.get('misrouted')}, duplicate steps {r.get('duplicate_steps')}, released {r.get('released')}",
    ]
    if r.get("failure"):
        lines.append(f"  FAILED: {r['failure']}")
    return "\n".join(lines)


@click.command("gateway")
@click.option("--leases", default=10000, show_default=True, type=click.IntRange(1, 1_000_000),
              help="leases held through the gateway at once")  # fmt: skip
@click.option("--hosts", default=100, show_default=True, type=click.IntRange(1, 5000),
              help="simulated hosts; the leases are spread evenly over them")  # fmt: skip
@click.option("--concurrency", default=64, show_default=True, type=click.IntRange(1, 4096),
              help="agents calling the gateway at once")  # fmt: skip
@click.option("--seconds", default=20.0, show_default=True, type=click.FloatRange(1, 3600),
              help="how long the agents step as fast as the gateway answers")  # fmt: skip
@click.option("--probe-rounds", default=5000, show_default=True, type=click.IntRange(10, 1_000_000),
              help="rounds of one step straight to a host and one through the gateway (added latency)")  # fmt: skip
@click.option("--probe-load", default=1000.0, show_default=True, type=click.FloatRange(0, 100000),
              help="steps a second sent through the gateway in the background while the probe rounds run")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of a summary")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON to this file")
@friendly
def bench_gateway(
    leases: int,
    hosts: int,
    concurrency: int,
    seconds: float,
    probe_rounds: int,
    probe_load: float,
    as_json: bool,
    out: Path | None,
) -> None:
    """The fleet gateway alone at N leases over simulated hosts (real HTTP servers that count what reaches them):
    steps a second per gateway core, the latency it adds (p50, p99), what idle polling costs, misrouted steps."""
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    result = run(leases, hosts, concurrency, seconds, probe_rounds, probe_load, say)
    emit(result, as_json or "failure" in result, out, summary)
    if result.get("failure"):
        raise OsfleetError(f"the benchmark failed: {result['failure']}")
