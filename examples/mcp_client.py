"""An MCP client (the ``mcp`` SDK's own) driving a desktop through ``osfleet mcp serve`` over stdio, as an agent
framework would: list the tools, look at the screen, run a command, read a file back, score the task.

    python examples/mcp_client.py http://127.0.0.1:8080 /var/lib/osfleet/api-token
"""

import asyncio
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(url: str, token_file: str) -> None:
    server = StdioServerParameters(command="osfleet", args=["mcp", "serve", "--url", url, "--token-file", token_file])
    async with stdio_client(server) as (read, write), ClientSession(read, write) as mcp:
        await mcp.initialize()
        print("tools:", ", ".join(t.name for t in (await mcp.list_tools()).tools))
        started = await mcp.call_tool("reset", {"task_id": "cli-write-note"})
        print(started.content[0].text)
        shot = await mcp.call_tool("screenshot", {})
        print("screenshot:", shot.content[1].text)
        await mcp.call_tool("run_command", {"command": "mkdir -p ~/notes && echo 'buy milk' > ~/notes/todo.txt"})
        note = await mcp.call_tool("read_file", {"path": "/home/user/notes/todo.txt"})
        print("the note says:", note.content[0].text.strip())
        score = await mcp.call_tool("evaluate", {})
        print(score.content[0].text.splitlines()[0])
    # the session is over: its desktop went back to the fleet


asyncio.run(main(sys.argv[1], sys.argv[2]))
