"""``osfleet replicas ...``: this host's replicas by hand (bring up, list, screenshot, reset, fork, tear down)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from osfleet.cli_support import friendly as _friendly
from osfleet.config import Settings
from osfleet.errors import OsfleetError
from osfleet.protocol.models import MODES, Mode

F = TypeVar("F", bound=Callable[..., Any])


# --- replicas ----------------------------------------------------------------------------------------------
@click.group()
def replicas() -> None:
    """Replicas on this host: bring up, list, screenshot, reset, tear down."""


def _replica_host(image_ref: str | None, mode: Mode = "snapshot") -> Any:
    from osfleet.replicas.manager import ReplicaHost
    from osfleet.vm.images import find_image

    settings = Settings.from_env()
    return ReplicaHost(find_image(image_ref, settings), settings, mode=mode, say=lambda m: click.echo(m, err=True))


def _refuse_foreign(report: Any, ids: list[str]) -> None:
    foreign = [i for i in ids if i in report.foreign]
    if foreign:
        raise OsfleetError(
            f"replica {', '.join(foreign)} is managed by another running process (a host agent?): use its API"
        )


@replicas.command("up")
@click.option("--count", default=1, show_default=True, type=click.IntRange(1, 4096))
@click.option(
    "--mode",
    type=click.Choice(MODES),
    default="snapshot",
    show_default=True,
    help="snapshot: restore a saved running desktop; cold: boot",
)
@click.option("--image", "image_ref", default=None, help="golden image (default: newest)")
@_friendly
def replicas_up(count: int, mode: Mode, image_ref: str | None) -> None:
    """Bring up COUNT replicas and leave them running (adopting any left by an earlier run)."""
    with _replica_host(image_ref, mode) as host:
        report = host.adopt()
        if report.cleaned or report.orphan_domains:
            click.echo(
                f"cleaned up {len(report.cleaned)} half-made replica(s), {len(report.orphan_domains)} orphan domain(s)"
            )
        made = 0
        try:
            for i in range(count):
                t = host.create()
                made += 1
                click.echo(f"{t.replica}  ready in {t.seconds:.2f} s  ({i + 1}/{count}, {mode})")
        except KeyboardInterrupt:
            half = [r.id for r in host.replicas() if r.state.value in ("provisioning", "booting")]
            host.down(half)
            click.echo(
                f"interrupted: {made} replica(s) made are left running (osfleet replicas ls); "
                f"{len(half)} half-made one(s) removed",
                err=True,
            )
            raise


@replicas.command("ls")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@_friendly
def replicas_ls(as_json: bool) -> None:
    """List this host's replicas from their records, with whether their domain is running."""
    from osfleet.replicas.records import RecordStore
    from osfleet.vm.virt import Virt

    settings = Settings.from_env()
    records, _ = RecordStore(settings.replicas_dir).load_all()
    with Virt(settings.libvirt_uri) as virt:
        rows = [(r, virt.is_running(r.domain)) for r in records]
    if as_json:
        click.echo(json.dumps([{**r.model_dump(mode="json"), "running": up} for r, up in rows], indent=2))
        return
    if not rows:
        click.echo("no replicas (osfleet replicas up)")
    for r, up in rows:
        click.echo(
            f"{r.id}  {r.state:<10} {'running' if up else 'stopped':<8} gen {r.generation:<4} {r.mode:<8} "
            f"{r.hostname}  {r.image}{'  ' + r.error if r.error else ''}"
        )


@replicas.command("screenshot")
@click.argument("replica_id")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="file to write (default: ID.png)")
@click.option("--jpeg", is_flag=True, help="JPEG instead of PNG")
@_friendly
def replicas_screenshot(replica_id: str, out: Path | None, jpeg: bool) -> None:
    """Save a replica's screen (taken from the hypervisor's framebuffer)."""
    from osfleet.replicas.records import RecordStore

    settings = Settings.from_env()
    records, _ = RecordStore(settings.replicas_dir).load_all()
    rec = next((r for r in records if r.id == replica_id), None)
    if rec is None:
        raise OsfleetError(f"no replica {replica_id} (see 'osfleet replicas ls')")
    import io

    from osfleet.vm.virt import Virt

    with Virt(settings.libvirt_uri) as virt:
        if not virt.is_running(rec.domain):
            raise OsfleetError(f"replica {replica_id} is {rec.state} and its domain is not running")
        buf = io.BytesIO()
        virt.screenshot(rec.domain).save(buf, "JPEG" if jpeg else "PNG")
        data = buf.getvalue()
    path = out or Path(f"{replica_id}.{'jpg' if jpeg else 'png'}")
    path.write_bytes(data)
    click.echo(path)


@replicas.command("reset")
@click.argument("replica_id")
@click.option("--mode", type=click.Choice(MODES), default=None, help="default: the replica's own mode")
@_friendly
def replicas_reset(replica_id: str, mode: Mode | None) -> None:
    """Reset a replica to its exact initial state."""
    from osfleet.replicas.records import RecordStore

    settings = Settings.from_env()
    records, _ = RecordStore(settings.replicas_dir).load_all()
    rec = next((r for r in records if r.id == replica_id), None)
    if rec is None:
        raise OsfleetError(f"no replica {replica_id} (see 'osfleet replicas ls')")
    with _replica_host(rec.image, mode or rec.mode) as host:
        _refuse_foreign(host.adopt(), [replica_id])
        t = host.reset(replica_id)
    click.echo(f"{replica_id}  reset ({t.mode}) in {t.seconds:.2f} s")


@replicas.command("fork")
@click.argument("replica_id")
@click.option("--children", default=1, show_default=True, type=click.IntRange(1, 64), help="replicas to start from it")
@_friendly
def replicas_fork(replica_id: str, children: int) -> None:
    """Save a running, unleased replica and start CHILDREN replicas from that exact state (left ready).

    A leased replica is forked by its lease holder through the API (POST /v1/replicas/ID/fork)."""
    from osfleet.replicas.records import RecordStore

    settings = Settings.from_env()
    records, _ = RecordStore(settings.replicas_dir).load_all()
    rec = next((r for r in records if r.id == replica_id), None)
    if rec is None:
        raise OsfleetError(f"no replica {replica_id} (see 'osfleet replicas ls')")
    with _replica_host(rec.image, rec.mode) as host:
        _refuse_foreign(host.adopt(), [replica_id])
        forked = host.fork(replica_id, children)
    click.echo(
        f"{replica_id}  forked as {forked.fork_id} ({forked.memory_mode} memory): saved in "
        f"{forked.save_seconds:.2f} s, {len(forked.children)} child(ren) ready in {forked.total_seconds:.2f} s"
    )
    for child in forked.children:
        click.echo(f"{child.record.id}  ready in {child.seconds:.2f} s")


@replicas.command("down")
@click.argument("replica_ids", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="every replica on this host, whatever its image")
@click.option("--states", is_flag=True, help="with --all: also delete the saved running states and every checkpoint")
@click.option("--force", is_flag=True, help="with --all: even while another process (a host agent) manages replicas")
@_friendly
def replicas_down(replica_ids: tuple[str, ...], everything: bool, states: bool, force: bool) -> None:
    """Tear replicas down in parallel: their domains, overlays and records, and nothing else."""
    from osfleet.replicas.manager import teardown_all
    from osfleet.replicas.records import RecordStore

    settings = Settings.from_env()
    if everything:
        n_domains, n_records = teardown_all(settings, states, force)
        click.echo(f"destroyed {n_domains} domain(s), removed {n_records} replica record(s)")
        return
    if not replica_ids:
        raise OsfleetError("name the replicas to tear down, or pass --all")
    records, _ = RecordStore(settings.replicas_dir).load_all()
    known = {r.id: r for r in records}
    missing = [i for i in replica_ids if i not in known]
    if missing:
        raise OsfleetError(f"no replica {', '.join(missing)} (see 'osfleet replicas ls')")
    by_image: dict[str, list[str]] = {}
    for i in replica_ids:
        by_image.setdefault(known[i].image, []).append(i)
    for image_name, ids in by_image.items():
        with _replica_host(image_name) as host:
            _refuse_foreign(host.adopt(), ids)
            host.down(ids)
    click.echo(f"removed {len(replica_ids)} replica(s)")


# --- checkpoints -------------------------------------------------------------------------------------------
@click.group()
def checkpoints() -> None:
    """Checkpoints kept on this host (saved through the API: POST /v1/replicas/{id}/checkpoints)."""


def _book() -> Any:
    from osfleet.replicas.checkpoints import CheckpointBook

    settings = Settings.from_env()
    return CheckpointBook(settings.checkpoints_dir, settings.checkpoint_max_count, settings.checkpoint_max_bytes)


@checkpoints.command("ls")
@click.option("--client", "owner", default=None, help="only this client's (its name in the clients file)")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per checkpoint")
@_friendly
def checkpoints_ls(owner: str | None, as_json: bool) -> None:
    """Every checkpoint on this host: its client, name, image, size and age."""
    import time

    book = _book()
    found = book.list(owner) if owner is not None else book.all()
    for c in sorted(found, key=lambda c: (c.owner, c.created_at)):
        if as_json:
            click.echo(json.dumps({k: v for k, v in c.__dict__.items() if k != "task"} | {"bytes": c.bytes}))
        else:
            age = (time.time() - c.created_at) / 3600
            click.echo(f"{c.owner:20} {c.name:32} {c.image:28} {c.bytes / 2**20:8.0f} MiB {age:6.1f} h")
    if not found and not as_json:
        click.echo("no checkpoints", err=True)


@checkpoints.command("rm")
@click.argument("name")
@click.option(
    "--client", "owner", required=True, help="the client that keeps it (its name in the clients file; 'operator')"
)
@_friendly
def checkpoints_rm(name: str, owner: str) -> None:
    """Delete a client's checkpoint; its files go once no replica started from it uses them (now, when no host
    agent runs; else at the host agent's next collection)."""
    from osfleet.replicas.forks import remove_fork

    settings = Settings.from_env()
    book = _book()
    gone = book.remove(owner, name)
    with contextlib.suppress(OSError, ValueError):
        from osfleet.replicas.records import RecordStore, owned_by_other_live_process

        records, _ = RecordStore(settings.replicas_dir).load_all()
        directory = settings.forks_dir / gone.fork_id
        managed = any(owned_by_other_live_process(r) for r in records)  # a host agent collects it, not us
        used = any(str(Path(p).parent) == str(directory) for r in records for p in r.layers)
        if not managed and not used and gone.fork_id not in book.fork_ids():
            remove_fork(directory, settings.memory_dir)
    click.echo(f"deleted checkpoint {name} of client {owner}")
