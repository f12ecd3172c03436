"""``check_python_file_by_test_suite``: the task's test suite (a Python file) run against the agent's code.

OSWorld imports the test file in its own process, with the test file's folder (where its getters put the
agent's files too) as the working directory, calls its ``test`` function (option ``test_function_name``)
and scores its answer: a bool as 1/0, a number clamped to [0, 1], anything else by its truth; a file that
is missing, does not import, or whose test raises scores 0.

Here the test runs in a separate Python process (``python -I``), in a fresh folder holding the test file
and the agent's files under the names the task gave them (the getter's numbered prefix dropped), with a
time limit (``TEST_SECONDS``), an address-space limit and an empty environment, inside the evaluation jail
(``osfleet.tasks.jail``): like every metric, this one runs only in the sandbox's jailed evaluation process, so
the agent's code sees its own folder, an empty network and a read-only Python, as an unprivileged user with no
capabilities, under a seccomp filter, and everything it starts ends with the evaluation. The suite's output
goes to files, and the answer is read when the suite's own process exits (a process it left behind holding a
pipe open cannot keep the evaluation waiting). The test can import only what osfleet's Python has installed;
OSWorld's host has its own packages, so a test suite that imports something osfleet lacks scores 0 here.
"""

from __future__ import annotations

import json
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from osfleet.tasks.jail.seccomp import KILLED_BY
from osfleet.tasks.osworld_format.metrics.common import CannotScore, Metric, Score, file_path, scored, short

TEST_SECONDS = 120
TEST_MEMORY_BYTES = 2 * 2**30
_GETTER_PREFIX = re.compile(r"^\d+-")

# Runs in the child: argv = [test file, test function name]; prints {"score"} or {"error"} as its last line.
_RUNNER = r"""
import importlib.util, json, os, sys
path, name = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.dirname(path))
def answer(**kw):
    sys.__stdout__.write("\n" + json.dumps(kw) + "\n")
try:
    spec = importlib.util.spec_from_file_location("osfleet_test_suite", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["osfleet_test_suite"] = module
    spec.loader.exec_module(module)
    test = getattr(module, name, None)
    if not callable(test):
        answer(error=f"no test function {name!r}")
    else:
        r = test()
        if isinstance(r, bool):
            answer(score=1.0 if r else 0.0)
        elif isinstance(r, (int, float)):
            answer(score=max(0.0, min(1.0, float(r))))
        else:
            answer(score=1.0 if bool(r) else 0.0)
except BaseException as exc:
    answer(error=f"{type(exc).__name__}: {str(exc)[:200]}")
"""


def _limits() -> None:
    """Never above the limits it already runs under (the evaluation sandbox's): a hard limit cannot be raised."""
    for kind, cap in ((resource.RLIMIT_AS, TEST_MEMORY_BYTES), (resource.RLIMIT_CORE, 0)):
        _, hard = resource.getrlimit(kind)
        cap = cap if hard == resource.RLIM_INFINITY else min(cap, hard)
        resource.setrlimit(kind, (cap, cap))


def _files(value: Any) -> list[Path]:
    if value is None:
        return []
    values = value if isinstance(value, list | tuple) else [value]
    return [file_path(v) for v in values if v]


@scored("test_function_name")
def check_python_file_by_test_suite(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not expected:
        return 0.0, "no test suite"
    suite = file_path(expected)
    if not suite.is_file():
        return 0.0, "the test suite does not exist"
    name = str(options.get("test_function_name", "test"))
    with tempfile.TemporaryDirectory(prefix="osfleet-test-suite-") as tmp:
        folder = Path(tmp)
        for f in _files(result):
            if f.is_file():
                shutil.copyfile(f, folder / _GETTER_PREFIX.sub("", f.name))
        test = folder / _GETTER_PREFIX.sub("", suite.name)
        shutil.copyfile(suite, test)
        out, err = folder / ".stdout", folder / ".stderr"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _RUNNER, str(test), name],
                cwd=folder,
                env={"PATH": "/usr/bin:/bin", "HOME": str(folder)},
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                preexec_fn=_limits,
            )
        try:
            code = proc.wait(TEST_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return 0.0, f"the test suite ran longer than {TEST_SECONDS} s"
        lines = _tail(out).strip().splitlines()
        said = _tail(err)
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except ValueError:
        answer = {}
    if "score" in answer:
        return float(answer["score"]), f"the test suite gave {answer['score']}"
    if "error" in answer:
        return 0.0, f"the test suite failed: {short(answer['error'], 200)}"
    if code == -signal.SIGSYS:
        return 0.0, f"the test suite was stopped: {KILLED_BY}"
    raise CannotScore(f"the test suite gave no answer (exit {code}): {short(said[-200:])}")


def _tail(path: Path, limit: int = 64 * 1024) -> str:
    """The last ``limit`` bytes of a file the suite wrote (it may have written up to its file-size limit)."""
    with path.open("rb") as f:
        f.seek(max(path.stat().st_size - limit, 0))
        return f.read().decode(errors="replace")


METRICS: dict[str, Metric] = {"check_python_file_by_test_suite": check_python_file_by_test_suite}
NEEDS: dict[str, tuple[str, ...]] = {}
