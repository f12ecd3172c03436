"""``osfleet bench group``: a GRPO group of n rollouts from one desktop, against n independent resets.

Each round, measured through the Python client (``osfleet.client``) against a host agent started here on
loopback (or ``--url``, e.g. a gateway):
- **group**: one replica leased, reset to the task, forked n-1 ways (``AsyncFleet.group``): the time until all n
  sessions are ready, and whether their n screens are identical, byte for byte (PNG);
- **independent**: n replicas leased and reset to the task at once: the time until all n are ready, and whether
  their screens happen to be identical too.
The two alternate round by round, so drift on this noisy machine hits both alike. Then, once, the n sessions of
a group step at once (a ``wait 0`` each, the smallest real step) for a few seconds from this one process:
steps per second per client process.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from osfleet.bench.load import LocalAgent
from osfleet.cli_support import emit, friendly
from osfleet.client import AsyncFleet, AsyncSession
from osfleet.errors import OsfleetError
from osfleet.measure.host_facts import describe
from osfleet.measure.stats import distribution

Say = Callable[[str], None]
DEFAULT_TASK = "cli-write-note"
READY_TIMEOUT_SECONDS = 900.0
THROUGHPUT_SECONDS = 10.0


async def _group_round(fleet: AsyncFleet, task: str, n: int) -> dict[str, Any]:
    start = time.monotonic()
    group = await fleet.group(task, n, holder="bench-group")
    try:
        ready = time.monotonic() - start
        screens = [s.data if s is not None else b"" for s in group.screens]
        return {"seconds": ready, "identical": len(set(screens)) == 1, "distinct_screens": len(set(screens))}
    finally:
        await group.release()


async def _independent_round(fleet: AsyncFleet, task: str, n: int) -> dict[str, Any]:
    start = time.monotonic()
    sessions: list[AsyncSession] = list(
        await asyncio.gather(*(fleet._lease("bench-group", None, 600) for _ in range(n)))
    )
    try:
        resets = await asyncio.gather(*(s.reset(task) for s in sessions))
        ready = time.monotonic() - start
        screens = [r.screen.data if r.screen is not None else b"" for r in resets]
        return {"seconds": ready, "identical": len(set(screens)) == 1, "distinct_screens": len(set(screens))}
    finally:
        await asyncio.gather(*(s.release() for s in sessions), return_exceptions=True)


async def _throughput(fleet: AsyncFleet, task: str, n: int, seconds: float) -> dict[str, Any]:
    group = await fleet.group(task, n, holder="bench-group", observe=False)
    steps = 0
    deadline = time.monotonic() + seconds

    async def drive(s: AsyncSession) -> None:
        nonlocal steps
        while time.monotonic() < deadline:
            await s.step({"type": "wait", "seconds": 0}, observe=False)
            steps += 1

    try:
        start = time.monotonic()
        await asyncio.gather(*(drive(s) for s in group))
        took = time.monotonic() - start
    finally:
        await group.release()
    return {"sessions": n, "steps": steps, "seconds": took, "steps_per_second": steps / took if took else 0.0}


async def _measure(url: str, token: str, task: str, size: int, rounds: int, say: Say) -> dict[str, Any]:
    async with AsyncFleet(url, token) as fleet:
        say("warm-up: one group and one independent round (not counted)")
        await _group_round(fleet, task, size)
        await _independent_round(fleet, task, size)
        group: list[dict[str, Any]] = []
        independent: list[dict[str, Any]] = []
        for i in range(rounds):
            first, second = (_group_round, _independent_round) if i % 2 == 0 else (_independent_round, _group_round)
            for fn in (first, second):
                r = await fn(fleet, task, size)
                (group if fn is _group_round else independent).append(r)
            say(
                f"  round {i + 1}/{rounds}: group {group[-1]['seconds']:.2f} s, "
                f"{size} independent resets {independent[-1]['seconds']:.2f} s"
            )
        say(f"throughput: {size} sessions stepping at once for {THROUGHPUT_SECONDS:.0f} s")
        throughput = await _throughput(fleet, task, size, THROUGHPUT_SECONDS)
    grouped = distribution([r["seconds"] for r in group])
    ind = distribution([r["seconds"] for r in independent])
    return {
        "ready_s": grouped["p50"],
        "independent_resets_s": ind["p50"],
        "speedup": ind["p50"] / grouped["p50"] if grouped["p50"] else None,
        "identical": all(r["identical"] for r in group),
        "independent_identical": all(r["identical"] for r in independent),
        "group": {**grouped, "rounds": group},
        "independent": {**ind, "rounds": independent},
        "throughput": throughput,
    }


def run(
    size: int, rounds: int, task: str, url: str | None, token: str | None, image: str | None, run_dir: Path, say: Say
) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"machine": describe(), "size": size, "rounds": rounds, "task": task}
    if url is not None:
        if not token:
            raise OsfleetError("--url needs --token (or $OSFLEET_API_TOKEN)")
        result["agent"] = url
        return result | asyncio.run(_measure(url, token, task, size, rounds, say))
    warm = size
    say(f"starting a host agent on loopback with {warm} warm replica(s)")
    os.environ.setdefault("OSFLEET_RECORD", "0")
    agent = LocalAgent(warm, run_dir / "agent.log", image)
    try:
        agent.wait_ready(warm, READY_TIMEOUT_SECONDS)
        result["agent"] = f"started here (loopback, {warm} warm replicas)"
        return result | asyncio.run(_measure(agent.url, agent.token, task, size, rounds, say))
    finally:
        say("stopping the host agent and retiring its replicas")
        agent.stop()


def summary(result: dict[str, Any]) -> str:
    return (
        f"group of {result['size']} ({result['task']}): ready in {result['ready_s']:.2f} s p50 vs "
        f"{result['independent_resets_s']:.2f} s for {result['size']} independent resets "
        f"({result['speedup']:.1f}x); screens identical: {result['identical']} "
        f"(independent: {result['independent_identical']}); "
        f"{result['throughput']['steps_per_second']:.1f} steps/s from one client process"
    )


@click.command("group")
@click.option("--size", default=8, show_default=True, type=click.IntRange(2, 64), help="rollouts per group")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1, 100))
@click.option("--task", default=DEFAULT_TASK, show_default=True, help="built-in task id")
@click.option("--url", default=None, help="a running host agent or gateway instead of one started here")
@click.option("--token", default=None, envvar="OSFLEET_API_TOKEN", help="its bearer token (with --url)")
@click.option("--image", "image_ref", default=None, help="golden image (default: newest)")
@click.option("--run-dir", type=click.Path(path_type=Path), default=None, help="default: runs/<timestamp>-group")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of a summary")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the JSON to this file")
@friendly
def bench_group(
    size: int,
    rounds: int,
    task: str,
    url: str | None,
    token: str | None,
    image_ref: str | None,
    run_dir: Path | None,
    as_json: bool,
    out: Path | None,
) -> None:
    """A GRPO group (one reset, forked n-1 ways) against n independent resets: time to n ready desktops, whether
    the group's screens are identical, and steps per second from one client process."""
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    run_dir = run_dir or Path("runs") / (time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-group")
    result = run(size, rounds, task, url, token, image_ref, run_dir, say)
    (run_dir / "group.json").write_text(json.dumps(result, indent=2) + "\n")
    emit(result, as_json, out, summary)
