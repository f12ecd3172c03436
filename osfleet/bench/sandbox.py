"""``osfleet bench sandbox``: what the evaluation sandbox costs per evaluation, side by side in one run.

Three ways to score the same files, alternated round by round: the metric called in this process (what the
host agent did before the sandbox), in an evaluation of the sandbox's warm zygote inside the evaluation jail
(what it does now: bubblewrap, its own user, a PID, mount, network and IPC namespace per evaluation, seccomp),
and in a fresh interpreter that imports the metric modules first (the sandbox without a zygote). No VM: the
files are made here, as a guest would save them.
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
from typing import Any

from osfleet.measure.stats import distribution

Say = Callable[[str], None]
FRESH = (
    "import pickle, sys; from osfleet.tasks.osworld_format.metrics import METRICS; import openpyxl, docx, pptx; "
    "f, r, e, o = pickle.loads(bytes.fromhex(sys.argv[1])); METRICS[f](r, e, o)"
)


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
    return [("compare_table", book("a.xlsx"), book("b.xlsx"), {}), ("check_json", data, rules, {})]


def run(rounds: int = 20, fresh_rounds: int = 5, say: Say = print) -> dict[str, Any]:
    from osfleet.measure.host_facts import describe
    from osfleet.tasks.jail.sandbox import Sandbox
    from osfleet.tasks.osworld_format.metrics import METRICS

    result: dict[str, Any] = {"benchmark": "sandbox", "rounds": rounds, "fresh_rounds": fresh_rounds}
    box = Sandbox()
    try:
        t = time.perf_counter()
        box.start()
        result["zygote_start_s"] = time.perf_counter() - t
        result["network_isolated"] = bool(box.info.get("network_isolated"))
        result["preloaded"] = box.info.get("preloaded", [])
        result["jail_user"] = box.info.get("jail_user")
        with tempfile.TemporaryDirectory(prefix="osfleet-bench-sandbox-") as tmp:
            for func, got, want, options in _cases(Path(tmp)):
                say(f"{func}: {rounds} rounds here and in the sandbox, {fresh_rounds} in a fresh interpreter")
                METRICS[func](got, want, options)  # this process's imports are warm, as a host agent's would be
                here, sandboxed, fresh = [], [], []
                for i in range(rounds):
                    t = time.perf_counter()
                    direct = METRICS[func](got, want, options)
                    here.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    boxed = box.run(func, got, want, options)
                    sandboxed.append(time.perf_counter() - t)
                    if boxed != direct:
                        raise AssertionError(f"{func}: the sandbox scored {boxed}, this process {direct}")
                    if i < fresh_rounds:
                        job = pickle.dumps((func, got, want, options)).hex()
                        t = time.perf_counter()
                        subprocess.run([sys.executable, "-I", "-c", FRESH, job], check=True, capture_output=True)
                        fresh.append(time.perf_counter() - t)
                result[func] = {
                    "in_process_s": distribution(here),
                    "sandbox_s": distribution(sandboxed),
                    "fresh_interpreter_s": distribution(fresh),
                }
    finally:
        box.close()
    result["machine"] = describe()
    return result


def summary(result: dict[str, Any]) -> str:
    lines = [
        f"zygote ready in {result['zygote_start_s']:.2f} s, jailed as {result.get('jail_user')} "
        f"(network isolated: {result['network_isolated']})"
    ]
    for func in ("compare_table", "check_json"):
        r = result[func]
        lines.append(
            f"{func:>14}: in-process p50 {r['in_process_s']['p50'] * 1000:.1f} ms, sandbox p50 "
            f"{r['sandbox_s']['p50'] * 1000:.1f} ms (p95 {r['sandbox_s']['p95'] * 1000:.1f} ms), fresh interpreter "
            f"p50 {r['fresh_interpreter_s']['p50'] * 1000:.0f} ms"
        )
    return "\n".join(lines)
