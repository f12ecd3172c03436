"""``osfleet chaos``: inject one fault, undo it, list active ones, or play a plan of faults against a fleet."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import click

from osfleet.chaos import faults as F
from osfleet.chaos.hosts import LOCAL, ChaosHost, lab_hosts, local_host, resolve
from osfleet.chaos.runner import DEFAULT_HEAL_S, PICKS, ChaosPlan, ChaosRunner, FaultSpec, inject
from osfleet.config import Settings
from osfleet.errors import ConfigError
from osfleet.lab.cli import friendly as _friendly


def active_faults(settings: Settings | None = None) -> F.ActiveFaults:
    """Faults injected by ``chaos inject`` or a run and not healed yet (``$OSFLEET_HOME/chaos/active``)."""
    return F.ActiveFaults((settings or Settings.from_env()).home / "chaos" / "active")


def _show(fault: F.Fault, as_json: bool) -> None:
    if as_json:
        click.echo(fault.line())
        return
    healed = f"  healed: {fault.healed}" if fault.healed_at else ""
    click.echo(f"{fault.id}  {fault.kind}  {fault.target}  {fault.did}{healed}")


@click.group("chaos")
def chaos() -> None:
    """Inject faults into a running fleet, each by its own mechanism (see 'chaos inject --help')."""


@chaos.command("inject")
@click.argument("kind", type=click.Choice(F.KINDS))
@click.option("--host", default=LOCAL, show_default=True, help="'local' (this OSFLEET_HOME) or a lab host (lab1)")
@click.option("--replica", default=None, help=f"replica id, or one of {', '.join(PICKS)} (replica faults)")
@click.option("--seconds", type=float, default=None, help="heal after this long (else: leave it for 'chaos undo')")
@click.option("--pid", type=int, default=None, help="kill_host_agent: this pid instead of the records' owner")
@click.option("--delay-ms", type=int, default=200, show_default=True, help="delay_link: added delay")
@click.option("--floor-mib", type=int, default=F.DEFAULT_FLOOR_BYTES // 2**20, show_default=True,
              help="fill_image_store: MiB left free")  # fmt: skip
@click.option("--max-mib", type=int, default=None, help="fill_image_store: at most this many MiB")
@click.option("--dir", "directory", default=None, help="fill_image_store: this folder's file system, not the store")
@click.option("--json", "as_json", is_flag=True, help="the fault record as JSON")
@_friendly
def inject_cmd(
    kind: str,
    host: str,
    replica: str | None,
    seconds: float | None,
    pid: int | None,
    delay_ms: int,
    floor_mib: int,
    max_mib: int | None,
    directory: str | None,
    as_json: bool,
) -> None:
    """Inject one fault of KIND.

    \b
    kill_qemu         SIGKILL the replica's QEMU (pid from libvirt's pid file of its record's domain)
    freeze_qemu       SIGSTOP the replica's QEMU (guest agent hangs) until SIGCONT on heal
    delete_overlay    unlink the replica's top overlay while it runs
    kill_host_agent   SIGKILL the process that owns the host's replica records (or --pid)
    fill_image_store  a filler file in the host's image store down to --floor-mib free; heal removes it.
                      A file system over 8 GiB (the real disk) needs --max-mib and keeps 4 GiB free; give
                      the host a small store: mount -t tmpfs -o size=1g tmpfs <home>/images
    cut_link          lab host: netem loss 100% on its link (iptables DROP where the kernel has no netem)
    delay_link        lab host: netem delay --delay-ms on its link

    Healable faults are healed after --seconds (or on Ctrl-C), or left for 'osfleet chaos undo ID'.
    """
    if kind in F.REPLICA_KINDS and not replica:
        raise ConfigError(f"{kind} needs --replica (a replica id, or {' | '.join(PICKS)})")
    target = resolve(host)
    spec = FaultSpec(
        at=0, kind=kind, host=target.name, replica=replica or "any", seconds=seconds, delay_ms=delay_ms,  # type: ignore[arg-type]
        floor_mib=floor_mib, max_mib=max_mib, pid=pid, dir=directory,
    )  # fmt: skip
    store = active_faults()
    fault = inject(spec, target)
    if fault.self_healing:
        _show(fault, as_json)
        return
    store.save(fault)
    if seconds is None:
        _show(fault, as_json)
        if not as_json:
            click.echo(f"undo with: osfleet chaos undo {fault.id}")
        return
    if not as_json:
        _show(fault, False)
    try:
        time.sleep(seconds)
    finally:
        healed = store.heal(fault)
        _show(healed, as_json)


@chaos.command("undo")
@click.argument("fault_ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="every active fault")
@click.option("--json", "as_json", is_flag=True)
@_friendly
def undo_cmd(fault_ids: tuple[str, ...], all_: bool, as_json: bool) -> None:
    """Heal active faults by id (from 'chaos inject' or 'chaos ls'), or all of them."""
    store = active_faults()
    if not fault_ids and not all_:
        raise ConfigError("give fault ids or --all")
    targets = store.all() if all_ else [store.get(i) for i in fault_ids]
    if not targets and not as_json:
        click.echo("no active faults")
    for fault in targets:
        _show(store.heal(fault), as_json)


@chaos.command("ls")
@click.option("--json", "as_json", is_flag=True)
@_friendly
def ls_cmd(as_json: bool) -> None:
    """Faults injected and not healed yet."""
    active = active_faults().all()
    if as_json:
        click.echo(json.dumps([json.loads(f.line()) for f in active], indent=2))
        return
    for f in active:
        _show(f, False)
    if not active:
        click.echo("no active faults")


def fleet_hosts() -> list[ChaosHost]:
    """Every host a plan may name: this machine's osfleet ('local') and the lab's hosts."""
    return [local_host(), *lab_hosts()]


@chaos.command("run")
@click.argument("plan_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--run-dir", type=click.Path(path_type=Path), default=None,
              help="write faults.jsonl here (default runs/chaos-<timestamp>)")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True, help="seeds the choice of hosts and replicas")
@_friendly
def run_cmd(plan_file: Path, run_dir: Path | None, seed: int) -> None:
    """Play a plan of faults against the running fleet (YAML/JSON, times in seconds from the start):

    \b
    faults:
      - {at: 10, kind: kill_qemu, host: lab1, replica: leased}
      - {at: 30, kind: freeze_qemu, host: lab2, replica: any, seconds: 20}
      - {at: 60, kind: cut_link, host: lab1, seconds: 15}

    Each fault is one JSON line in RUN_DIR/faults.jsonl. Ctrl-C heals what is active and stops.
    """
    plan = ChaosPlan.load(plan_file)
    run_dir = run_dir or Path("runs") / time.strftime("chaos-%Y%m%d-%H%M%S")
    runner = ChaosRunner(plan, fleet_hosts(), say=click.echo, run_dir=run_dir, seed=seed, active=active_faults())
    stop = threading.Event()
    try:
        faults = runner.run_until(stop)
    except KeyboardInterrupt:
        stop.set()
        raise
    healed = sum(f.healed_at is not None for f in faults)
    click.echo(
        f"chaos: {len(faults)} fault(s) injected ({healed} healed, {sum(f.self_healing for f in faults)} "
        f"self-healing), {len(runner.failures)} refused; {run_dir / 'faults.jsonl'}"
    )


__all__ = ["DEFAULT_HEAL_S", "chaos"]
