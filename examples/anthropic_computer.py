"""Claude on an osfleet desktop: Anthropic's tool runner with osfleet's computer toolset, solving a built-in task.

ANTHROPIC_API_KEY=... python examples/anthropic_computer.py http://127.0.0.1:8080 /var/lib/osfleet/api-token
"""

import os
import sys

import anthropic

from osfleet.client import Fleet
from osfleet.client.anthropic import ComputerToolset

MODEL = os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-5-5")


def confirm(context):  # asked before every member call: a person would approve typing here; this example allows all
    return True


with Fleet(sys.argv[1], token_file=sys.argv[2]) as fleet, fleet.lease("claude") as desktop:
    task = desktop.reset("cli-write-note")
    with ComputerToolset(desktop, confirm=confirm) as computer:
        runner = anthropic.Anthropic().beta.messages.tool_runner(
            model=MODEL,
            max_tokens=4096,
            max_iterations=40,
            tools=[computer],
            messages=[{"role": "user", "content": task.instruction}],
        )
        for message in runner:  # each of Claude's turns; the runner answers its tool calls on the desktop
            print(*(block.text for block in message.content if block.type == "text"))
    print(task.instruction, "-> reward", desktop.evaluate().reward)
