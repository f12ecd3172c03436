"""Every metric's value, and every reward, is a finite number in [0, 1]; anything else scores 0 with the reason
(``osfleet.tasks.rewards``), whichever metric and whichever task format it came through.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from osfleet.protocol.tasks import CriterionResult
from osfleet.tasks import rewards
from osfleet.tasks.jail.sandbox import Sandbox
from osfleet.tasks.model import TaskError, parse_task, score


@pytest.mark.unit
@pytest.mark.parametrize("raw", [0, 1, 0.0, 0.25, 1.0, True, False])
def test_a_number_in_the_range_is_itself(raw: object) -> None:
    assert rewards.value("m", raw) == (float(raw), None)  # type: ignore[arg-type]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (1e300, "1e+300"),
        (-0.5, "-0.5"),
        (1.0000001, "1.0000001"),
        (2, "2"),
        (math.inf, "inf"),
        (-math.inf, "-inf"),
        (math.nan, "nan"),
        pytest.param(10**5000, "an integer of more than 30 digits", id="huge-int"),
        ("1.0", "a str"),
        (None, "a NoneType"),
        ([1.0], "a list"),
    ],
)
def test_anything_else_scores_zero_naming_it(raw: object, shown: str) -> None:
    assert rewards.value("run_sqlite3", raw) == (0.0, f"run_sqlite3 gave {shown}, not a number in [0, 1]: scored 0")


@pytest.mark.unit
@pytest.mark.parametrize("weight", ["Infinity", "-Infinity", "NaN"])
def test_a_weight_that_is_not_finite_is_refused(weight: str) -> None:
    check = '{"type": "file_content", "path": "/home/user/a", "absent": true}'
    task = json.loads(
        f'{{"id": "w", "instruction": "x", "criteria": [{{"name": "a", "weight": {weight}, "check": {check}}}]}}'
    )  # (Python's JSON reader takes Infinity and NaN, as FastAPI's does)
    with pytest.raises(TaskError, match="weight"):
        parse_task(task)


@pytest.mark.unit
def test_the_largest_finite_weights_still_give_a_share_in_the_range() -> None:
    def result(met: bool) -> CriterionResult:
        return CriterionResult(name="c", met=met, weight=1.7e308, required=True)

    assert score([result(True), result(True)]).reward == 1.0  # (1.7e308 + 1.7e308 overflows to inf: inf / inf)
    assert score([result(True), result(False)]).reward == 0.5


@pytest.mark.system
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("select 1e300", (0.0, "run_sqlite3 gave 1e+300, not a number in [0, 1]: scored 0")),
        ("select 2", (0.0, "run_sqlite3 gave 2.0, not a number in [0, 1]: scored 0")),
        ("select -1", (0.0, "run_sqlite3 gave -1.0, not a number in [0, 1]: scored 0")),
        ("select 9e999", (0.0, "run_sqlite3 gave inf, not a number in [0, 1]: scored 0")),
        ("select 0.5", (0.5, "the query gave 0.5")),
    ],
)
def test_a_metric_out_of_the_range_scores_zero_in_the_sandbox(
    box: Sandbox, tmp_path: Path, query: str, expected: tuple[float, str]
) -> None:
    """OSWorld's run_sqlite3 returns its query's number, whatever it is: the sandbox, where every metric's value
    comes from, scores anything out of [0, 1] 0."""
    db = tmp_path / "mail.sqlite"
    sqlite3.connect(db).close()
    assert box.run("run_sqlite3", db, {"sql": query}, {}) == expected
