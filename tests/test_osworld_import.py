"""OSWorld's own task files (``../shared/data/osworld``, the benchmark's 369 tasks) import: none is refused as a
bad task, and with every metric name they use counted as supported, all but the tasks that need the internet
or a Google account have every step, getter and option supported (the metric functions themselves are
``osfleet/tasks/evaluators``'s, and the import verdict reads that registry).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from osfleet.tasks.importer import import_folder
from osfleet.tasks.osworld import METRICS
from osfleet.tasks.osworld_spec import OFFLINE

# shared/ sits beside the checkout (a helper's worktree is one folder deeper)
DATA = next(
    (p / "shared" / "data" / "osworld" for p in Path(__file__).resolve().parents if (p / "shared" / "data").is_dir()),
    Path("shared/data/osworld"),
)


@pytest.fixture
def examples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path / "home"))
    if not (DATA / "test_all.json").exists():
        # CI always has shared/ beside its clone, so there a missing folder is a broken set-up, not a reason to
        # pass quietly; elsewhere (a clone without shared/) the skip names the folder it looked for.
        why = f"OSWorld's task files are not beside the checkout ({DATA}/test_all.json)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI has shared/ beside its clone, so this is a broken set-up")
        pytest.skip(why)
    return DATA / "examples"


def metric_names(folder: Path) -> set[str]:
    names: set[str] = set()
    for f in folder.glob("*/*.json"):
        ev = json.loads(f.read_text()).get("evaluator")
        funcs = ev.get("func") if isinstance(ev, dict) else None
        names |= {x for x in (funcs if isinstance(funcs, list) else [funcs]) if isinstance(x, str) and x}
    return names


def test_osworlds_tasks_import_with_every_feature_but_the_online_ones(examples: Path) -> None:
    listed = {i for ids in json.loads((DATA / "test_all.json").read_text()).values() for i in ids}
    now = {t.id: t for t in import_folder(examples).tasks}
    assert listed <= set(now)
    assert not [i for i in listed if any("bad OSWorld task" in u for u in now[i].unsupported)]
    assumed = {t.id: t for t in import_folder(examples, metrics=[*METRICS, *metric_names(examples)]).tasks}
    supported = [i for i in listed if assumed[i].features_supported]
    assert len(supported) >= 340, len(supported)
    reasons = {u for i in listed for u in assumed[i].unsupported}
    assert all(any(f"'{kind}': {why}" in u for kind, why in OFFLINE.items()) for u in reasons), reasons
    assert all(now[i].missing_assets == assumed[i].missing_assets for i in listed)
    cloud = [i for i in listed if assumed[i].features_supported and assumed[i].missing_assets]
    assert len(cloud) >= 250  # their files come from the web: osfleet tasks assets fetch, where there is internet
