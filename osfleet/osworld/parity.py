"""``python -m osfleet.osworld.parity``: OSWorld's own evaluator and osfleet's, on the same replica, task by task.

Run with a Python that has desktop-env (``scripts/setup-osworld-harness --print-python``) against a fleet serving
the office image (``OSFLEET_URL``, ``OSFLEET_TOKEN`` or ``OSFLEET_TOKEN_FILE``). One ``DesktopEnv`` leases one
replica through osfleet's provider; for each task (OSWorld's JSON, e.g. the shipped ``osworld`` suite):

1. osfleet sets the task up on the replica (``Session.reset(task)``: osfleet's runner, its set-up);
2. OSWorld's ``DesktopEnv`` is told the task (``_set_task_info``: its evaluator, no set-up of its own) and both
   score the untouched state: ``env.evaluate()`` (OSWorld's getters and metrics, through the provider's in-VM
   protocol server, Chrome forward and VLC relay) and ``session.evaluate()`` (osfleet's, on the host);
3. the task's oracle (``osfleet_oracle``: the shell commands that solve it) runs, and both score again.

A task is *equal* when both evaluators give the same reward at both points. One JSON line per task on stdout (or
``--out``), then a summary line: compared, equal, unequal, failed (the set-up, the oracle or an evaluator raised:
named in the row).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

SCORES = ("osworld_s0", "osfleet_s0", "osworld_after", "osfleet_after")
SUITES = Path(__file__).resolve().parent.parent / "tasks" / "suites"


def tasks_from(paths: list[str], suite: str | None) -> list[dict[str, Any]]:
    files: list[Path] = []
    if suite:
        files += sorted((SUITES / suite).glob("*.json"))
    for p in map(Path, paths):
        files += sorted(p.glob("*.json")) if p.is_dir() else [p]
    return [json.loads(f.read_text()) for f in files]


def score(fn: Any) -> float | str:
    try:
        return float(fn())
    except Exception as exc:  # an evaluator that raised: the row says which and why
        return f"error: {type(exc).__name__}: {str(exc)[:200]}"


def osfleet_score(session: Any, row: dict[str, Any], key: str) -> float:
    """osfleet's reward, its criteria's details kept in the row (what to read when the two differ)."""
    evaluation = session.evaluate()
    row[f"{key}_detail"] = "; ".join(c.detail for c in getattr(evaluation, "criteria", []) if c.detail)[:400]
    return float(evaluation.reward)


def compare(env: Any, session: Any, task: dict[str, Any]) -> dict[str, Any]:
    oracle = task.pop("osfleet_oracle", [])
    row: dict[str, Any] = {"id": task["id"], "apps": task.get("related_apps", [])}
    started = time.monotonic()
    try:
        session.reset(task, observe=False)
    except Exception as exc:
        row["failed"] = f"osfleet's set-up: {type(exc).__name__}: {str(exc)[:200]}"
        return row
    env._set_task_info(task)
    row["osworld_s0"] = score(env.evaluate)
    row["osfleet_s0"] = score(lambda: osfleet_score(session, row, "osfleet_s0"))
    try:
        for action in oracle:
            session.step(action, observe=False)
    except Exception as exc:
        row["failed"] = f"the oracle: {type(exc).__name__}: {str(exc)[:200]}"
        return row
    row["osworld_after"] = score(env.evaluate)
    row["osfleet_after"] = score(lambda: osfleet_score(session, row, "osfleet_after"))
    row["seconds"] = round(time.monotonic() - started, 1)
    raised = [f"{key}: {row[key]}" for key in SCORES if isinstance(row[key], str)]
    if raised:  # an evaluator that could not score is not a score to compare
        row["failed"] = "; ".join(raised)
        return row
    row["equal"] = row["osworld_s0"] == row["osfleet_s0"] and row["osworld_after"] == row["osfleet_after"]
    return row


def _cell(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value).replace("|", "\\|")


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The rows as the table the benchmarks page shows: one line per task, both evaluators at s0 and after."""
    lines = [
        "| task | apps | OSWorld s0 | osfleet s0 | OSWorld after oracle | osfleet after oracle | equal | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        apps = ", ".join(r.get("apps", []))
        if "failed" in r:
            lines.append(f"| `{r['id']}` | {apps} | {_cell(r['failed'])} | | | | not compared | |")
            continue
        cells = [_cell(r[k]) for k in SCORES]
        lines.append(f"| `{r['id']}` | {apps} | {' | '.join(cells)} | {'yes' if r['equal'] else '**no**'} "
                     f"| {r['seconds']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """compared, equal, the ids of unequal tasks and of tasks one evaluator could not score."""
    failed = [r["id"] for r in rows if "failed" in r]
    unequal = [r["id"] for r in rows if "failed" not in r and not r["equal"]]
    return {"compared": len(rows) - len(failed), "equal": len(rows) - len(failed) - len(unequal),
            "unequal": unequal, "failed": failed}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m osfleet.osworld.parity", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="task JSON files or folders of them")
    parser.add_argument("--suite", help="a shipped suite (osworld)")
    parser.add_argument("--only", help="comma-separated task ids to keep")
    parser.add_argument("--out", help="also write the rows to this JSON-lines file")
    parser.add_argument("--markdown", help="also write the rows as a Markdown table to this file")
    parser.add_argument("--cache-dir", default="cache", help="DesktopEnv's cache folder")
    args = parser.parse_args(argv)
    tasks = tasks_from(args.paths, args.suite)
    if args.only:
        keep = set(args.only.split(","))
        tasks = [t for t in tasks if t["id"] in keep]
    if not tasks:
        parser.error("no tasks: give files, folders or --suite")

    import osfleet.osworld

    osfleet.osworld.register()
    from desktop_env.desktop_env import DesktopEnv

    env = DesktopEnv(provider_name="osfleet", action_space="pyautogui", require_a11y_tree=False, headless=True,
                     os_type="Ubuntu", cache_dir=args.cache_dir)  # fmt: skip
    out = open(args.out, "w") if args.out else None  # noqa: SIM115 (closed below)
    rows = []
    try:
        session = env.provider.desktop
        for i, task in enumerate(tasks, 1):
            row = compare(env, session, task)
            rows.append(row)
            line = json.dumps(row)
            print(line, flush=True)
            if out:
                out.write(line + "\n")
                out.flush()
            print(f"[parity] {i}/{len(tasks)} {row['id']}: {'equal' if row.get('equal') else 'NOT equal'}",
                  file=sys.stderr, flush=True)  # fmt: skip
    finally:
        env.close()
        if out:
            out.close()
    summary = summarize(rows)
    if args.markdown:
        Path(args.markdown).write_text(markdown_table(rows))
    print(json.dumps({"summary": summary}))
    return 0 if not summary["unequal"] and not summary["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
