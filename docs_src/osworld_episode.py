"""An OSWorld task file, unchanged, as one episode: OSWorld's set-up, an agent's actions, OSWorld's metric."""

import json
from pathlib import Path

from osfleet.client import Fleet

TASK = Path("osfleet/tasks/suites/osworld/calc-rename-sheet.json")

with (
    Fleet("http://127.0.0.1:8080", token_file="/var/lib/osfleet/api-token") as fleet,
    fleet.lease() as desktop,
):
    start = desktop.reset(TASK)  # runs the task's "config": downloads budget.xlsx into the guest
    print(start.instruction)
    print("reward before:", desktop.evaluate().reward)  # the untouched file does not match: 0
    # What a perfect agent would do, kept in the file under a key OSWorld ignores.
    desktop.step(json.loads(TASK.read_text())["osfleet_oracle"])
    after = desktop.evaluate()  # compare_table on the guest's file against the expected one
    print("reward after:", after.reward)
    for criterion in after.criteria:
        print(criterion.name, criterion.met, criterion.detail)
