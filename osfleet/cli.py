"""The ``osfleet`` command line. Every error a user can cause ends in one line on stderr and exit 1."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from osfleet import __version__, logs
from osfleet.cli_support import emit
from osfleet.cli_support import friendly as _friendly
from osfleet.config import MODES, Mode, Settings
from osfleet.errors import OsfleetError

F = TypeVar("F", bound=Callable[..., Any])


def _host(host: str | None, port: int, key: str | None) -> Any:
    """The target of a Fabric-backed command: this machine, or ``user@host`` over SSH."""
    from fabric import Connection
    from invoke import Context

    from osfleet.imaging.host import Host

    if not host:
        return Host(Context())
    connect_kwargs = {"key_filename": key} if key else {}
    return Host(Connection(host, port=port, connect_timeout=10, connect_kwargs=connect_kwargs))


_host_options = [
    click.option("--host", "host", default=None, help="run on user@host over SSH instead of this machine"),
    click.option("--port", default=22, show_default=True, help="SSH port of --host"),
    click.option("--key", default=None, help="SSH private key file for --host"),
]


def host_options(fn: F) -> F:
    for opt in reversed(_host_options):
        fn = opt(fn)
    return fn


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="osfleet")
@click.option(
    "--log-level",
    type=click.Choice(logs.LEVELS, case_sensitive=False),
    envvar=logs.ENV_VAR,
    default=logs.DEFAULT_LEVEL,
    show_default=True,
    show_envvar=True,
    help="log records at this level and above go to stderr",
)
def cli(log_level: str) -> None:
    """osfleet: fleets of copy-on-write desktop VM replicas for computer-use agents."""
    logs.configure(log_level)


# --- images ------------------------------------------------------------------------------------------------
@cli.group()
def image() -> None:
    """Build, publish, list and verify golden desktop images."""


@image.command("build")
@click.option(
    "--recipe",
    type=click.Path(path_type=Path),
    default=None,
    help="recipe YAML (default: the desktop recipe)",
)
@click.option("--out", default=None, help="output directory on the host (default: $OSFLEET_HOME/build)")
@host_options
@_friendly
def image_build(recipe: Path | None, out: str | None, host: str | None, port: int, key: str | None) -> None:
    """Build the golden image of a recipe; an unchanged recipe is a cache hit."""
    from osfleet.imaging import builder

    files = builder.build(_host(host, port, key), recipe or builder.DEFAULT_RECIPE, out)
    click.echo(files.disk)


@image.command("publish")
@click.argument("image_ref", required=False)
@click.option("--store", default=None, help="image store on the host (default: $OSFLEET_HOME/images)")
@host_options
@_friendly
def image_publish(image_ref: str | None, store: str | None, host: str | None, port: int, key: str | None) -> None:
    """Put a built image into a host's read-only image store (skipped when already there)."""
    from osfleet.images import find_image
    from osfleet.imaging import publisher

    img = find_image(image_ref, Settings.from_env())
    click.echo(publisher.publish(_host(host, port, key), img, store))


@image.command("ls")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@_friendly
def image_ls(as_json: bool) -> None:
    """List golden images on this machine (published first)."""
    from osfleet.images import list_images

    imgs = list_images(Settings.from_env())
    if as_json:
        click.echo(
            json.dumps([{"name": i.name, "disk": str(i.disk), "published": i.published} for i in imgs], indent=2)
        )
        return
    if not imgs:
        click.echo("no golden images (run 'osfleet image build')")
    for i in imgs:
        m = i.manifest
        click.echo(
            f"{i.name}  {'published' if i.published else 'built    '}  {m['disk_allocated_bytes'] / 2**20:7.1f} MiB"
            f"  built {m['built_at']}  {i.disk}"
        )


@image.command("verify")
@click.argument("image_ref", required=False)
@click.option("--screenshot", type=click.Path(path_type=Path), default=Path("verify.png"), show_default=True)
@click.option("--timeout", default=180.0, show_default=True, help="seconds to wait for a drawn desktop")
@_friendly
def image_verify(image_ref: str | None, screenshot: Path, timeout: float) -> None:
    """Boot a throwaway replica, wait for guest agent and drawn desktop, save its screenshot."""
    from osfleet.images import find_image
    from osfleet.verify import verify_image

    settings = Settings.from_env()
    res = verify_image(find_image(image_ref, settings), screenshot, settings, timeout)
    accel = "KVM" if res.accel == "kvm" else "TCG"
    click.echo(
        f"ok: guest agent after {res.agent_seconds:.1f} s, desktop drawn after {res.desktop_seconds:.1f} s "
        f"under {accel}; screenshot {screenshot}"
    )


# --- disks and accelerator ---------------------------------------------------------------------------------
@cli.group()
def disk() -> None:
    """Replica disks from golden images."""


@disk.command("provision")
@click.argument("image_ref")
@click.argument("dest_dir", type=click.Path(path_type=Path))
@click.option("--strategy", type=click.Choice(["overlay", "reflink", "full"]), default="overlay", show_default=True)
@click.option("--count", default=1, show_default=True, type=click.IntRange(1, 10000))
@_friendly
def disk_provision(image_ref: str, dest_dir: Path, strategy: str, count: int) -> None:
    """Create COUNT replica disks of an image in DEST_DIR; prints each path."""
    from osfleet import disks
    from osfleet.images import find_image

    img = find_image(image_ref, Settings.from_env())
    dest_dir.mkdir(parents=True, exist_ok=True)
    suffix = "qcow2" if strategy == "overlay" else "img"
    existing = len(list(dest_dir.glob(f"replica-*.{suffix}")))
    for i in range(existing, existing + count):
        dest = dest_dir / f"replica-{i:04d}.{suffix}"
        disks.provision(strategy, img.disk, dest)  # type: ignore[arg-type]
        click.echo(dest)


@cli.command("accel")
@click.option("--image", "image_ref", default=None, help="image whose kernel the probe boots (default: newest)")
@click.option("--refresh", is_flag=True, help="probe again instead of using the remembered answer")
@_friendly
def accel_cmd(image_ref: str | None, refresh: bool) -> None:
    """Print the accelerator guests really run under here: kvm, or qemu (TCG)."""
    from osfleet.accel import cached_reason, detect_accelerator
    from osfleet.images import find_image

    settings = Settings.from_env()
    accel = detect_accelerator(find_image(image_ref, settings).kernel, settings, refresh=refresh)
    click.echo(f"{accel}  ({cached_reason(settings)})")


# --- benchmarks --------------------------------------------------------------------------------------------
@cli.group()
def bench() -> None:
    """Benchmarks; each writes machine-readable results and prints only measured numbers."""
    import os

    os.environ.setdefault("OSFLEET_RECORD", "1")  # host agents a bench starts record episodes (osfleet.recording)


@bench.command("disk")
@click.option("--replicas", default=64, show_default=True, type=click.IntRange(1, 100000))
@click.option("--image", "image_ref", default=None, help="golden image (default: newest)")
@click.option(
    "--boot",
    default=0,
    show_default=True,
    type=click.IntRange(0, 64),
    help="also boot this many overlay replicas once and measure their disk use after boot",
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of a table")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON to this file")
@_friendly
def bench_disk(replicas: int, image_ref: str | None, boot: int, as_json: bool, out: Path | None) -> None:
    """Provision N replica disks by overlay, reflink and full copy, side by side, in one run."""
    from osfleet.bench import disk as disk_bench
    from osfleet.bench.tables import disk_table
    from osfleet.images import find_image

    settings = Settings.from_env()
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    result = disk_bench.run(find_image(image_ref, settings), replicas, settings, boot=boot, say=say)
    emit(result, as_json, out, disk_table)


@bench.command("all")
@click.option("--replicas", default=64, show_default=True, type=click.IntRange(1, 100000), help="disk bench size")
@click.option("--reset-replicas", default=2, show_default=True, type=click.IntRange(1, 256), help="reset bench size")
@click.option(
    "--resets", default=1, show_default=True, type=click.IntRange(1, 1000), help="resets per replica and mode"
)
@click.option("--bringup-replicas", default=4, show_default=True, type=click.IntRange(1, 4096))
@click.option("--users", default=2, show_default=True, type=click.IntRange(1, 10000), help="Locust agents")
@click.option("--duration", default="90s", show_default=True, help="trajectories run time (Locust -t syntax)")
@click.option("--policy", type=click.Choice(["oracle", "random"]), default="oracle", show_default=True)
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
@_friendly
def bench_all(
    replicas: int,
    reset_replicas: int,
    resets: int,
    bringup_replicas: int,
    users: int,
    duration: str,
    policy: str,
    runs_dir: Path,
) -> None:
    """The main job: image -> replica + screenshot -> disk and reset benches -> 2 lab hosts, pulumi up --stack lab,
    a fleet gateway -> Locust bring-up and trajectories through it -> pulumi destroy, lab down -> report, in
    runs/<timestamp>/."""
    from osfleet.bench import main_job

    main_job.run(runs_dir, replicas, reset_replicas, resets, bringup_replicas, users, duration, policy)


@bench.command("reset")
@click.option("--replicas", default=2, show_default=True, type=click.IntRange(1, 256))
@click.option(
    "--resets", default=3, show_default=True, type=click.IntRange(1, 1000), help="resets per replica and mode"
)
@click.option("--image", "image_ref", default=None, help="golden image (default: newest)")
@click.option("--hold", is_flag=True, help="also bring up as many snapshot replicas as fit and count them")
@click.option("--hold-max", default=64, show_default=True, type=click.IntRange(1, 4096))
@click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of a summary")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON to this file")
@_friendly
def bench_reset(
    replicas: int, resets: int, image_ref: str | None, hold: bool, hold_max: int, as_json: bool, out: Path | None
) -> None:
    """Cold vs snapshot resets on N replicas in one run: p50/p95, bring-up, latencies, RAM per replica."""
    from osfleet.bench import reset as reset_bench
    from osfleet.bench.tables import reset_table
    from osfleet.images import find_image

    settings = Settings.from_env()
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    result = reset_bench.run(find_image(image_ref, settings), replicas, resets, hold, hold_max, settings, say)
    emit(result, as_json, out, reset_table)


@bench.command("fork")
@click.option("--children", default=8, show_default=True, type=click.IntRange(2, 64))
@click.option("--image", "image_ref", default=None, help="golden image (default: newest)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of a summary")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON to this file")
@_friendly
def bench_fork(children: int, image_ref: str | None, as_json: bool, out: Path | None) -> None:
    """Fork a replica mid-task N ways: same state in every child, diverging input, timings, clean-up."""
    from osfleet.bench import fork as fork_bench
    from osfleet.bench.tables import fork_table
    from osfleet.images import find_image

    settings = Settings.from_env()
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    emit(fork_bench.run(find_image(image_ref, settings), children, settings, say), as_json, out, fork_table)


@bench.command("density")
@click.option("--max", "max_replicas", default=None, type=click.IntRange(1, 100000), help="stop at N replicas")
@click.option("--compare", is_flag=True, help="also run with template memory off (full-stream restores)")
@click.option(
    "--park/--running",
    default=True,
    show_default=True,
    help="ready replicas wait paused until leased (as host serve --park), or keep running",
)
@click.option(
    "--ksm-wait", default=0.0, show_default=True, help="seconds to let KSM merge before measuring (when it is on)"
)
@click.option("--image", "image_ref", default=None, help="golden image (default: newest)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of a summary")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON to this file")
@_friendly
def bench_density(
    max_replicas: int | None,
    compare: bool,
    park: bool,
    ksm_wait: float,
    image_ref: str | None,
    as_json: bool,
    out: Path | None,
) -> None:
    """Ready desktops held at once until memory runs out: each answers; memory, idle CPU, bring-up per replica."""
    from osfleet.bench import density
    from osfleet.bench.tables import density_table
    from osfleet.images import find_image

    settings = Settings.from_env()
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    result = density.run(find_image(image_ref, settings), max_replicas, compare, ksm_wait, settings, say, park)
    emit(result, as_json, out, density_table)


@bench.command("chaos")
@click.option("--hosts", default=2, show_default=True, type=click.IntRange(1, 8), help="host agents on loopback")
@click.option("--warm", default=2, show_default=True, type=click.IntRange(1, 64), help="ready replicas per host")
@click.option("--users", default=4, show_default=True, type=click.IntRange(1, 256), help="Locust agents")
@click.option("--duration", default=300, show_default=True, type=click.IntRange(30, 86400), help="seconds of load")
@click.option("--every", default=25.0, show_default=True, type=click.FloatRange(5, 3600), help="seconds between faults")
@click.option("--image", "image_ref", default=None, help="golden image (default: newest)")
@click.option("--run-dir", type=click.Path(path_type=Path), default=None, help="default: runs/<timestamp>-chaos")
@click.option("--json", "as_json", is_flag=True, help="print the audit as JSON")
@_friendly
def bench_chaos(
    hosts: int,
    warm: int,
    users: int,
    duration: int,
    every: float,
    image_ref: str | None,
    run_dir: Path | None,
    as_json: bool,
) -> None:
    """Locust trajectories through a fleet gateway while faults are injected (kill and freeze QEMU, delete an
    overlay, kill a host agent, fill a host's store), then an audit: lost or duplicated steps, aborts no
    fault explains, unrecovered faults, leaks."""
    import time as _time

    from osfleet.bench import chaos as chaos_bench
    from osfleet.images import find_image

    settings = Settings.from_env()
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    run_dir = run_dir or Path("runs") / (_time.strftime("%Y%m%dT%H%M%SZ", _time.gmtime()) + "-chaos")
    image = find_image(image_ref, settings)
    result = chaos_bench.run(image, settings, run_dir, hosts, warm, users, duration, every, say=say)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for key in chaos_bench.SUMMARY_KEYS:
        click.echo(f"{key:>20}: {result.get(key)}")
    click.echo(f"audit in {run_dir / 'chaos.json'}")


@bench.command("soak")
@click.option("--hosts", default=2, show_default=True, type=click.IntRange(1, 8), help="host agents on loopback")
@click.option("--warm", default=2, show_default=True, type=click.IntRange(1, 64), help="ready replicas per host")
@click.option("--users", default=4, show_default=True, type=click.IntRange(1, 256), help="Locust agents")
@click.option("--duration", default="30m", show_default=True, help="how long: 90s, 30m, 2h")
@click.option("--image", "image_ref", default=None, help="golden image (default: newest)")
@click.option("--run-dir", type=click.Path(path_type=Path), default=None, help="default: runs/<timestamp>-soak")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
@_friendly
def bench_soak(
    hosts: int, warm: int, users: int, duration: str, image_ref: str | None, run_dir: Path | None, as_json: bool
) -> None:
    """The chaos bench's fleet and load with no faults: unscored episodes (aborts and errors) must stay rare."""
    import time as _time

    from osfleet.bench import chaos as chaos_bench
    from osfleet.images import find_image

    seconds = _seconds(duration)
    settings = Settings.from_env()
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    run_dir = run_dir or Path("runs") / (_time.strftime("%Y%m%dT%H%M%SZ", _time.gmtime()) + "-soak")
    image = find_image(image_ref, settings)
    result = chaos_bench.run(image, settings, run_dir, hosts, warm, users, seconds, kinds=(), say=say)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for key in ("episodes", "scored_episodes", "aborted_episodes", "error_episodes", "abort_rate", "leaks"):
        click.echo(f"{key:>20}: {result.get(key)}")


def _seconds(text: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        value = int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)
    except (ValueError, IndexError):
        raise OsfleetError(f"duration {text!r}: expected seconds, or a number with s, m or h (90s, 30m)") from None
    if value < 30:
        raise OsfleetError(f"duration {text!r}: at least 30 s")
    return value


# --- replicas ----------------------------------------------------------------------------------------------
@cli.group()
def replicas() -> None:
    """Replicas on this host: bring up, list, screenshot, reset, tear down."""


def _replica_host(image_ref: str | None, mode: Mode = "snapshot") -> Any:
    from osfleet.images import find_image
    from osfleet.replicas.manager import ReplicaHost

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
    from osfleet.virt import Virt

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

    from osfleet.virt import Virt

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
@click.option("--states", is_flag=True, help="with --all: also delete the saved running states")
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


# --- host agent ---------------------------------------------------------------------------------------------
@cli.group()
def host() -> None:
    """The host agent: an authenticated HTTP API over this host's replicas."""


@host.command("serve")
@click.option("--bind", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535))
@click.option("--image", "image_ref", default=None, help="golden image (default: newest)")
@click.option("--mode", type=click.Choice(MODES), default="snapshot", show_default=True)
@click.option("--warm", default=1, show_default=True, type=click.IntRange(0, 4096), help="replicas kept ready")
@click.option("--lease-seconds", default=900.0, show_default=True, help="default lease length")
@click.option(
    "--token-file",
    type=click.Path(path_type=Path),
    default=None,
    help="bearer token file (default: $OSFLEET_API_TOKEN, else $OSFLEET_HOME/api-token, made if missing)",
)
@click.option("--osgym-allow", multiple=True, help="client IP allowed on the OSGym endpoints without a token")
@click.option(
    "--max-replicas",
    default=None,
    type=click.IntRange(1, 100000),
    help="most replicas this host holds (default: from its memory, ~160 MiB each with template memory)",
)
@click.option(
    "--park/--no-park",
    default=False,
    envvar="OSFLEET_PARK",
    show_envvar=True,
    help="keep ready replicas paused until leased: no CPU while idle, ~0.1 s more per lease (default off)",
)
@click.option(
    "--record/--no-record",
    default=False,
    envvar="OSFLEET_RECORD",
    show_envvar=True,
    help="record every episode into $OSFLEET_HOME/trajectories (default off; on in benches)",
)
@click.option("--record-format", type=click.Choice(["jpeg", "webp"]), default="jpeg", show_default=True)
@click.option("--record-quality", default=75, show_default=True, type=click.IntRange(1, 100))
@click.option(
    "--record-max-mib", default=2048, show_default=True, type=click.IntRange(1), help="size cap of the recordings"
)
@click.option("--record-max-episodes", default=None, type=click.IntRange(1), help="keep at most this many episodes")
@_friendly
def host_serve(
    bind: str,
    port: int,
    image_ref: str | None,
    mode: Mode,
    warm: int,
    lease_seconds: float,
    token_file: Path | None,
    osgym_allow: tuple[str, ...],
    max_replicas: int | None,
    park: bool,
    record: bool,
    record_format: str,
    record_quality: int,
    record_max_mib: int,
    record_max_episodes: int | None,
) -> None:
    """Serve lease/reset/observe/step/evaluate/release and OSGym's endpoints until interrupted."""
    import os

    import uvicorn

    from osfleet.api.app import create_app
    from osfleet.api.auth import load_or_create_token
    from osfleet.config import AgentConfig
    from osfleet.images import find_image
    from osfleet.replicas.manager import ReplicaHost

    settings = Settings.from_env()
    image = find_image(image_ref, settings)
    if token_file is not None:
        if not token_file.exists():
            raise OsfleetError(f"token file not found: {token_file}")
        token = token_file.read_text().strip()
    else:
        token = os.environ.get("OSFLEET_API_TOKEN") or load_or_create_token(settings.token_file)
        if "OSFLEET_API_TOKEN" not in os.environ:
            click.echo(f"bearer token in {settings.token_file}", err=True)
    from osfleet.config import RecordingConfig

    recording = (
        RecordingConfig(
            image_format=record_format,  # type: ignore[arg-type]  # a click.Choice of the two
            quality=record_quality,
            max_bytes=record_max_mib * 2**20,
            max_episodes=record_max_episodes,
        )
        if record
        else None
    )
    config = AgentConfig(
        token=token,
        image=image.name,
        mode=mode,
        warm=warm,
        lease_seconds=lease_seconds,
        osgym_allowed_ips=osgym_allow,
        recording=recording,
    )
    app = create_app(
        config,
        lambda: ReplicaHost(
            image,
            settings,
            mode=mode,
            warm=warm,
            say=lambda m: click.echo(m, err=True),
            max_replicas=max_replicas,
            park=park,
        ),
    )
    click.echo(f"osfleet host agent on http://{bind}:{port} ({image.name}, {mode} resets, {warm} warm)", err=True)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()  # from --log-level
    uvicorn.run(app, host=bind, port=port, log_level=level)


@host.command("tune")
@click.option("--ksm/--no-ksm", default=None, help="KSM on or off (default: on unless OSFLEET_TENANCY=multi)")
@click.option("--json", "as_json", is_flag=True)
@_friendly
def host_tune(ksm: bool | None, as_json: bool) -> None:
    """Host settings for density: KSM with sane scan rates (kept off when replicas serve different users)."""
    from osfleet.host_tune import tune

    result = tune(Settings.from_env(), ksm)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(f"KSM {result['ksm_reason']}; now saving {result['ksm'].get('saved_bytes', 0) >> 20} MiB")


# --- fleet gateway ------------------------------------------------------------------------------------------
@cli.group()
def fleet() -> None:
    """The fleet gateway: one endpoint with the host agent's API in front of many host agents."""


@fleet.command("serve")
@click.option("--bind", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8090, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--hosts-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="YAML/JSON list of {name, url, token | token_file}",
)
@click.option("--host", "host_specs", multiple=True, help="NAME=URL of a host agent (with --hosts-token-file)")
@click.option(
    "--hosts-token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="the token of the --host agents",
)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="the gateway's own client token (default: $OSFLEET_API_TOKEN, else $OSFLEET_HOME/gateway-token, made)",
)
@click.option("--osgym-allow", multiple=True, help="client IP allowed on the OSGym endpoints without a token")
@_friendly
def fleet_serve(
    bind: str,
    port: int,
    hosts_file: Path | None,
    host_specs: tuple[str, ...],
    hosts_token_file: Path | None,
    token_file: Path | None,
    osgym_allow: tuple[str, ...],
) -> None:
    """Serve the host agent's contract for a fleet of host agents until interrupted."""
    import os

    import uvicorn

    from osfleet.api.auth import load_or_create_token
    from osfleet.fleet.app import create_gateway
    from osfleet.fleet.hosts import HostEntry, check_unique, load_hosts

    entries = load_hosts(hosts_file) if hosts_file else []
    if host_specs:
        if hosts_token_file is None or not hosts_token_file.exists():
            raise OsfleetError("--host needs --hosts-token-file with the host agents' token")
        host_token = hosts_token_file.read_text().strip()
        for spec in host_specs:
            name, sep, url = spec.partition("=")
            if not sep:
                raise OsfleetError(f"--host {spec!r}: expected NAME=URL, e.g. kvm1=http://10.0.0.5:8080")
            try:
                entries.append(HostEntry(name=name, url=url.rstrip("/"), token=host_token))
            except ValueError as exc:
                raise OsfleetError(f"--host {spec!r}: {str(exc).splitlines()[-1].strip()}") from None
    if not entries:
        raise OsfleetError("name the host agents: --hosts-file F, or --host NAME=URL with --hosts-token-file")
    check_unique(entries)
    settings = Settings.from_env()
    if token_file is not None:
        if not token_file.exists():
            raise OsfleetError(f"token file not found: {token_file}")
        token = token_file.read_text().strip()
    else:
        token = os.environ.get("OSFLEET_API_TOKEN") or load_or_create_token(settings.home / "gateway-token")
    app = create_gateway(token, entries, osgym_allowed_ips=osgym_allow)
    names = ", ".join(e.name for e in entries)
    click.echo(f"osfleet fleet gateway on http://{bind}:{port} over {len(entries)} host(s): {names}", err=True)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    uvicorn.run(app, host=bind, port=port, log_level=level)


# --- tasks ----------------------------------------------------------------------------------------------------
@cli.group()
def tasks() -> None:
    """Built-in and custom tasks: list them, validate them on a real replica."""


@tasks.command("ls")
@_friendly
def tasks_ls() -> None:
    """List the built-in tasks."""
    from osfleet.tasks.model import builtin_tasks

    for t in builtin_tasks():
        click.echo(f"{t.id:<24} {t.kind:<6} {t.instruction}")


@tasks.command("validate")
@click.option("--task", "task_ids", multiple=True, help="built-in task id (default: all built-in tasks)")
@click.option(
    "--file",
    "files",
    multiple=True,
    type=click.Path(path_type=Path, exists=True),
    help="a task file (osfleet YAML/JSON or OSWorld JSON)",
)
@click.option(
    "--suite",
    type=click.Choice(["osworld"]),
    default=None,
    help="a shipped suite of OSWorld-format tasks, on its own image (osworld: the office recipe)",
)
@click.option("--image", "image_ref", default=None, help="golden image (default: newest, or the suite's)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document: passed, failed, apps, per-task timings")
@_friendly
def tasks_validate(
    task_ids: tuple[str, ...], files: tuple[Path, ...], suite: str | None, image_ref: str | None, as_json: bool
) -> None:
    """Check each task on a real replica: verifier 0 on the initial state, 1 after the oracle, 0 after a reset."""
    from osfleet.images import find_image
    from osfleet.replicas.manager import ReplicaHost
    from osfleet.tasks import runner
    from osfleet.tasks.model import Task, builtin_tasks, find_task, load_task_file
    from osfleet.tasks.suites import load_suite, suite_image

    settings = Settings.from_env()
    chosen: list[tuple[Task, list[str]]] = [(find_task(t), []) for t in task_ids]
    chosen += [(load_task_file(f), []) for f in files]
    if suite:
        chosen += [(s.task, s.apps) for s in load_suite(suite)]
    if not chosen:
        chosen = [(t, []) for t in builtin_tasks()]
    missing_oracle = [t.id for t, _ in chosen if not t.oracle]
    if missing_oracle:
        raise OsfleetError(f"no oracle to validate with: {', '.join(missing_oracle)}")
    image = find_image(image_ref, settings) if image_ref or not suite else suite_image(suite, settings)
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    rows: list[dict[str, Any]] = []
    with ReplicaHost(image, settings, mode="snapshot", auto_recover=False, say=lambda m: click.echo(m, err=True)) as h:
        rid = h.create().replica
        try:
            for t, apps in chosen:
                v = runner.validate(h, rid, t)
                rewards = " -> ".join(f"{r:g}" for r in v.rewards)
                if v.ok:
                    say(f"PASS  {t.id:<24} rewards {rewards}  ({v.seconds:.1f} s)")
                else:
                    say(f"FAIL  {t.id:<24} {v.problem}  ({v.seconds:.1f} s)")
                rows.append(
                    {"id": t.id, "apps": apps, "ok": v.ok, "rewards": v.rewards, "seconds": round(v.seconds, 2)}
                    | {"phases": v.phases}
                    | ({"problem": v.problem} if v.problem else {})
                )
        finally:
            h.down([rid])
    failures = sum(not r["ok"] for r in rows)
    if as_json:
        passed_apps = sorted({a for r in rows if r["ok"] for a in r["apps"]})
        summary: dict[str, Any] = {"suite": suite, "image": image.name, "passed": len(rows) - failures}
        summary["failed"] = failures
        summary |= {"apps": len(passed_apps), "apps_passed": passed_apps, "tasks": rows}
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"{len(chosen) - failures} passed, {failures} failed")
    if failures:
        sys.exit(1)


# --- reports -----------------------------------------------------------------------------------------------
@cli.command("report")
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
@_friendly
def report_cmd(run_dir: Path) -> None:
    """Render a run directory into report.md, report.html and PNG figures."""
    from osfleet.report import render

    for path in render(run_dir):
        click.echo(path)


from osfleet.bench.infra import bench_infra  # noqa: E402  (commands of issue 9 live in their own modules)
from osfleet.lab.cli import lab  # noqa: E402
from osfleet.lab.infra_cli import infra  # noqa: E402

cli.add_command(lab)
cli.add_command(infra)
bench.add_command(bench_infra)

from osfleet.chaos.cli import chaos  # noqa: E402  (issue 10: fault injectors and the capacity plan)
from osfleet.plan import plan_cmd  # noqa: E402

cli.add_command(chaos)
cli.add_command(plan_cmd)

from osfleet.recording.cli import trajectories  # noqa: E402  (issue 12: recorded episodes)

cli.add_command(trajectories)

from osfleet.tasks.cli import assets, tasks_import  # noqa: E402  (issue 13: OSWorld tasks offline)

tasks.add_command(assets)
tasks.add_command(tasks_import)

from osfleet.bench.step import bench_step  # noqa: E402  (issue 11: observe/act latency)

bench.add_command(bench_step)


def main() -> None:
    cli(prog_name="osfleet")
