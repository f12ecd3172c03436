"""The SDK in ten lines: lease a desktop, reset it to a task, act on what you see, score it.

python examples/agent_loop.py http://127.0.0.1:8080 /var/lib/osfleet/api-token
"""

import sys

from osfleet.client import Fleet


def policy(screen, instruction):  # your agent: a model that reads the screen and the instruction
    return {"type": "cli_command", "command": "mkdir -p ~/notes && echo 'buy milk' > ~/notes/todo.txt"}


with Fleet(sys.argv[1], token_file=sys.argv[2]) as fleet, fleet.lease() as desktop:
    start = desktop.reset("cli-write-note")
    desktop.step(policy(start.screen, start.instruction))
    print(start.instruction, "-> reward", desktop.evaluate().reward)
