"""OSWorld's own task files (the benchmark's 369 tasks, fetched by ``scripts/fetch-osworld-tasks``) import: none is
refused as a bad task, and with every metric name they use counted as supported, all but the tasks that need the
internet or a Google account have every step, getter and option supported (the metric functions themselves are
``osfleet/tasks/osworld_format/metrics``'s, and the import verdict reads that registry).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from osfleet.tasks.model import UnsupportedTaskError
from osfleet.tasks.osworld_format.convert import METRICS, OsworldTask, from_osworld, unsupported_features
from osfleet.tasks.osworld_format.importer import import_folder
from osfleet.tasks.osworld_format.spec import OFFLINE
from tests.conftest import OSWORLD_TASKS

pytestmark = pytest.mark.unit

DATA = OSWORLD_TASKS


@pytest.fixture
def examples(osworld_tasks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The benchmark's task files (scripts/fetch-osworld-tasks; skipped, saying so, where they were never fetched)."""
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path / "home"))
    return osworld_tasks / "examples"


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


def test_verified_flags_come_with_each_task_and_screen_placeholders_wait_for_the_screen(examples: Path) -> None:
    report = import_folder(examples)
    by_id = {t.id: t for t in report.tasks}
    proxied = [t for t in report.tasks if t.needs_proxy]
    assert len(proxied) == report.summary["needs_proxy"] == 52  # OSWorld-Verified's "proxy": true tasks
    assert {t.possibility_of_env_change for t in report.tasks} >= {"low"}
    assert report.as_json()["tasks"][0].keys() >= {"needs_proxy", "fixed_ip", "possibility_of_env_change"}
    with_screen = [f for f in examples.glob("*/*.json") if "{SCREEN_WIDTH_HALF}" in f.read_text()]
    assert len(with_screen) >= 30
    for f in with_screen:
        assert by_id[f.stem].features_supported, by_id[f.stem].unsupported
        steps = from_osworld(json.loads(f.read_text()), _AnyAsset()).setup  # type: ignore[arg-type]
        filled = [s for s in steps if getattr(s, "fill_screen", False)]
        assert filled and all("{SCREEN_WIDTH_HALF}" in s.command for s in filled)  # type: ignore[union-attr]


class _AnyAsset:
    """An asset store that holds every URL (the conversion only needs a hash for each)."""

    def resolve(self, url: str) -> Any:
        return type("Held", (), {"sha256": "0" * 64})()


def test_an_unknown_placeholder_is_refused_by_name(tmp_path: Path) -> None:
    task = {
        "id": "probe",
        "instruction": "x",
        "config": [{"type": "execute", "parameters": {"command": ["python3", "-c", "print({SCREEN_DEPTH})"]}}],
        "evaluator": {
            "func": "exact_match",
            "result": {"type": "vm_command_line", "command": "echo {HOST_IP} ${HOME}"},
            "expected": {"type": "rule", "rules": {"expected": "a"}},
        },
    }
    problems = unsupported_features(task)
    assert len(problems) == 2 and "placeholder {SCREEN_DEPTH} in a set-up command" in problems[0]
    assert "placeholder {HOST_IP} in a result getter command" in problems[1]  # ${HOME} is the shell's own
    with pytest.raises(UnsupportedTaskError, match=r"placeholder \{SCREEN_DEPTH\}"):
        from_osworld(task, _AnyAsset())  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"SCREEN_DEPTH"):  # the API's request model: a 422 naming it
        OsworldTask.model_validate(task)
    known = {
        **task,
        "config": [{"type": "execute", "parameters": {"command": "echo {CLIENT_PASSWORD} {SCREEN_HEIGHT}"}}],
    }
    known["evaluator"] = {**task["evaluator"], "result": {"type": "vm_command_line", "command": "true"}}
    assert unsupported_features(known) == []
