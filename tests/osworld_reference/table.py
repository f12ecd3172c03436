"""``python -m tests.osworld_reference.table``: the differential check's summary, ``metric | cases | equal``,
with the metrics that have no case or run against a stand-in, and every unequal case.

Runs the cases of every ``*_cases.py`` module of this folder that exposes a ``REGISTRY`` (the office ones, and
any other family's), outside pytest, against OSWorld's functions in the reference environment.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from tests.osworld_reference.cases import Case, References, compare, same

HERE = Path(__file__).resolve().parent


def case_modules() -> list[Any]:
    return [importlib.import_module(f"tests.osworld_reference.{p.stem}") for p in sorted(HERE.glob("*_cases.py"))]


def main() -> int:
    modules = case_modules()
    cases: list[Case] = [c for m in modules for c in m.REGISTRY.cases]  # type: ignore[attr-defined]
    total: Counter[str] = Counter()
    equal: Counter[str] = Counter()
    unequal = []
    refs = References()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i, case in enumerate(cases):
                ours, reason, theirs, how = compare(refs, case, Path(tmp) / str(i))
                total[case.metric] += 1
                if same(ours, theirs):
                    equal[case.metric] += 1
                else:
                    unequal.append(f"{case.id}: osfleet {ours} ({reason}) vs OSWorld {theirs} ({how})")
    finally:
        refs.close()
    width = max(len(m) for m in total)
    print(f"{'metric':<{width}} | cases | equal")
    print(f"{'-' * width}-|-------|------")
    for metric in sorted(total):
        print(f"{metric:<{width}} | {total[metric]:5d} | {equal[metric]:5d}")
    print(f"{'all':<{width}} | {sum(total.values()):5d} | {sum(equal.values()):5d}")
    for m in modules:
        for title, table in (("no case (reference cannot run)", "UNCHECKED"), ("reference with a stand-in", "SHIMMED")):
            for metric, why in getattr(m, table, {}).items():
                print(f"{title}: {metric}: {why}")
    for line in unequal:
        print("UNEQUAL", line)
    return 1 if unequal else 0


if __name__ == "__main__":
    sys.exit(main())
