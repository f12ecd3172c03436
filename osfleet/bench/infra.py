"""``osfleet bench infra``: the whole Pulumi cycle against lab hosts with the real engine.

lab up -> pulumi up -> health -> second up (must change nothing) -> destroy -> leftovers -> lab down.
The stack is a throwaway one (``bench``, platform ``lab``) in a folder of its own, so the checkout's stack
files and the user's ``lab`` stack are never touched, and its state is removed at the end.
"""

from __future__ import annotations

import json
import secrets
import shutil
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from osfleet.config import Settings
from osfleet.errors import OsfleetError

Say = Callable[[str], None]
STACK = "bench"
HEALTH_TIMEOUT = 10.0


def _get(url: str, token: str | None = None, context: ssl.SSLContext | None = None) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=HEALTH_TIMEOUT, context=context) as resp:
            json.load(resp)
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, ValueError):
        return 0


def _changes(summary: Any) -> int:
    """Resources an update created, updated, replaced or deleted (everything but ``same``)."""
    counts = summary.resource_changes or {}
    return sum(n for kind, n in counts.items() if kind != "same")


def infra_leftovers(state: Any, settings: Settings) -> dict[str, int]:
    """What a destroyed stack must not leave on the lab hosts: domains, agent processes, agent folders,
    published images and saved states."""
    from osfleet.lab import net
    from osfleet.vm.virt import Virt

    out = {"domains": 0, "agent_processes": 0, "agent_folders": 0, "published_images": 0}
    with Virt(settings.libvirt_uri) as virt:
        for h in state.hosts:
            out["domains"] += len(virt.names(h.name_prefix))
    for h in state.hosts:
        sshd = {h.sshd_pid}
        out["agent_processes"] += len([p for p in net.namespace_pids(h.netns) if p not in sshd and _is_agent(p)])
        out["agent_folders"] += int((Path(h.home) / "agent").exists())
        images = Path(h.home) / "images"
        out["published_images"] += len(list(images.glob("golden-*"))) if images.exists() else 0
    return out


def _is_agent(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    return b"supervise.sh" in cmd or b"serve" in cmd


def run(hosts: int, warm: int, settings: Settings, say: Say) -> dict[str, Any]:
    from pulumi import automation as auto

    from osfleet.lab import lab as lab_ops
    from osfleet.lab.engine import call, engine_version, ensure_engine, purge_stack_files, stack, stack_files

    engine = engine_version(ensure_engine(settings, say))
    root = lab_ops.lab_root(settings)
    result: dict[str, Any] = {"engine": engine, "hosts": hosts, "warm": warm, "stack": STACK}
    say(f"[1/7] lab up --hosts {hosts}")
    t = time.monotonic()
    state = lab_ops.up(hosts, root, say)
    result["lab_up_seconds"] = round(time.monotonic() - t, 2)
    st = None
    work: Path | None = None  # made once the lab is up: a refused lab up leaves no folder behind
    try:
        scratch = settings.scratch_dir if settings.scratch_dir.exists() else None
        work = Path(tempfile.mkdtemp(prefix="osfleet-bench-infra-", dir=scratch))
        st = stack(STACK, settings, work_dir=work)
        st.set_config("osfleet:platform", auto.ConfigValue("lab"))
        st.set_config("osfleet:hosts", auto.ConfigValue(str(hosts)))
        st.set_config("osfleet:warm", auto.ConfigValue(str(warm)))
        st.set_config("osfleet:agentToken", auto.ConfigValue(secrets.token_hex(16), secret=True))

        say(f"[2/7] pulumi up ({engine}, stack {STACK})")
        t = time.monotonic()
        up = call(st.up, on_output=lambda line: say("  " + line.rstrip()))
        result["up_seconds"] = round(time.monotonic() - t, 2)
        result["up_changes"] = _changes(up.summary)

        say("[3/7] health of every host agent over https, verified against the stack's CA (caCert output)")
        from osfleet.tls import client_context

        urls: dict[str, str] = up.outputs["agents"].value
        token: str = up.outputs["agentToken"].value
        ctx = client_context(ca_pem=up.outputs["caCert"].value)
        health = {
            name: {"health": _get(f"{u}/health", context=ctx), "authorized": _get(f"{u}/v1/host", token, ctx)}
            for name, u in urls.items()
        }
        result["https"] = sum(1 for u in urls.values() if u.startswith("https://"))
        result["health"] = health
        result["hosts_healthy"] = sum(1 for h in health.values() if h["health"] == 200 and h["authorized"] == 200)
        result["golden_image"] = up.outputs["goldenImage"].value

        say("[4/7] second pulumi up (nothing may change)")
        t = time.monotonic()
        again = call(st.up, on_output=lambda line: say("  " + line.rstrip()))
        result["second_up_seconds"] = round(time.monotonic() - t, 2)
        result["second_up_changes"] = _changes(again.summary)

        say("[5/7] pulumi destroy")
        t = time.monotonic()
        call(st.destroy, on_output=lambda line: say("  " + line.rstrip()))
        result["destroy_seconds"] = round(time.monotonic() - t, 2)
        call(st.workspace.remove_stack, STACK)
        purge_stack_files(STACK, settings)
        st = None

        say("[6/7] leftovers on the lab hosts after destroy")
        after_destroy = infra_leftovers(state, settings)
    finally:
        if st is not None:  # a failed run: still take down what the stack made before the lab goes
            say("bench infra failed; destroying the stack")
            try:
                call(st.destroy, on_output=lambda line: say("  " + line.rstrip()))
                call(st.workspace.remove_stack, STACK)
                purge_stack_files(STACK, settings)
            except OsfleetError as exc:
                say(f"destroy after failure also failed: {exc}")
        say("[7/7] lab down")
        t = time.monotonic()
        lab_ops.down(root, say, settings.libvirt_uri)
        result["lab_down_seconds"] = round(time.monotonic() - t, 2)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    after_down = lab_ops.leftovers(root, settings.libvirt_uri)
    after_down.pop("state_hosts", None)
    result["leftovers"] = {
        **after_destroy,
        **{f"lab_{k}": v for k, v in after_down.items()},
        "engine_state_files": len(stack_files(STACK, settings)),
    }
    return result


@click.command("infra")
@click.option("--hosts", default=2, show_default=True, type=click.IntRange(1, 63), help="lab hosts")
@click.option("--warm", default=0, show_default=True, type=click.IntRange(0, 64), help="warm replicas per agent")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON to this file")
def bench_infra(hosts: int, warm: int, as_json: bool, out: Path | None) -> None:
    """Lab up, pulumi up, health, second up, destroy, leftovers, lab down, with the real engine."""
    import sys

    settings = Settings.from_env()
    try:
        result = run(hosts, warm, settings, lambda m: click.echo(m, err=True))
    except OsfleetError as exc:
        click.echo(f"osfleet: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(
        f"{result['engine']}: {result['hosts_healthy']}/{result['hosts']} hosts healthy, up {result['up_seconds']} s, "
        f"second up {result['second_up_changes']} changes, destroy {result['destroy_seconds']} s, "
        f"leftovers {sum(result['leftovers'].values())}"
    )
