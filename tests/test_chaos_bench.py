"""A short chaos run in the default suite: one host agent behind the gateway, one Locust agent, two faults."""

from __future__ import annotations

from pathlib import Path

import pytest

from osfleet.bench import chaos as chaos_bench
from osfleet.config import Settings
from osfleet.vm.images import GoldenImage

pytestmark = pytest.mark.vm


def test_a_short_chaos_run_loses_nothing_and_leaves_nothing(
    golden: GoldenImage, settings: Settings, tmp_path: Path, no_leftovers: None
) -> None:
    result = chaos_bench.run(
        golden,
        settings,
        tmp_path / "run",
        hosts=1,
        warm=1,
        users=1,
        duration_s=75,
        every_s=15.0,
        kinds=("kill_qemu", "delete_overlay"),
        say=lambda m: None,
        pick="any",  # one agent leaves its replica between episodes now and then: hit it either way
    )
    assert len(result["faults"]) + len(result["faults_refused"]) == 2  # each planned fault injected or refused
    assert result["fault_kinds"] >= 1  # a refusal means no replica was running at that moment
    assert result["scored_episodes"] >= 1
    assert result["lost_actions"] == 0 and result["duplicated_actions"] == 0
    assert result["collateral_aborts"] == 0 and result["unrecovered_faults"] == 0
    assert result["leaks"] == {"domains": 0, "qemu_processes": 0, "homes": 0, "mounts": 0, "agents": 0}
    assert (tmp_path / "run" / "chaos.json").exists() and (tmp_path / "run" / "faults.jsonl").exists()
