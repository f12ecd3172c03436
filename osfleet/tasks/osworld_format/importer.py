"""Which OSWorld-format task files of a folder osfleet runs, and, for the others, exactly what is missing.

A folder is either OSWorld's own layout (``examples/<app>/<id>.json``, searched recursively) or a task
bundle (task JSON files beside an ``assets/`` folder with its manifest, whose files are added to the host's
asset store first, so the bundle's downloads resolve).

Per task: ``features_supported`` (every set-up step, getter, metric and option runs here), ``missing_assets``
(URLs its downloads and cloud files name that the store lacks: ``tasks assets fetch`` fills them where there is
internet) and ``supported`` (both: it runs on this host now). OSWorld-Verified's own flags come along as they
are: ``needs_proxy`` (``"proxy": true``: OSWorld runs it behind a proxy, because the sites it visits block
data-centre addresses; osfleet sets that proxy up when the host runs with ``--replica-network proxy=URL``),
``fixed_ip`` and ``possibility_of_env_change`` (how likely the live web changes the expected answer).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from osfleet.tasks.assets import AssetStore
from osfleet.tasks.errors import TaskError
from osfleet.tasks.osworld_format.convert import METRICS, asset_urls, unsupported_features

MAX_TASK_BYTES = 4 * 2**20  # OSWorld's largest task file is a few KiB


@dataclass
class TaskReport:
    file: str
    id: str
    supported: bool
    features_supported: bool
    unsupported: list[str] = field(default_factory=list)
    missing_assets: list[str] = field(default_factory=list)
    needs_proxy: bool = False
    fixed_ip: bool = False
    possibility_of_env_change: str | None = None


@dataclass
class ImportReport:
    tasks: list[TaskReport]
    assets_added: int = 0

    @property
    def summary(self) -> dict[str, object]:
        features = Counter(f for t in self.tasks for f in t.unsupported)
        return {
            "tasks": len(self.tasks),
            "supported": sum(t.supported for t in self.tasks),
            "features_supported": sum(t.features_supported for t in self.tasks),
            "unsupported": sum(not t.supported for t in self.tasks),
            "missing_assets": len({u for t in self.tasks for u in t.missing_assets}),
            "needs_proxy": sum(t.needs_proxy for t in self.tasks),
            "fixed_ip": sum(t.fixed_ip for t in self.tasks),
            "assets_added": self.assets_added,
            "unsupported_features": dict(features.most_common()),
        }

    def as_json(self) -> dict[str, object]:
        return {"summary": self.summary, "tasks": [asdict(t) for t in self.tasks]}


def task_files(folder: Path) -> list[Path]:
    """Task JSON files under ``folder``, not counting anything in an ``assets`` folder (a bundle's files)."""
    return sorted(
        p
        for p in folder.rglob("*.json")
        if p.is_file() and "assets" not in p.relative_to(folder).parts[:-1] and p.parent.name != "assets"
    )


def read_task_file(path: Path) -> object:
    """A task file's JSON, or a TaskError saying why it cannot be read (too big, not UTF-8, not JSON)."""
    try:
        if path.stat().st_size > MAX_TASK_BYTES:
            raise TaskError(f"larger than {MAX_TASK_BYTES // 2**20} MiB")
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TaskError(f"not JSON: {exc}") from None


def check_file(path: Path, root: Path, held: dict[str, str], metrics: Iterable[str] = METRICS) -> TaskReport:
    rel = str(path.relative_to(root))
    try:
        data = read_task_file(path)
    except TaskError as exc:
        return TaskReport(file=rel, id=path.stem, supported=False, features_supported=False, unsupported=[str(exc)])
    task_id = str(data.get("id", path.stem)) if isinstance(data, dict) else path.stem
    problems = unsupported_features(data, metrics)
    missing = [u for u in asset_urls(data) if u not in held]
    flags = data if isinstance(data, dict) else {}
    change = flags.get("possibility_of_env_change")
    return TaskReport(
        file=rel,
        id=task_id,
        supported=not problems and not missing,
        features_supported=not problems,
        unsupported=problems,
        missing_assets=missing,
        needs_proxy=flags.get("proxy") is True,
        fixed_ip=flags.get("fixed_ip") is True,
        possibility_of_env_change=change if isinstance(change, str) else None,
    )


def import_folder(folder: Path, store: AssetStore | None = None, metrics: Iterable[str] = METRICS) -> ImportReport:
    """Add a bundle's own assets to ``store`` (this host's by default), then check every task file.

    ``metrics``: the metric names to count as supported (this host's registry by default)."""
    if not folder.is_dir():
        raise TaskError(f"no such folder: {folder}")
    store = store or AssetStore.from_settings()
    added = store.add_bundle(folder)
    files = task_files(folder)
    if not files:
        raise TaskError(f"no task JSON files under {folder}")
    held = {u: sha for u, sha in store.index().items() if store.blob(sha).is_file()}
    names = tuple(metrics)
    return ImportReport(tasks=[check_file(p, folder, held, names) for p in files], assets_added=len(added))
