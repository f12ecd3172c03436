"""Which OSWorld-format task files of a folder osfleet runs, and, for the others, exactly what is missing.

A folder is either OSWorld's own layout (``examples/<app>/<id>.json``, searched recursively) or a task
bundle (task JSON files beside an ``assets/`` folder with its manifest, whose files are added to the host's
asset store first, so the bundle's downloads resolve).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from osfleet.tasks.assets import AssetStore
from osfleet.tasks.model import TaskError
from osfleet.tasks.osworld import unsupported_features


@dataclass
class TaskReport:
    file: str
    id: str
    supported: bool
    unsupported: list[str] = field(default_factory=list)


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
            "unsupported": sum(not t.supported for t in self.tasks),
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


def check_file(path: Path, root: Path, store: AssetStore) -> TaskReport:
    rel = str(path.relative_to(root))
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return TaskReport(file=rel, id=path.stem, supported=False, unsupported=[f"not JSON: {exc}"])
    task_id = str(data.get("id", path.stem)) if isinstance(data, dict) else path.stem
    problems = unsupported_features(data, store)
    return TaskReport(file=rel, id=task_id, supported=not problems, unsupported=problems)


def import_folder(folder: Path, store: AssetStore | None = None) -> ImportReport:
    """Add a bundle's own assets to ``store`` (this host's by default), then check every task file."""
    if not folder.is_dir():
        raise TaskError(f"no such folder: {folder}")
    store = store or AssetStore.from_settings()
    added = store.add_bundle(folder)
    files = task_files(folder)
    if not files:
        raise TaskError(f"no task JSON files under {folder}")
    return ImportReport(tasks=[check_file(p, folder, store) for p in files], assets_added=len(added))
