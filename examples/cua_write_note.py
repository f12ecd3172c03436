"""Cua's computer on an osfleet desktop: `osfleet cua serve` is the computer-server cua-computer finds on localhost.

osfleet cua serve --url http://127.0.0.1:8080 --token-file /var/lib/osfleet/api-token &
python examples/cua_write_note.py
"""

import asyncio
import os

os.environ.setdefault("CUA_TELEMETRY_ENABLED", "false")  # before computer is imported: it reports usage otherwise

from computer import Computer  # noqa: E402


async def main():
    async with Computer(os_type="linux", use_host_computer_server=True, telemetry_enabled=False) as computer:
        screen = await computer.interface.get_screen_size()
        print("screen", screen["width"], "x", screen["height"])
        await computer.interface.left_click(200, 200)  # the terminal
        await computer.interface.type_text("mkdir -p ~/notes && echo 'buy milk' > ~/notes/todo.txt\n")
        await asyncio.sleep(2)
        done = await computer.interface.run_command("cat ~/notes/todo.txt")  # as the desktop user
        print(done.stdout, end="")


asyncio.run(main())
