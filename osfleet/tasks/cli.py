"""``osfleet tasks assets ...`` and ``osfleet tasks import``: OSWorld-format tasks and their files, offline."""

from __future__ import annotations

import json
from pathlib import Path

import click

from osfleet.cli_support import friendly


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
    """Check OSWorld-format task files under FOLDER: per task, supported or the exact unsupported features.

    A bundle's own assets (FOLDER/assets/manifest.json) are added to the host's asset store first."""
    from osfleet.tasks.importer import import_folder

    report = import_folder(folder)
    if as_json:
        click.echo(json.dumps(report.as_json(), indent=1))
        return
    for t in report.tasks:
        if t.supported:
            click.echo(f"ok           {t.file}")
        else:
            click.echo(f"unsupported  {t.file}: {'; '.join(t.unsupported)}")
    s = report.summary
    click.echo(f"{s['supported']} of {s['tasks']} tasks supported, {s['unsupported']} not")
    for feature, count in dict(s["unsupported_features"]).items():  # type: ignore[call-overload]
        click.echo(f"  {count:>4}  {feature}")
