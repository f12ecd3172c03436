"""``osfleet trajectories ls|show|export``: the episodes this host recorded, read from its store on disk."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from osfleet.cli_support import friendly
from osfleet.config import Settings
from osfleet.errors import OsfleetError
from osfleet.recording import TrajectoryStore, store_dir
from osfleet.recording.export import export as export_rows
from osfleet.recording.store import TrajectoryMeta
from osfleet.recording.video import export_mp4, screens


def _store() -> TrajectoryStore:
    return TrajectoryStore(store_dir(Settings.from_env().home))


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) if t else "-"


def _ended(m: TrajectoryMeta) -> str:
    return "open" if m.open else f"{m.ended_by}:{m.end_reason}"


@click.group()
def trajectories() -> None:
    """Recorded episodes ($OSFLEET_HOME/trajectories; recorded by `host serve --record`)."""


@trajectories.command("ls")
@click.option("--json", "as_json", is_flag=True, help="one JSON array of the episodes' summaries")
@friendly
def trajectories_ls(as_json: bool) -> None:
    """Recorded episodes, newest first."""
    metas = _store().all()
    if as_json:
        click.echo(json.dumps([m.model_dump(mode="json", exclude={"task"}) for m in metas], indent=2))
        return
    if not metas:
        click.echo(f"no recorded episodes in {_store().root}")
        return
    click.echo(f"{'ID':34} {'STARTED (UTC)':19} {'REPLICA':12} {'TASK':24} {'STEPS':>5} {'REWARD':>6}  ENDED")
    for m in metas:
        reward = "-" if m.reward is None else f"{m.reward:.2f}"
        task = (m.task_id or "-")[:24]
        click.echo(
            f"{m.id:34} {_when(m.started_at):19} {m.replica_id:12} {task:24} {m.steps:>5} {reward:>6}  {_ended(m)}"
        )


@trajectories.command("show")
@click.argument("episode_id")
@click.option("--json", "as_json", is_flag=True, help="the summary and every step as JSON")
@friendly
def trajectories_show(episode_id: str, as_json: bool) -> None:
    """One episode: its summary and each step's actions, results, timing and image."""
    store = _store()
    meta, steps = store.meta(episode_id), store.steps(episode_id)
    if as_json:
        body = {**meta.model_dump(mode="json"), "step_records": [s.model_dump(mode="json") for s in steps]}
        click.echo(json.dumps(body, indent=2))
        return
    click.echo(f"episode   {meta.id}  ({store.root / meta.id})")
    click.echo(f"replica   {meta.replica_id} on {meta.host or '-'}, holder {meta.holder or '-'}")
    click.echo(f"task      {meta.task_id or '-'}: {meta.instruction or '-'}")
    click.echo(f"time      {_when(meta.started_at)} -> {_when(meta.ended_at)} UTC")
    click.echo(f"ended     {_ended(meta)}" + (f" ({meta.error})" if meta.error else ""))
    click.echo(f"reward    {'-' if meta.reward is None else meta.reward}  success {meta.success}")
    click.echo(f"steps     {meta.steps}  images {meta.image_format} q{meta.image_quality}")
    for s in steps:
        kinds = ",".join(str(a.get("type")) for a in s.actions)
        ok = all(r.get("ok") for r in s.results)
        meta_note = f"  metadata={json.dumps(s.metadata)[:80]}" if s.metadata is not None else ""
        click.echo(
            f"  #{s.index:<4} {s.action_id[:24]:24} {kinds[:40]:40} {'ok' if ok else 'FAILED':6} "
            f"{s.seconds:7.3f}s  {s.image or '-'}{meta_note}"
        )


@trajectories.command("export")
@click.argument("episode_id", required=False)
@click.option("--all", "everything", is_flag=True, help="every recorded episode (jsonl and parquet)")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "parquet", "mp4"]), default="jsonl", show_default=True)
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="file to write  [default: EPISODE_ID.mp4 for mp4; required for the others]",
)
@friendly
def trajectories_export(episode_id: str | None, everything: bool, fmt: str, out: Path | None) -> None:
    """One row per step with its episode's fields and its image inline (JSONL: base64; Parquet: bytes); or one
    episode as an MP4 video, each screen on from the time it was recorded until the next one (10 frames a second;
    the file appears only once it is whole)."""
    store = _store()
    if bool(episode_id) == everything:
        raise OsfleetError("give one episode id or --all")
    if fmt == "mp4":
        if everything or episode_id is None:
            raise OsfleetError("an MP4 is of one episode: give its id, not --all")
        _export_video(store, episode_id, out or Path(f"{episode_id}.mp4"))
        return
    if out is None:
        raise OsfleetError(f"--format {fmt} needs --out FILE")
    ids = store.ids() if everything else [episode_id or ""]
    for tid in ids:
        store.meta(tid)  # an unknown id fails before anything is written
    n = export_rows(store, ids, fmt, out)  # type: ignore[arg-type]  # a click.Choice of the two
    click.echo(f"{out}: {n} row(s) from {len(ids)} episode(s)")


def _export_video(store: TrajectoryStore, tid: str, out: Path) -> None:
    """The episode as an MP4, with a progress bar on a terminal (long episodes take a while to encode)."""
    frames = sum(s.frames for s in screens(store, tid))  # an unknown id, or no screens: refused before anything
    with click.progressbar(length=frames, label=f"encoding {tid}", file=sys.stderr) as bar:
        video = export_mp4(store, tid, out, progress=lambda done, _: bar.update(done - bar.pos))
    click.echo(f"{out}: {video.frames} frames, {video.seconds:.1f} s, {video.width}x{video.height}")
