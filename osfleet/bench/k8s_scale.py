"""``osfleet bench k8s-scale``: the ``k8s`` stack and its gateway at 10, 50, 200... hosts, by simulation.

A host of the ``k8s`` stack is a node labelled for KVM with an agent pod on it. On this machine only one node is
real; kwok plays the kubelet of the others (``osfleet lab k8s up --kwok-nodes N``): their agent pods are marked
Running and Ready at loopback addresses (``KWOK_POD_CIDR``) where nothing answers, so the gateway's discovery sees
every one of them and its health polling finds all but the real one unreachable, as it would hosts that are down.
That is what grows with a fleet: the Kubernetes objects Pulumi waits for, the pods and nodes the gateway watches,
the hosts it polls. What does not grow here, the replicas themselves, the other benchmarks measure.

For each size, ascending: the first ``size - 1`` kwok nodes get the KVM label (the rest lose it), then a throwaway
stack (``bench-k8s``, in a folder of its own: the checkout's ``Pulumi.k8s.yaml`` and a user's ``k8s`` stack are
never touched) is brought up with the real engine and provider, the gateway is asked until it lists every host and
has judged each (``discovered_seconds``, ``judged_seconds`` after ``up`` returned), the gateway replicas' and the
API server's CPU and memory are sampled from ``/proc`` while it polls, ``preview --expect-no-changes`` is timed,
and the stack destroyed. The labels are put back as they were, whatever happens.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from osfleet.bench.k8s_stack import Kubectl, built_image, is_kwok, lab_kubectl, refuse_if_stack_up, throwaway_stack
from osfleet.cli_support import emit
from osfleet.config import Settings
from osfleet.errors import ConfigError, OsfleetError

Say = Callable[[str], None]
STACK = "bench-k8s"
KVM_LABEL = "osfleet.io/kvm"
DISCOVERY_TIMEOUT = 600.0
CLK_TCK = 100  # /proc's clock ticks per second on Linux (os.sysconf("SC_CLK_TCK"), fixed at 100 on x86)


def parse_sizes(text: str) -> list[int]:
    """``10,50,200`` as ascending host counts (each at least 1, no repeats)."""
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ConfigError(f"--hosts {text!r}: expected host counts separated by commas, e.g. 10,50,200") from None
    if not sizes or sizes[0] < 1:
        raise ConfigError(f"--hosts {text!r}: every size must be at least 1 host")
    return sizes


def label_plan(kwok_nodes: list[str], hosts: int) -> tuple[list[str], list[str]]:
    """(nodes to label for KVM, nodes to unlabel) so that the real node and ``hosts - 1`` kwok nodes are hosts."""
    wanted = hosts - 1
    if wanted > len(kwok_nodes):
        raise ConfigError(
            f"{hosts} hosts need {wanted} kwok nodes and the lab has {len(kwok_nodes)}: "
            f"osfleet lab k8s down, then osfleet lab k8s up --kwok-nodes {wanted}"
        )
    ordered = sorted(kwok_nodes, key=_node_number)
    return ordered[:wanted], ordered[wanted:]


def _node_number(name: str) -> tuple[int, str]:
    tail = name.rsplit("-", 1)[-1]
    return (int(tail), name) if tail.isdigit() else (1 << 30, name)


# --- what a process costs, from /proc ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessSample:
    pid: int
    cpu_ticks: int  # user + system, in clock ticks
    rss_bytes: int


def sample_process(pid: int, proc: Path = Path("/proc")) -> ProcessSample | None:
    """The process's CPU time so far and resident memory; None when it is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        status = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 3 of stat(5)
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    rss_kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return ProcessSample(pid, ticks, rss_kib * 1024)


def find_processes(words: tuple[str, ...], proc: Path = Path("/proc")) -> list[int]:
    """Pids whose command line holds ``words`` in that order as consecutive arguments (``osfleet fleet serve``)."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        names = [Path(a).name for a in args]
        n = len(words)
        if any(tuple(names[i : i + n]) == words for i in range(len(names) - n + 1)):
            found.append(int(entry.name))
    return sorted(found)


def cost_over(pids: list[int], seconds: float, proc: Path = Path("/proc")) -> list[dict[str, float]]:
    """Each process's CPU (percent of one core) and RSS (MiB) over ``seconds`` of its life."""
    before = {p: s for p in pids if (s := sample_process(p, proc)) is not None}
    start = time.monotonic()
    time.sleep(seconds)
    took = time.monotonic() - start
    out = []
    for pid, first in before.items():
        last = sample_process(pid, proc)
        if last is None:
            continue
        cpu = (last.cpu_ticks - first.cpu_ticks) / CLK_TCK / took * 100
        out.append({"pid": pid, "cpu_percent": round(cpu, 1), "rss_mib": round(last.rss_bytes / 2**20, 1)})
    return out


# --- the gateway's view -------------------------------------------------------------------------------------------
def gateway_hosts(url: str, token: str, context: ssl.SSLContext) -> dict[str, dict[str, Any]] | None:
    """The gateway's hosts and their state (its operator's ``/health``), or None while it does not answer."""
    req = urllib.request.Request(f"{url}/health", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as exc:  # 503 while no host is healthy: still an answer with the hosts
        try:
            body = json.load(exc)
        except ValueError:
            return None
    except (urllib.error.URLError, OSError, ValueError):
        return None
    hosts = body.get("hosts") if isinstance(body, dict) else None
    return hosts if isinstance(hosts, dict) else None


def judged(hosts: dict[str, dict[str, Any]]) -> bool:
    """Every host polled at least once: healthy, or unhealthy with a reason."""
    return all(h.get("healthy") or h.get("reason") for h in hosts.values())


def wait_for_gateway(
    url: str, token: str, context: ssl.SSLContext, expected: int, timeout: float = DISCOVERY_TIMEOUT
) -> dict[str, Any]:
    """Seconds until the gateway lists ``expected`` hosts, and until it has judged them all."""
    start, seen_at, hosts = time.monotonic(), None, None
    while time.monotonic() - start < timeout:
        hosts = gateway_hosts(url, token, context)
        if hosts is not None and len(hosts) >= expected:
            seen_at = seen_at or time.monotonic() - start
            if judged(hosts):
                return {
                    "discovered_seconds": round(seen_at, 2),
                    "judged_seconds": round(time.monotonic() - start, 2),
                    "hosts_seen": len(hosts),
                    "healthy": sum(1 for h in hosts.values() if h.get("healthy")),
                }
        time.sleep(0.5)
    seen = 0 if hosts is None else len(hosts)
    raise OsfleetError(f"the gateway listed {seen} of {expected} hosts after {timeout:.0f} s")


# --- one run ------------------------------------------------------------------------------------------------------
def kwok_nodes(kubectl: Kubectl) -> dict[str, bool]:
    """The kwok nodes and whether each carries the KVM label now."""
    out = json.loads(kubectl(["get", "nodes", "-o", "json"]))
    nodes = {}
    for node in out.get("items", []):
        meta = node.get("metadata", {})
        if is_kwok(node):
            nodes[meta["name"]] = meta.get("labels", {}).get(KVM_LABEL) == "true"
    return nodes


def set_labels(kubectl: Kubectl, label: list[str], unlabel: list[str]) -> None:
    for i in range(0, len(label), 100):
        if chunk := label[i : i + 100]:
            kubectl(["label", "node", "--overwrite", *chunk, f"{KVM_LABEL}=true"])
    for i in range(0, len(unlabel), 100):
        if chunk := unlabel[i : i + 100]:
            kubectl(["label", "node", *chunk, f"{KVM_LABEL}-"])


@contextmanager
def labels_put_back(kubectl: Kubectl, before: dict[str, bool], say: Say) -> Iterator[None]:
    try:
        yield
    finally:
        say("putting the kwok nodes' KVM labels back as they were")
        try:
            set_labels(kubectl, [n for n, on in before.items() if on], [n for n, on in before.items() if not on])
        except OsfleetError as exc:
            say(f"could not put the labels back: {exc}")


def _preflight(settings: Settings, sizes: list[int]) -> tuple[Kubectl, dict[str, bool], str]:
    _, kubectl = lab_kubectl(settings, f"osfleet lab k8s up --kwok-nodes {max(sizes) - 1}")
    refuse_if_stack_up(kubectl)
    nodes = kwok_nodes(kubectl)
    label_plan(list(nodes), max(sizes))  # enough kwok nodes for the largest size, or say how to get them
    return kubectl, nodes, built_image(settings)


def run(sizes: list[int], settings: Settings, say: Say, sample_seconds: float = 30.0) -> dict[str, Any]:
    from osfleet.lab.engine import engine_version, ensure_engine

    kubectl, before, image = _preflight(settings, sizes)
    result: dict[str, Any] = {
        "engine": engine_version(ensure_engine(settings, say)),
        "image": image,
        "kwok_nodes": len(before),
        "sample_seconds": sample_seconds,
        "sizes": [],
    }
    with labels_put_back(kubectl, before, say):
        for i, hosts in enumerate(sizes, 1):
            say(f"[{i}/{len(sizes)}] {hosts} hosts (this machine's node and {hosts - 1} kwok nodes)")
            label, unlabel = label_plan(list(before), hosts)
            set_labels(kubectl, label, unlabel)
            result["sizes"].append(one_size(hosts, image, settings, say, sample_seconds))
    return result


def one_size(hosts: int, image: str, settings: Settings, say: Say, sample_seconds: float) -> dict[str, Any]:
    """Up, the gateway's discovery, its cost while polling, preview, destroy: one size's row."""
    from osfleet.lab.engine import call

    row: dict[str, Any] = {"hosts": hosts}
    echo = lambda line: say("    " + line.rstrip())  # noqa: E731
    with throwaway_stack(STACK, image, settings, say, {"osfleet:warm": "0", "osfleet:locustWorkers": "0"}) as d:
        row["up_seconds"], row["up_changes"] = d.up_seconds, d.up_changes
        say(f"  the gateway's discovery of {hosts} hosts")
        row.update(wait_for_gateway(d.url, d.token, d.context, hosts))
        say(f"  the gateway's and the API server's cost while polling, {sample_seconds:.0f} s")
        gateways = find_processes(("osfleet", "fleet", "serve"))
        apiserver = find_processes(("kube-apiserver",))
        costs = cost_over(gateways + apiserver, sample_seconds)
        row["gateway"] = [c for c in costs if c["pid"] in gateways]
        row["apiserver"] = [c for c in costs if c["pid"] in apiserver]
        say("  pulumi preview --expect-no-changes")
        t = time.monotonic()
        preview = call(d.stack.preview, expect_no_changes=True, on_output=echo)
        row["preview_seconds"] = round(time.monotonic() - t, 2)
        row["preview_changes"] = sum(n for k, n in (preview.change_summary or {}).items() if k != "same")
    row["destroy_seconds"] = d.destroy_seconds
    return row


def table(result: dict[str, Any]) -> str:
    """The rows as a Markdown table (the benchmark page's)."""
    lines = [
        "| hosts | `pulumi up` | gateway lists all | … and judged all | gateway CPU | gateway RSS | "
        "API server CPU | `preview` | `destroy` |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["sizes"]:
        gw_cpu = max((g["cpu_percent"] for g in r.get("gateway", [])), default=0.0)
        gw_rss = max((g["rss_mib"] for g in r.get("gateway", [])), default=0.0)
        api = sum(a["cpu_percent"] for a in r.get("apiserver", []))
        lines.append(
            f"| {r['hosts']} | {r.get('up_seconds', '-')} s | {r.get('discovered_seconds', '-')} s | "
            f"{r.get('judged_seconds', '-')} s | {gw_cpu} % | {gw_rss} MiB | {api:.1f} % | "
            f"{r.get('preview_seconds', '-')} s | {r.get('destroy_seconds', '-')} s |"
        )
    return "\n".join(lines)


@click.command("k8s-scale")
@click.option("--hosts", "sizes_text", default="10,50,200", show_default=True,
              help="host counts, comma-separated (the lab needs the largest minus one kwok nodes)")  # fmt: skip
@click.option("--sample", "sample_seconds", default=30.0, show_default=True, type=click.FloatRange(5, 600),
              help="seconds the gateway's CPU and memory are sampled at each size")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of a table")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON to this file")
def bench_k8s_scale(sizes_text: str, sample_seconds: float, as_json: bool, out: Path | None) -> None:
    """The k8s stack at each size of kwok-simulated hosts: pulumi up, preview and destroy times, the gateway's
    discovery and its CPU and memory while it polls (needs `osfleet lab k8s up --kwok-nodes N` and
    `osfleet image container`)."""
    import sys

    try:
        sizes = parse_sizes(sizes_text)
        result = run(sizes, Settings.from_env(), lambda m: click.echo(m, err=True), sample_seconds)
    except OsfleetError as exc:
        click.echo(f"osfleet: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    emit(result, as_json, out, table)
