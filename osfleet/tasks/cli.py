"""``osfleet tasks ...``: built-in and OSWorld-format tasks (list, validate on a real replica, import, assets)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from osfleet.cli_support import friendly
from osfleet.config import Settings
from osfleet.errors import OsfleetError


@click.group("assets")
def assets() -> None:
    """The host's asset store: files OSWorld tasks download, kept by sha256 under $OSFLEET_HOME/assets."""


@assets.command("add")
@click.argument("url")
@click.argument("file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@friendly
def assets_add(url: str, file: Path) -> None:
    """Store FILE as what URL serves: download steps and cloud_file getters naming URL get these bytes."""
    from osfleet.tasks.assets import AssetStore

    asset = AssetStore.from_settings().add(url, file)
    click.echo(f"{asset.sha256}  {asset.size} bytes  {url}")


@assets.command("add-bundle")
@click.argument("bundle", type=click.Path(path_type=Path, exists=True, file_okay=False))
@friendly
def assets_add_bundle(bundle: Path) -> None:
    """Store every file of a task bundle's assets/manifest.json ({"files": [{url, file, sha256?}]})."""
    from osfleet.tasks.assets import AssetStore

    for asset in AssetStore.from_settings().add_bundle(bundle):
        click.echo(f"{asset.sha256}  {asset.size} bytes  {asset.url}")


@assets.command("fetch")
@click.argument("folder", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--retries", default=3, show_default=True, type=click.IntRange(0, 20), help="tries again per URL")
@click.option("--timeout", default=60.0, show_default=True, type=click.FloatRange(1, 3600), help="seconds without data")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document (fetched, held, missing)")
@friendly
def assets_fetch(folder: Path, retries: int, timeout: float, as_json: bool) -> None:
    """Download every URL the task files under FOLDER name (downloads, cloud files) into the asset store.

    Needs the internet; what cannot be had is listed, one line each, and the command exits non-zero."""
    from osfleet.tasks.assets import AssetStore, fetch
    from osfleet.tasks.model import TaskError
    from osfleet.tasks.osworld_format.convert import asset_urls
    from osfleet.tasks.osworld_format.importer import read_task_file, task_files

    urls: list[str] = []
    for path in task_files(folder):
        try:
            urls += asset_urls(read_task_file(path))
        except TaskError as exc:
            click.echo(f"skipped {path}: {exc}", err=True)
    urls = list(dict.fromkeys(urls))
    store = AssetStore.from_settings()
    click.echo(f"{len(urls)} URLs named by the task files under {folder}", err=True)
    try:
        report = fetch(store, urls, say=lambda m: click.echo(m, err=True), retries=retries, timeout=timeout)
    except KeyboardInterrupt:
        click.echo("fetch stopped: the download under way was removed, finished ones are kept", err=True)
        raise
    if as_json:
        click.echo(json.dumps(report.as_json(), indent=1))
    else:
        for url, why in report.missing.items():
            click.echo(f"missing  {url}: {why}")
        click.echo(report.summary)
    if report.missing:
        sys.exit(1)


@assets.command("ls")
@click.option("--json", "as_json", is_flag=True, help="print JSON ({url: sha256})")
@friendly
def assets_ls(as_json: bool) -> None:
    """List the URLs this host's asset store holds, with their sha256."""
    from osfleet.tasks.assets import AssetStore

    index = AssetStore.from_settings().index()
    if as_json:
        click.echo(json.dumps(index, indent=1, sort_keys=True))
        return
    for url, sha in sorted(index.items()):
        click.echo(f"{sha}  {url}")


@click.command("import")
@click.argument("folder", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print one JSON document (summary + per task)")
@friendly
def tasks_import(folder: Path, as_json: bool) -> None:
    """Check OSWorld-format task files under FOLDER: per task, supported, or the exact unsupported features and
    the asset URLs this host's store lacks.

    A bundle's own assets (FOLDER/assets/manifest.json) are added to the host's asset store first. Tasks that
    OSWorld runs behind a proxy ("proxy": true) are marked: they get one when the host agent runs with
    --replica-network proxy=URL. --json also carries each task's needs_proxy, fixed_ip and
    possibility_of_env_change."""
    from osfleet.tasks.osworld_format.importer import import_folder

    report = import_folder(folder)
    if as_json:
        click.echo(json.dumps(report.as_json(), indent=1))
        return
    for t in report.tasks:
        proxy = " (needs a proxy: --replica-network proxy=URL)" if t.needs_proxy else ""
        if t.supported:
            click.echo(f"ok           {t.file}{proxy}")
        elif t.features_supported:
            click.echo(f"no assets    {t.file}: {len(t.missing_assets)} file(s) missing, e.g. {t.missing_assets[0]}")
        else:
            click.echo(f"unsupported  {t.file}: {'; '.join(t.unsupported)}")
    s = report.summary
    click.echo(
        f"{s['supported']} of {s['tasks']} tasks supported; {s['features_supported']} with every feature supported "
        f"({s['missing_assets']} asset URLs missing: osfleet tasks assets fetch); {s['needs_proxy']} need a proxy"
    )
    for feature, count in dict(s["unsupported_features"]).items():  # type: ignore[call-overload]
        click.echo(f"  {count:>4}  {feature}")


@click.group()
def tasks() -> None:
    """Built-in and custom tasks: list them, validate them on a real replica."""


@tasks.command("ls")
@friendly
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
@friendly
def tasks_validate(
    task_ids: tuple[str, ...], files: tuple[Path, ...], suite: str | None, image_ref: str | None, as_json: bool
) -> None:
    """Check each task on a real replica: verifier 0 on the initial state, 1 after the oracle, 0 after a reset."""
    from osfleet.replicas.manager import ReplicaHost
    from osfleet.tasks import runner
    from osfleet.tasks.model import Task, builtin_tasks, find_task, load_task_file
    from osfleet.tasks.suites import load_suite, suite_image
    from osfleet.vm.images import find_image

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
        try:
            rid = h.create().replica
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
            h.down(h.made_here())  # the replica, even one an interrupt caught while it came up
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


tasks.add_command(assets)
tasks.add_command(tasks_import)
