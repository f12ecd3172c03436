"""The board an MCP server's agent and grader surfaces share (``osfleet.mcp.roles.Board``): what it keeps is bounded,
and what goes to ``--results-file`` is every submission."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from osfleet.mcp.roles import MAX_SUBMISSIONS_KEPT, Board, Submission
from osfleet.protocol.tasks import Evaluation

pytestmark = pytest.mark.unit


def test_the_board_keeps_the_newest_submissions_and_the_file_all(tmp_path: Path) -> None:
    board = Board(results_file=tmp_path / "results.jsonl")
    scored = Evaluation(reward=1.0, success=True, criteria=[])
    for n in range(MAX_SUBMISSIONS_KEPT + 5):
        board.submit(Submission(f"s{n}", "r-1", "t", float(n), scored))
    board.submit(Submission("s3", "r-1", "t", 9e9, scored))  # an old session submits again: it is newest now
    assert len(board.submissions) == MAX_SUBMISSIONS_KEPT
    assert "s0" not in board.submissions and "s3" in board.submissions and "s4" not in board.submissions
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == MAX_SUBMISSIONS_KEPT + 6 and json.loads(lines[-1])["session"] == "s3"
