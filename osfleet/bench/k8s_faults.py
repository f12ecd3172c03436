"""``osfleet bench k8s-faults``: the failures Kubernetes causes, on the lab's real node, each measured.

A throwaway copy of the ``k8s`` stack (two gateway pods behind their Service, the agent pod on this machine's
node, two warm replicas) is brought up; one episode's lease is held through ``fleetUrl`` the whole time, and three
faults follow one another:

- **agent pod deleted**: the DaemonSet starts a new pod on the node, which adopts the node's replicas from their
  records on the node's disk, and the gateway follows the pod's new address. Measured: seconds until the new pod
  is Ready, until the *held* lease answers again (the same replica, not a new one), until a new episode runs.
- **gateway pod killed**: SIGKILL to one gateway's process, as an out-of-memory kill or a crash would. The held
  lease is stepped every 0.2 s through the Service with no client retry, so every failed call is counted, and
  the longest stretch without a good answer is timed, both through the client's pooled connection (what an agent
  on the SDK sees) and with a new connection per call (the Service picks a pod for each); then the seconds until
  the killed pod is Ready again.
- **node drained**: ``kubectl drain --ignore-daemonsets`` (cordon, then evict). In a cluster of several nodes the
  gateway pods would move elsewhere; the lab has one real node, so they are kept there (a pod selector), and only
  the agent's node is drained. Measured: seconds until the held lease's calls end as 503 infrastructure failures
  naming the node, what ``evaluate`` answers then (a 503, never a reward: a drained node is not the agent's
  fault), what a new lease gets; after ``kubectl uncordon``, seconds until a new episode runs again.

The stack is destroyed and the node uncordoned whatever happens; after ``destroy`` no replica domain of the stack
may be left on the node (an uninstall tears them down, where a restart keeps them for the next agent pod).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from osfleet.bench.k8s_scale import find_processes
from osfleet.bench.k8s_stack import (
    LAB_CONFIG,
    NAMESPACE,
    Deployed,
    Kubectl,
    Say,
    built_image,
    lab_kubectl,
    real_nodes,
    refuse_if_stack_up,
    throwaway_stack,
)
from osfleet.cli_support import emit
from osfleet.config import Settings
from osfleet.errors import ConfigError, OsfleetError

STACK = "bench-k8s-faults"
HOLDER = "osfleet-bench-k8s-faults"
AGENT = "app.kubernetes.io/name=osfleet-agent"
GATEWAY = "app.kubernetes.io/name=osfleet-gateway"
WAIT = {"type": "wait", "seconds": 0}
PROBE_SECONDS = 0.2  # the gateway fault's call rate through the Service
GATEWAY_WATCH_SECONDS = 20.0  # calls kept up after the kill, to see the Service settle on the other pod


# --- what a call gave ---------------------------------------------------------------------------------------------
def outcome(exc: BaseException) -> str:
    """A failed call as ``Kind status``, e.g. ``InfrastructureError 503`` (the client's error kinds)."""
    status = getattr(exc, "status", None)
    return f"{type(exc).__name__} {status}" if status is not None else type(exc).__name__


@dataclass
class Probe:
    """A call repeated every ``interval`` seconds in a thread: when each ended, and how."""

    call: Callable[[], Any]
    interval: float = PROBE_SECONDS
    calls: list[tuple[float, str | None]] = field(default_factory=list)  # (seconds since start, failure or None)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="k8s-faults-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.call()
                failure = None
            except Exception as exc:  # every failure is what is measured
                failure = outcome(exc)
            self.calls.append((time.monotonic() - self._start, failure))
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)


def summarise(calls: list[tuple[float, str | None]]) -> dict[str, Any]:
    """Calls made, failed (by kind), and the longest stretch from a failure's end to the next good answer."""
    failed = Counter(f for _, f in calls if f is not None)
    longest, since = 0.0, None
    previous_ok = 0.0
    for at, failure in calls:
        if failure is not None:
            since = previous_ok if since is None else since
        else:
            if since is not None:
                longest = max(longest, at - since)
            since, previous_ok = None, at
    if since is not None and calls:
        longest = max(longest, calls[-1][0] - since)
    return {
        "calls": len(calls),
        "failed": sum(failed.values()),
        "failures": dict(failed),
        "longest_without_answer_seconds": round(longest, 2),
    }


def retry_until(what: str, call: Callable[[], Any], timeout: float, errors: Counter[str] | None = None) -> Any:
    """``call()``'s value once it succeeds (every 1 s), counting failures in ``errors``; raise after ``timeout``."""
    end = time.monotonic() + timeout
    last = "no attempt"
    while True:
        try:
            return call()
        except Exception as exc:  # the failures until it works are what is measured
            last = f"{outcome(exc)}: {exc}"
            if errors is not None:
                errors[outcome(exc)] += 1
        if time.monotonic() > end:
            raise OsfleetError(f"{what}: still failing after {timeout:.0f} s ({last})")
        time.sleep(1.0)


# --- the cluster's side -------------------------------------------------------------------------------------------
def pods(kubectl: Kubectl, selector: str) -> list[dict[str, Any]]:
    return json.loads(kubectl(["-n", NAMESPACE, "get", "pods", "-l", selector, "-o", "json"])).get("items", [])


def is_ready(pod: dict[str, Any]) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def restarts(pod: dict[str, Any]) -> int:
    return sum(c.get("restartCount", 0) for c in pod.get("status", {}).get("containerStatuses", []))


def agent_pod(kubectl: Kubectl, node: str) -> dict[str, Any]:
    on_node = [p for p in pods(kubectl, AGENT) if p.get("spec", {}).get("nodeName") == node and is_ready(p)]
    if not on_node:
        raise OsfleetError(f"no Ready agent pod on node {node}")
    return on_node[0]


def pod_processes(uid: str, words: tuple[str, ...], proc: Path = Path("/proc")) -> list[int]:
    """Pids of ``words`` (e.g. ``osfleet fleet serve``) in the pod ``uid``'s cgroups (the kubelet names them
    ``pod<uid>``): the gateway's process of that pod alone, not its sibling's nor a user's own gateway."""
    marks = (f"pod{uid}", f"pod{uid.replace('-', '_')}")
    found = []
    for pid in find_processes(words, proc):
        try:
            cgroups = (proc / str(pid) / "cgroup").read_text()
        except OSError:
            continue
        if any(m in cgroups for m in marks):
            found.append(pid)
    return found


# --- the faults ---------------------------------------------------------------------------------------------------
def episode(fleet: Any, task: str) -> float:
    """One whole episode on a new lease: reset, a step, evaluate; its reward."""
    with fleet.lease(HOLDER) as s:
        s.reset(task)
        s.step(WAIT, observe=False)
        return s.evaluate().reward


def agent_deleted(kubectl: Kubectl, node: str, fleet: Any, held: Any, task: str, timeout: float, say: Say) -> dict:
    old = agent_pod(kubectl, node)
    name, uid = old["metadata"]["name"], old["metadata"]["uid"]
    say(f"  deleting the agent pod {name}")
    start = time.monotonic()
    kubectl(["-n", NAMESPACE, "delete", "pod", name, "--wait=false"])
    row: dict[str, Any] = {"pod": name}
    errors: Counter[str] = Counter()
    while time.monotonic() - start < timeout and "held_lease_back_seconds" not in row:
        new = [p for p in pods(kubectl, AGENT) if p["metadata"]["uid"] != uid and p["spec"].get("nodeName") == node]
        if "new_pod_ready_seconds" not in row and any(is_ready(p) for p in new):
            row["new_pod_ready_seconds"] = round(time.monotonic() - start, 2)
            say(f"  a new agent pod is Ready after {row['new_pod_ready_seconds']} s")
        try:
            held.step(WAIT, observe=False)
            if "new_pod_ready_seconds" in row:  # an answer from the old pod while it shut down does not count
                row["held_lease_back_seconds"] = round(time.monotonic() - start, 2)
        except Exception as exc:  # counted: what the held lease got during the restart
            errors[outcome(exc)] += 1
        time.sleep(1.0)
    row["held_lease_errors"] = dict(errors)
    if "held_lease_back_seconds" not in row:
        say(f"  the held lease did not answer again within {timeout:.0f} s")
    reward = retry_until("an episode after the agent pod's deletion", lambda: episode(fleet, task), timeout)
    row["episode_again_seconds"] = round(time.monotonic() - start, 2)
    row["episode_reward"] = reward
    row["ok"] = "held_lease_back_seconds" in row
    return row


def fresh_step(url: str, token: str, context: ssl.SSLContext, replica_id: str, lease_id: str) -> None:
    """One step on a connection of its own, as a client without keep-alive makes: the Service picks a gateway pod
    for each, so the killed one is tried as often as its sibling until Kubernetes takes it out of the Service."""
    body = {"lease_id": lease_id, "action_id": uuid.uuid4().hex, "actions": [WAIT], "observe": False}
    req = urllib.request.Request(
        f"{url}/v1/replicas/{replica_id}/step",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Connection": "close"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:  # an answer: the gateway's status is what is counted
        exc.close()
        raise
    except urllib.error.URLError as exc:  # the cause by its own kind: ConnectionRefusedError, TimeoutError...
        raise exc.reason if isinstance(exc.reason, BaseException) else exc from None


def ready_pods(kubectl: Kubectl, selector: str, count: int, timeout: float, say: Say, what: str) -> list[dict]:
    """Wait until ``count`` pods of ``selector`` are Ready: a fault is injected into a steady stack only. After the
    agent pod's deletion the gateways are out of their Service until their health polls see the new agent and the
    kubelet's next probe says so (periods of seconds), which an episode through the Service may well beat."""
    start = time.monotonic()
    said = False
    while True:
        ready = [p for p in pods(kubectl, selector) if is_ready(p)]
        if len(ready) >= count:
            return ready
        if time.monotonic() - start >= timeout:
            raise OsfleetError(f"{len(ready)} Ready {what} pod(s) after {timeout:.0f} s; the stack runs {count}")
        if not said:
            say(f"  waiting for {count} Ready {what} pods ({len(ready)} now, at most {timeout:.0f} s)")
            said = True
        time.sleep(1.0)


def gateway_killed(d: Deployed, kubectl: Kubectl, held: Any, timeout: float, say: Say) -> dict:
    waited = time.monotonic()
    gateways = ready_pods(kubectl, GATEWAY, 2, timeout, say, "gateway")
    waited_s = round(time.monotonic() - waited, 2)
    victim = gateways[0]
    name, uid, before = victim["metadata"]["name"], victim["metadata"]["uid"], restarts(victim)
    pids = pod_processes(uid, ("osfleet", "fleet", "serve"))
    if not pids:
        raise OsfleetError(f"no 'osfleet fleet serve' process of pod {name} on this machine")
    probes = {
        "sdk": Probe(lambda: held.step(WAIT, observe=False)),  # the client's pooled connection, as an agent's
        "fresh_connections": Probe(lambda: fresh_step(d.url, d.token, d.context, held.replica_id, held.lease_id)),
    }
    for probe in probes.values():
        probe.start()
    time.sleep(2.0)  # good answers before the kill, so a stretch is measured from the last one
    say(f"  SIGKILL to gateway pod {name}'s process {pids[0]}")
    killed_at = time.monotonic()
    os.kill(pids[0], signal.SIGKILL)
    row: dict[str, Any] = {"pod": name, "waited_for_ready_gateways_seconds": waited_s}
    try:
        while time.monotonic() - killed_at < timeout:
            back = {p["metadata"]["uid"]: p for p in pods(kubectl, GATEWAY)}.get(uid)
            if back is not None and restarts(back) > before and is_ready(back):
                row["pod_ready_again_seconds"] = round(time.monotonic() - killed_at, 2)
                break
            time.sleep(0.5)
        time.sleep(max(0.0, GATEWAY_WATCH_SECONDS - (time.monotonic() - killed_at)))
    finally:
        for probe in probes.values():
            probe.stop()
    for key, probe in probes.items():
        row[key] = summarise(probe.calls)
    last_good = all(p.calls and p.calls[-1][1] is None for p in probes.values())
    row["ok"] = "pod_ready_again_seconds" in row and last_good
    return row


def node_drained(kubectl: Kubectl, node: str, fleet: Any, held: Any, task: str, timeout: float, say: Say) -> dict:
    from osfleet.client.errors import InfrastructureError

    say(f"  kubectl drain {node} --ignore-daemonsets (the gateway pods kept: the lab's only real node)")
    start = time.monotonic()
    row: dict[str, Any] = {"node": node}
    try:
        kubectl(["drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s",
                 "--pod-selector", "app.kubernetes.io/name!=osfleet-gateway"], timeout=180)  # fmt: skip
        row["drain_seconds"] = round(time.monotonic() - start, 2)
        while time.monotonic() - start < timeout:
            try:
                held.step(WAIT, observe=False)
            except InfrastructureError as exc:
                row["held_lease_ended_seconds"] = round(time.monotonic() - start, 2)
                row["held_lease_answer"] = f"{outcome(exc)}: {exc}"
                break
            time.sleep(0.5)
        try:
            row["evaluate_answer"] = f"reward {held.evaluate().reward}"  # a reward here is the failure
        except Exception as exc:  # the answer expected: a 503 infrastructure failure
            row["evaluate_answer"] = f"{outcome(exc)}: {exc}"
        try:
            fleet.lease(HOLDER, wait=5).release()
            row["new_lease_answer"] = "leased"
        except Exception as exc:  # nothing to lease while the only KVM node is drained
            row["new_lease_answer"] = f"{outcome(exc)}: {exc}"
    finally:
        say(f"  kubectl uncordon {node}")
        back = time.monotonic()
        kubectl(["uncordon", node])
    row["episode_reward"] = retry_until("an episode after uncordon", lambda: episode(fleet, task), timeout)
    row["episode_again_seconds"] = round(time.monotonic() - back, 2)
    row["ok"] = "held_lease_ended_seconds" in row and row["evaluate_answer"].startswith("InfrastructureError 503")
    return row


def run(settings: Settings, say: Say, task: str = "cli-write-note", timeout: float = 300.0) -> dict[str, Any]:
    from osfleet.client import Fleet
    from osfleet.client.transport import RetryPolicy

    _, kubectl = lab_kubectl(settings, "osfleet lab k8s up")
    refuse_if_stack_up(kubectl)
    image = built_image(settings)
    nodes = real_nodes(kubectl)
    if not nodes:
        raise ConfigError("the k8s lab has no real node: osfleet lab k8s down, then osfleet lab k8s up")
    node = nodes[0]
    result: dict[str, Any] = {"image": image, "node": node, "task": task}
    config = {"osfleet:warm": "2", "osfleet:locustWorkers": "0"}
    with throwaway_stack(STACK, image, settings, say, config) as d:
        result["up_seconds"] = d.up_seconds
        fleet = Fleet(d.url, d.token, verify=d.context, retry=RetryPolicy(attempts=1))
        try:
            result.update(_faults(d, kubectl, node, fleet, task, timeout, say))
        finally:
            fleet.close()
    result["destroy_seconds"] = d.destroy_seconds
    result["replica_domains_after_destroy"] = replica_domains(settings)
    faults_ok = all(result[k]["ok"] for k in ("agent_pod_deleted", "gateway_pod_killed", "node_drained"))
    result["ok"] = faults_ok and result["replica_domains_after_destroy"] == 0
    return result


def replica_domains(settings: Settings) -> int:
    """The stack's replica domains on this machine's node: an uninstall must leave none running (the agent tears
    them down when its DaemonSet goes, ``osfleet/api/uninstall.py``)."""
    from osfleet.vm.virt import Virt

    with Virt(settings.libvirt_uri) as virt:
        return len(virt.names(LAB_CONFIG["osfleet:namePrefix"]))


def _faults(d: Deployed, kubectl: Kubectl, node: str, fleet: Any, task: str, timeout: float, say: Say) -> dict:
    out: dict[str, Any] = {}
    say("  a first episode through fleetUrl")
    start = time.monotonic()
    out["first_episode_reward"] = retry_until("a first episode", lambda: episode(fleet, task), timeout)
    out["first_episode_seconds"] = round(time.monotonic() - start, 2)
    held = retry_until("a lease to hold", lambda: fleet.lease(HOLDER, ttl=3600), timeout)
    try:
        held.reset(task)
        out["held_replica"] = held.replica_id
        say("[1/3] the agent pod deleted")
        out["agent_pod_deleted"] = agent_deleted(kubectl, node, fleet, held, task, timeout, say)
        say("[2/3] a gateway pod killed")
        out["gateway_pod_killed"] = gateway_killed(d, kubectl, held, timeout, say)
        say("[3/3] the node drained")
        out["node_drained"] = node_drained(kubectl, node, fleet, held, task, timeout, say)
    finally:
        with contextlib.suppress(Exception):  # the lease may have ended with the drain; destroy removes the rest
            held.release()
    return out


def _calls(probe: dict[str, Any]) -> str:
    return f"{probe['failed']} of {probe['calls']} calls failed, {probe['longest_without_answer_seconds']} s without"


def table(result: dict[str, Any]) -> str:
    """The three faults as a Markdown table (the benchmark page's)."""
    a, g, n = result["agent_pod_deleted"], result["gateway_pod_killed"], result["node_drained"]
    rows = [
        ("agent pod deleted", f"new pod Ready {a.get('new_pod_ready_seconds', '-')} s; held lease answers again "
         f"{a.get('held_lease_back_seconds', 'never')} s; new episode {a['episode_again_seconds']} s",
         ", ".join(f"{k} x{v}" for k, v in a["held_lease_errors"].items()) or "none"),
        ("gateway pod killed", f"SDK: {_calls(g['sdk'])}; a connection per call: {_calls(g['fresh_connections'])}; "
         f"pod Ready again {g.get('pod_ready_again_seconds', '-')} s",
         ", ".join(f"{k} x{v}" for k, v in {**g["sdk"]["failures"], **g["fresh_connections"]["failures"]}.items())
         or "none"),
        ("node drained", f"held lease ended {n.get('held_lease_ended_seconds', 'never')} s; new episode "
         f"{n['episode_again_seconds']} s after uncordon", f"evaluate: {n['evaluate_answer']}"),
    ]  # fmt: skip
    lines = ["| fault | recovery | what the held lease got |", "|---|---|---|"]
    lines += [f"| {f} | {r} | {e} |" for f, r, e in rows]
    lines.append(f"| `pulumi destroy` | {result['destroy_seconds']} s | "
                 f"{result['replica_domains_after_destroy']} replica domain(s) left on the node |")  # fmt: skip
    return "\n".join(lines)


@click.command("k8s-faults")
@click.option("--task", default="cli-write-note", show_default=True, help="the task of each episode")
@click.option("--timeout", default=300.0, show_default=True, type=click.FloatRange(30, 3600),
              help="seconds each recovery may take before the run fails")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of a table")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON to this file")
def bench_k8s_faults(task: str, timeout: float, as_json: bool, out: Path | None) -> None:
    """The failures Kubernetes causes, each timed on the k8s lab: the agent pod deleted, a gateway pod killed,
    the node drained (needs `osfleet lab k8s up` and `osfleet image container`; exits 1 when one is not
    recovered from as it should be)."""
    import sys

    try:
        result = run(Settings.from_env(), lambda m: click.echo(m, err=True), task, timeout)
    except OsfleetError as exc:
        click.echo(f"osfleet: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    emit(result, as_json, out, table)
    if not result["ok"]:
        sys.exit(1)
