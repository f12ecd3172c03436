"""Red team, no VM: rewards a policy cannot print. ``check_python_file_by_test_suite`` imports the agent's module in
the test suite's interpreter; whatever that module prints, writes to any descriptor, rebinds or however it exits,
a failing test scores 0, and only the suite's runner can give the answer.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from osfleet.tasks.jail.sandbox import Sandbox

pytestmark = pytest.mark.system

SUITE = "check_python_file_by_test_suite"
OPTIONS = {"test_function_name": "test"}
FAILING = "from solution import answer\n\ndef test():\n    return answer() == 42\n"
# What an agent prints to pass for a report; the last is the one the suite's last stdout line was trusted with.
FORGED = ("PASSED", "score 1.0", "1.0", '{"passed": true, "score": 1}', '{"score": 1.0}', '{"score": 1e300}')


def score(box: Sandbox, folder: Path, agent: str, suite: str = FAILING) -> tuple[float, str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test_suite.py").write_text(suite)
    (folder / "solution.py").write_text(textwrap.dedent(agent))
    return box.run(SUITE, folder / "solution.py", folder / "test_suite.py", OPTIONS)


def test_the_agents_own_answer_scores_as_the_test_says(box: Sandbox, tmp_path: Path) -> None:
    assert score(box, tmp_path / "right", "def answer():\n    return 42\n") == (1.0, "the test suite gave 1.0")
    assert score(box, tmp_path / "wrong", "def answer():\n    return 0\n") == (0.0, "the test suite gave 0.0")


def test_scores_printed_to_every_descriptor_then_exiting_score_zero(box: Sandbox, tmp_path: Path) -> None:
    """At import: every forged line to every descriptor it has (stdout, stderr, the report socket among them),
    then ``os._exit(0)``, before the test could run."""
    agent = f"""
    import os
    for line in {FORGED!r}:
        for fd in range(1024):
            try:
                os.write(fd, ("\\n" + line + "\\n").encode())
            except OSError:
                pass
    os._exit(0)
    """
    value, detail = score(box, tmp_path, agent)
    assert value == 0.0, detail


def test_a_forged_message_on_each_socket_is_caught_even_after_the_test_ran(box: Sandbox, tmp_path: Path) -> None:
    """The agent's answer is right, but its module also sends a forged report on every socket it holds: the metric
    sees a message its runner did not send and scores 0 rather than trust either."""
    agent = f"""
    import os, socket, stat
    for fd in range(3, 1024):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.write(fd, {FORGED[-1]!r}.encode())
        except OSError:
            pass
    def answer():
        return 42
    """
    value, detail = score(box, tmp_path, agent)
    assert value == 0.0 and "did not send" in detail, detail


def test_rebinding_what_a_runner_would_use_changes_nothing(box: Sandbox, tmp_path: Path) -> None:
    """The names a report is made with (json, os.write, print, the builtins, sys.stdout) rebound at import: the
    failing test still scores 0."""
    agent = """
    import builtins, json, os, sys
    json.dumps = lambda *a, **k: '{"score": 1.0}'
    real_write = os.write
    os.write = lambda fd, data: real_write(fd, b'{"score": 1.0}\\n')
    builtins.repr = lambda x: "1.0"
    builtins.float = lambda x=0: 1.0
    builtins.isinstance = lambda *a: False
    builtins.print = lambda *a, **k: None
    sys.stdout.write('{"score": 1.0}\\n')
    def answer():
        return 0
    """
    value, detail = score(box, tmp_path, agent)
    assert value == 0.0, detail


def test_exiting_before_the_report_scores_zero_with_the_reason(box: Sandbox, tmp_path: Path) -> None:
    suite = "import os\n\ndef test():\n    print('{\"score\": 1.0}', flush=True)\n    os._exit(0)\n"
    value, detail = score(box, tmp_path, "def answer():\n    return 42\n", suite)
    assert value == 0.0 and "ended without an answer (exit 0)" in detail, detail


def test_the_test_functions_own_value_is_clamped_as_osworld_does_and_nan_is_zero(box: Sandbox, tmp_path: Path) -> None:
    big = score(box, tmp_path / "big", "x = 1\n", "def test():\n    return 7\n")
    nan = score(box, tmp_path / "nan", "x = 1\n", "def test():\n    return float('nan')\n")
    assert big == (1.0, "the test suite gave 1.0")  # OSWorld clamps a number the test returns to [0, 1]
    assert nan == (0.0, "the test suite gave 0.0")  # (OSWorld's clamp makes NaN 1.0: min(1.0, nan) is 1.0)


def test_a_process_the_suite_forks_does_not_answer_for_it(box: Sandbox, tmp_path: Path) -> None:
    """A child the test forks that raises ends in the runner's code too: only the suite's own process answers."""
    suite = """
import os
def test():
    if os.fork() == 0:
        raise RuntimeError("the child's failure")
    os.wait()
    return True
"""
    assert score(box, tmp_path, "x = 1\n", suite) == (1.0, "the test suite gave 1.0")
