"""An OpenAI agent on osfleet desktops: openai-agents' Runner with a computer tool whose provider leases a desktop
for the run (reset to a built-in task) and scores it before giving it back.

OPENAI_API_KEY=... python examples/openai_computer.py http://127.0.0.1:8080 /var/lib/osfleet/api-token
"""

import asyncio
import os
import sys

from agents import Agent, ComputerTool, Runner

from osfleet.client import AsyncFleet
from osfleet.client.openai import desktop_provider

MODEL = os.environ.get("OPENAI_MODEL", "gpt-5.5")
REQUEST = "Write the line 'buy milk' into ~/notes/todo.txt (make the folder if it is not there)."


async def score(session):  # before the desktop goes back to the fleet
    print(REQUEST, "-> reward", (await session.evaluate()).reward)


async def main():
    async with AsyncFleet(sys.argv[1], token_file=sys.argv[2]) as fleet:
        desktops = desktop_provider(fleet, "cli-write-note", before_release=score)
        agent = Agent(name="desktop", model=MODEL, tools=[ComputerTool(computer=desktops)])
        result = await Runner.run(agent, REQUEST, max_turns=40)
        print(result.final_output)


asyncio.run(main())
