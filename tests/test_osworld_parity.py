"""``python -m osfleet.osworld.parity``'s bookkeeping: what makes a task equal, unequal or failed, and the table.

The two evaluators are stand-ins here (their real meeting on replicas is the parity run itself, recorded on the
benchmarks page): what is checked is that a raising evaluator, set-up or oracle is never counted as a score and
that one bad task does not end the run."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from osfleet.osworld import parity

pytestmark = pytest.mark.unit


@dataclass
class Result:
    reward: float


@dataclass
class FakeSession:
    """osfleet's side: its score is 1 once the oracle's last action ran, as a real task's would be."""

    solved_by: str = "solve"
    fail_reset: bool = False
    fail_step: bool = False
    raise_evaluate: bool = False
    steps: list[Any] = field(default_factory=list)

    def reset(self, task: dict[str, Any], observe: bool = True) -> None:
        if self.fail_reset:
            raise RuntimeError("set-up step 2 failed")
        self.steps.clear()

    def step(self, action: Any, observe: bool = True) -> None:
        if self.fail_step:
            raise RuntimeError("step refused")
        self.steps.append(action)

    def evaluate(self) -> Result:
        if self.raise_evaluate:
            raise RuntimeError("evaluation failed")
        return Result(1.0 if self.solved_by in self.steps else 0.0)


@dataclass
class FakeEnv:
    """OSWorld's side: reads the same state as the session, optionally off by a fixed answer."""

    session: FakeSession
    answer_after: float | None = None
    task: dict[str, Any] | None = None

    def _set_task_info(self, task: dict[str, Any]) -> None:
        self.task = task

    def evaluate(self) -> float:
        solved = self.session.solved_by in self.session.steps
        if solved and self.answer_after is not None:
            return self.answer_after
        return 1.0 if solved else 0.0


def task(task_id: str = "t1") -> dict[str, Any]:
    return {"id": task_id, "related_apps": ["os"], "osfleet_oracle": ["solve"], "evaluator": {}}


def test_a_task_both_evaluators_score_alike_is_equal() -> None:
    session = FakeSession()
    env = FakeEnv(session)
    row = parity.compare(env, session, task())
    assert (row["osworld_s0"], row["osfleet_s0"], row["osworld_after"], row["osfleet_after"]) == (0, 0, 1, 1)
    assert row["equal"] is True and "failed" not in row
    assert env.task is not None and "osfleet_oracle" not in env.task  # OSWorld sees the task as OSWorld wrote it


def test_different_scores_after_the_oracle_are_unequal() -> None:
    session = FakeSession()
    row = parity.compare(FakeEnv(session, answer_after=0.5), session, task())
    assert row["equal"] is False
    assert parity.summarize([row]) == {"compared": 1, "equal": 0, "unequal": ["t1"], "failed": []}


@pytest.mark.parametrize(
    ("session", "reason"),
    [
        (FakeSession(fail_reset=True), "osfleet's set-up: RuntimeError: set-up step 2 failed"),
        (FakeSession(fail_step=True), "the oracle: RuntimeError: step refused"),
        (FakeSession(raise_evaluate=True), "osfleet_s0: error: RuntimeError: evaluation failed"),
    ],
)
def test_what_raised_is_a_failure_named_in_the_row_not_a_score(session: FakeSession, reason: str) -> None:
    row = parity.compare(FakeEnv(session), session, task())
    assert reason in row["failed"]
    assert "equal" not in row
    assert parity.summarize([row])["failed"] == ["t1"]


def test_the_table_has_a_line_per_task_and_says_which_differ() -> None:
    good = FakeSession()
    rows = [
        parity.compare(FakeEnv(good), good, task("same")),
        parity.compare(FakeEnv(good, answer_after=0.0), good, task("differs")),
        parity.compare(FakeEnv(FakeSession(fail_reset=True)), FakeSession(fail_reset=True), task("broken")),
    ]
    lines = parity.markdown_table(rows).splitlines()
    assert len(lines) == 2 + 3
    assert lines[2].startswith("| `same` | os | 0 | 0 | 1 | 1 | yes |")
    assert "| **no** |" in lines[3]
    assert "not compared" in lines[4] and "set-up step 2 failed" in lines[4]


def test_tasks_come_from_the_shipped_suite_and_from_files(tmp_path: Path) -> None:
    suite = parity.tasks_from([], "osworld")
    assert len(suite) >= 40 and all("osfleet_oracle" in t for t in suite)
    one = tmp_path / "one.json"
    one.write_text(json.dumps(task("mine")))
    assert [t["id"] for t in parity.tasks_from([str(tmp_path)], None)] == ["mine"]


def test_a_shipped_suite_file_resolves_on_a_host_whose_store_never_saw_it(tmp_path: Path) -> None:
    """The parity check and OSWorld's harness send the suite's task files as they are; the host agent's store
    takes a shipped bundle's file in when a task first names it, and still refuses any other URL by name."""
    from osfleet.tasks.assets import AssetStore, MissingAssetError, shipped_assets

    store = AssetStore(tmp_path / "assets")
    url, file = next(iter(sorted(shipped_assets().items())))
    asset = store.resolve(url)
    assert store.path(url).read_bytes() == file.read_bytes() and asset.size == file.stat().st_size
    assert store.index() == {url: asset.sha256}
    with pytest.raises(MissingAssetError, match="https://assets.osfleet.invalid/not-shipped.xlsx"):
        store.resolve("https://assets.osfleet.invalid/not-shipped.xlsx")
