"""``osfleet bench ...``: every benchmark; each writes machine-readable results and prints only measured numbers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from osfleet.cli_support import emit
from osfleet.cli_support import friendly as _friendly
from osfleet.config import Settings
from osfleet.errors import OsfleetError

F = TypeVar("F", bound=Callable[..., Any])


# --- benchmarks --------------------------------------------------------------------------------------------
@click.group()
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
    from osfleet.vm.images import find_image

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
@click.option(
    "--recipe",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="the image of this recipe (found by its hash; built into $OSFLEET_HOME/build-<name> if missing)",
)
@click.option(
    "--cold-budget",
    default=300.0,
    show_default=True,
    type=click.FloatRange(0),
    help="seconds of cold reset rounds after which no new cold round starts (at least one runs; 0: all --resets)",
)
@click.option("--hold", is_flag=True, help="also bring up as many snapshot replicas as fit and count them")
@click.option("--hold-max", default=64, show_default=True, type=click.IntRange(1, 4096))
@click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of a summary")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON to this file")
@_friendly
def bench_reset(
    replicas: int,
    resets: int,
    image_ref: str | None,
    recipe: Path | None,
    cold_budget: float,
    hold: bool,
    hold_max: int,
    as_json: bool,
    out: Path | None,
) -> None:
    """Cold vs snapshot resets on N replicas in one run: p50/p95, bring-up, latencies, RAM per replica.
    A cold reset is a full boot (minutes for the office image under TCG): cold rounds stop early once they
    passed --cold-budget, and the JSON says how many ran (``cold.rounds``). On a failure the JSON of what
    was measured is still printed, with the failure named, and the exit code is 1."""
    from osfleet.bench import reset as reset_bench
    from osfleet.bench.recipe_image import recipe_image
    from osfleet.bench.tables import reset_table
    from osfleet.vm.images import find_image

    if image_ref and recipe:
        raise OsfleetError("give --image or --recipe, not both")
    settings = Settings.from_env()
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    image = recipe_image(recipe, settings, say) if recipe else find_image(image_ref, settings)
    budget = cold_budget or None
    result = reset_bench.run(image, replicas, resets, hold, hold_max, settings, say, cold_budget_s=budget)
    emit(result, as_json or "failure" in result, out, reset_table)
    _fail_if_failed(result)


@bench.command("fork")
@click.option("--children", default=8, show_default=True, type=click.IntRange(2, 64))
@click.option(
    "--ready/--no-ready",
    default=True,
    show_default=True,
    help="keep the children's domains started ahead of the fork (OSFLEET_FORK_READY of host serve)",
)
@click.option("--image", "image_ref", default=None, help="golden image (default: newest)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of a summary")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON to this file")
@_friendly
def bench_fork(children: int, ready: bool, image_ref: str | None, as_json: bool, out: Path | None) -> None:
    """Fork a replica mid-task N ways: same state in every child, diverging input, timings, clean-up."""
    from osfleet.bench import fork as fork_bench
    from osfleet.bench.tables import fork_table
    from osfleet.vm.images import find_image

    settings = Settings.from_env()
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    result = fork_bench.run(find_image(image_ref, settings), children, settings, say, ready)
    emit(result, as_json or "failure" in result, out, fork_table)
    _fail_if_failed(result)


@bench.command("checkpoint")
@click.option("--copies", default=4, show_default=True, type=click.IntRange(1, 64), help="copies started at once")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1, 100))
@click.option("--image", "image_ref", default=None, help="golden image (default: newest)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of a summary")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON to this file")
@_friendly
def bench_checkpoint(copies: int, rounds: int, image_ref: str | None, as_json: bool, out: Path | None) -> None:
    """Save a checkpoint mid-task, start 1 and N copies from it, fork N ways: timings and bytes side by side."""
    from osfleet.bench import checkpoint as checkpoint_bench
    from osfleet.vm.images import find_image

    settings = Settings.from_env()
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    result = checkpoint_bench.run(find_image(image_ref, settings), copies, rounds, settings, say)
    emit(result, as_json or "failure" in result, out, checkpoint_bench.checkpoint_table)
    _fail_if_failed(result)


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
@click.option(
    "--kernel-args",
    default=None,
    help="the guests' extra kernel arguments instead of osfleet's ('' for none: measure what they save)",
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
    kernel_args: str | None,
    image_ref: str | None,
    as_json: bool,
    out: Path | None,
) -> None:
    """Ready desktops held at once until memory runs out: each answers; memory, idle CPU, bring-up per replica."""
    from osfleet.bench import density
    from osfleet.bench.tables import density_table
    from osfleet.vm.images import find_image

    settings = Settings.from_env()
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    result = density.run(
        find_image(image_ref, settings), max_replicas, compare, ksm_wait, settings, say, park, kernel_args
    )
    emit(result, as_json or "failure" in result, out, density_table)
    _fail_if_failed(result)


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
    from osfleet.vm.images import find_image

    settings = Settings.from_env()
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    run_dir = run_dir or Path("runs") / (_time.strftime("%Y%m%dT%H%M%SZ", _time.gmtime()) + "-chaos")
    image = find_image(image_ref, settings)
    result = chaos_bench.run(image, settings, run_dir, hosts, warm, users, duration, every, say=say)
    if as_json or "failure" in result:
        click.echo(json.dumps(result, indent=2))
    else:
        for key in chaos_bench.SUMMARY_KEYS:
            click.echo(f"{key:>20}: {result.get(key)}")
        click.echo(f"audit in {run_dir / 'chaos.json'}")
    _fail_if_failed(result)


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
    from osfleet.vm.images import find_image

    seconds = _seconds(duration)
    settings = Settings.from_env()
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    run_dir = run_dir or Path("runs") / (_time.strftime("%Y%m%dT%H%M%SZ", _time.gmtime()) + "-soak")
    image = find_image(image_ref, settings)
    result = chaos_bench.run(image, settings, run_dir, hosts, warm, users, seconds, kinds=(), say=say)
    if as_json or "failure" in result:
        click.echo(json.dumps(result, indent=2))
    else:
        keys = ("episodes", "scored_episodes", "episodes_per_minute", "aborted_episodes", "error_episodes")
        for key in (*keys, "abort_rate", "lost_actions", "duplicated_actions", "leaks"):
            click.echo(f"{key:>20}: {result.get(key)}")
        for phase, d in (result.get("episode_phase_seconds") or {}).items():
            click.echo(f"{phase:>20}: p50 {d['p50']:.2f} s, p95 {d['p95']:.2f} s, {d['share']:.0%} of the time")
    _fail_if_failed(result)


def _fail_if_failed(result: dict[str, Any]) -> None:
    """A bench that failed part-way has printed what it measured (``failure`` names what went wrong):
    end with one line and exit code 1."""
    if result.get("failure"):
        raise OsfleetError(f"the benchmark failed: {result['failure']}")


@bench.command("hostclient")
@click.option("--rounds", default=300, show_default=True, type=click.IntRange(10, 100000), help="counted rounds")
@click.option("--warmup", default=20, show_default=True, type=click.IntRange(0, 10000), help="uncounted rounds")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON to this file")
@_friendly
def bench_hostclient(rounds: int, warmup: int, as_json: bool, out: Path | None) -> None:
    """The gateway's own HTTP client against aiohttp on the same calls to a stand-in host (HTTP and TLS):
    CPU and wall time per call, per-round differences, order swapped every round."""
    from osfleet.bench import hostclient

    emit(hostclient.run(rounds, warmup), as_json, out, hostclient.summary)


@bench.command("sandbox")
@click.option("--rounds", default=20, show_default=True, type=click.IntRange(1, 10000))
@click.option("--fresh-rounds", default=5, show_default=True, type=click.IntRange(1, 1000))
@click.option(
    "--against",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="the Python of another checkout (a virtualenv whose osfleet is that tree): its sandbox is timed too, "
    "in the same rounds, for a before/after side by side",
)
@click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of a summary")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON to this file")
@_friendly
def bench_sandbox(rounds: int, fresh_rounds: int, against: Path | None, as_json: bool, out: Path | None) -> None:
    """What the evaluation sandbox costs per evaluation: in-process vs the warm zygote vs a fresh interpreter."""
    from osfleet.bench import sandbox

    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    emit(sandbox.run(rounds, fresh_rounds, say, against), as_json, out, sandbox.summary)


@bench.command("read-path")
@click.option("--rounds", default=5, show_default=True, type=click.IntRange(1, 1000))
@click.option("--image", "image_ref", default=None, help="golden image (default: newest)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of a summary")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON to this file")
@_friendly
def bench_read_path(rounds: int, image_ref: str | None, as_json: bool, out: Path | None) -> None:
    """A getter's guest file read through the guest agent vs from the replica's disk on the host, on a replica."""
    from osfleet.bench import read_path
    from osfleet.vm.images import find_image

    settings = Settings.from_env()
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    result = read_path.run(find_image(image_ref, settings), rounds, settings, say)
    emit(result, as_json, out, read_path.summary)


def _seconds(text: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        value = int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)
    except (ValueError, IndexError):
        raise OsfleetError(f"duration {text!r}: expected seconds, or a number with s, m or h (90s, 30m)") from None
    if value < 30:
        raise OsfleetError(f"duration {text!r}: at least 30 s")
    return value


from osfleet.bench.gateway import bench_gateway  # noqa: E402
from osfleet.bench.group import bench_group  # noqa: E402  (beside their code: groups, infra and step latency)
from osfleet.bench.infra import bench_infra  # noqa: E402
from osfleet.bench.k8s_faults import bench_k8s_faults  # noqa: E402
from osfleet.bench.k8s_scale import bench_k8s_scale  # noqa: E402
from osfleet.bench.step import bench_step  # noqa: E402
from osfleet.bench.throughput import bench_throughput  # noqa: E402

bench.add_command(bench_gateway)
bench.add_command(bench_group)
bench.add_command(bench_infra)
bench.add_command(bench_k8s_faults)
bench.add_command(bench_k8s_scale)
bench.add_command(bench_step)
bench.add_command(bench_throughput)
