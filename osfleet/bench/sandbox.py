"""``osfleet bench sandbox``: what the evaluation sandbox costs per evaluation, side by side in one run.

Three ways to score the same files, alternated round by round: the metric called in this process (what the
host agent did before the sandbox), in an evaluation of the sandbox's warm zygote inside the evaluation jail
(what it does now: bubblewrap, its own user, a PID, mount, network and IPC namespace per evaluation, its own
tmpfs and cgroup, seccomp), and in a fresh interpreter that imports the metric modules first (the sandbox without
a zygote). No VM: the files are made here, as a guest would save them.

``against``: another checkout's sandbox too, in the same rounds (this one's evaluation, then that one's), so a
change to the jail is timed before and after side by side: the path of that checkout's Python (a virtualenv
whose ``osfleet`` is the other tree), which runs ``AGAINST`` and keeps its own sandbox warm.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from osfleet.errors import OsfleetError
from osfleet.measure.stats import distribution

Say = Callable[[str], None]
FRESH = (
    "import pickle, sys; from osfleet.tasks.osworld_format.metrics import METRICS; import openpyxl, docx, pptx; "
    "f, r, e, o = pickle.loads(bytes.fromhex(sys.argv[1])); METRICS[f](r, e, o)"
)

# Run by the other checkout's Python: one line of JSON about its sandbox, then for each line of input (a pickled
# case, hex) one line with the seconds its sandbox took and the score. Only the sandbox's public API, which both
# sides share.
AGAINST = r"""
import json, pickle, sys, time
import osfleet
from osfleet.tasks.jail.sandbox import Sandbox
box = Sandbox()
t = time.perf_counter()
box.start()
print(json.dumps({"osfleet": osfleet.__file__, "zygote_start_s": time.perf_counter() - t,
                  "cgroup": box.info.get("cgroup")}), flush=True)
try:
    for line in sys.stdin:
        func, result, expected, options = pickle.loads(bytes.fromhex(line))
        t = time.perf_counter()
        score = box.run(func, result, expected, options)
        print(json.dumps({"seconds": time.perf_counter() - t, "score": list(score)}), flush=True)
finally:
    box.close()
"""


class _Against:
    """The other checkout's sandbox, in a process of its Python (``AGAINST``)."""

    def __init__(self, python: Path) -> None:
        self.python = python
        self.proc = subprocess.Popen(
            [str(python), "-I", "-c", AGAINST], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.info: dict[str, Any] = json.loads(self._line())

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise OsfleetError(
                f"--against {self.python}: its sandbox ended (exit {self.proc.wait()}) before answering; its own "
                "virtualenv must import that checkout's osfleet with its dependencies (its error is printed above)"
            )
        return line

    def run(self, case: tuple[str, Any, Any, dict[str, Any]]) -> tuple[float, tuple[float, str]]:
        stdin: IO[str] | None = self.proc.stdin
        assert stdin is not None
        stdin.write(pickle.dumps(case).hex() + "\n")
        stdin.flush()
        answer = json.loads(self._line())
        return float(answer["seconds"]), (float(answer["score"][0]), str(answer["score"][1]))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _cases(folder: Path) -> list[tuple[str, Any, Any, dict[str, Any]]]:
    from openpyxl import Workbook

    def book(name: str) -> Path:
        wb = Workbook()
        ws = wb.active
        assert ws is not None
        for row in [["name", "n"], *[[f"x{i}", i] for i in range(50)]]:
            ws.append(row)
        wb.save(folder / name)
        return folder / name

    data = folder / "settings.json"
    data.write_text(json.dumps({"editor": {"fontSize": 14}}))
    rules = {"expect": [{"key": ["editor", "fontSize"], "ref": 14}]}
    solution, suite = folder / "solution.py", folder / "test_suite.py"
    solution.write_text("def answer():\n    return 42\n")
    suite.write_text("from solution import answer\n\ndef test():\n    return answer() == 42\n")
    return [
        ("compare_table", book("a.xlsx"), book("b.xlsx"), {}),
        ("check_json", data, rules, {}),
        ("check_python_file_by_test_suite", solution, suite, {"test_function_name": "test"}),
    ]


def run(rounds: int = 20, fresh_rounds: int = 5, say: Say = print, against: Path | None = None) -> dict[str, Any]:
    from osfleet.measure.host_facts import describe
    from osfleet.tasks.jail.sandbox import Sandbox
    from osfleet.tasks.osworld_format.metrics import METRICS

    result: dict[str, Any] = {"benchmark": "sandbox", "rounds": rounds, "fresh_rounds": fresh_rounds}
    box = Sandbox()
    other: _Against | None = None
    try:
        t = time.perf_counter()
        box.start()
        result["zygote_start_s"] = time.perf_counter() - t
        result["network_isolated"] = bool(box.info.get("network_isolated"))
        result["preloaded"] = box.info.get("preloaded", [])
        result["jail_user"] = box.info.get("jail_user")
        result["cgroup"] = box.info.get("cgroup")
        if against is not None:
            say(f"starting the sandbox of {against}")
            other = _Against(against)
            result["against"] = {"python": str(against), **other.info}
        with tempfile.TemporaryDirectory(prefix="osfleet-bench-sandbox-") as tmp:
            for case in _cases(Path(tmp)):
                func, got, want, options = case
                also = " and in the other checkout's" if other is not None else ""
                say(f"{func}: {rounds} rounds here and in the sandbox{also}, {fresh_rounds} in a fresh interpreter")
                METRICS[func](got, want, options)  # this process's imports are warm, as a host agent's would be
                here, sandboxed, theirs, fresh = [], [], [], []
                for i in range(rounds):
                    t = time.perf_counter()
                    direct = METRICS[func](got, want, options)
                    here.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    boxed = box.run(func, got, want, options)
                    sandboxed.append(time.perf_counter() - t)
                    if boxed != direct:
                        raise AssertionError(f"{func}: the sandbox scored {boxed}, this process {direct}")
                    if other is not None:
                        took, scored = other.run(case)
                        theirs.append(took)
                        if scored != direct:
                            raise AssertionError(f"{func}: the other checkout scored {scored}, this one {direct}")
                    if i < fresh_rounds:
                        job = pickle.dumps(case).hex()
                        t = time.perf_counter()
                        subprocess.run([sys.executable, "-I", "-c", FRESH, job], check=True, capture_output=True)
                        fresh.append(time.perf_counter() - t)
                result[func] = {
                    "in_process_s": distribution(here),
                    "sandbox_s": distribution(sandboxed),
                    "fresh_interpreter_s": distribution(fresh),
                }
                if theirs:
                    result[func]["against_sandbox_s"] = distribution(theirs)
    finally:
        if other is not None:
            other.close()
        box.close()
    result["machine"] = describe()
    return result


def summary(result: dict[str, Any]) -> str:
    lines = [
        f"zygote ready in {result['zygote_start_s']:.2f} s, jailed as {result.get('jail_user')} "
        f"(network isolated: {result['network_isolated']})"
    ]
    for func in ("compare_table", "check_json", "check_python_file_by_test_suite"):
        r = result[func]
        line = (
            f"{func}: in-process p50 {r['in_process_s']['p50'] * 1000:.1f} ms, sandbox p50 "
            f"{r['sandbox_s']['p50'] * 1000:.1f} ms (p95 {r['sandbox_s']['p95'] * 1000:.1f} ms), fresh interpreter "
            f"p50 {r['fresh_interpreter_s']['p50'] * 1000:.0f} ms"
        )
        if "against_sandbox_s" in r:
            a = r["against_sandbox_s"]
            line += f"; the other checkout's sandbox p50 {a['p50'] * 1000:.1f} ms (p95 {a['p95'] * 1000:.1f} ms)"
        lines.append(line)
    return "\n".join(lines)
