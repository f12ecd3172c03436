"""An MCP client (the ``mcp`` SDK's own) driving a desktop through ``osfleet mcp serve`` over stdio, as an agent
framework would: list the tools, start the task, look at the screen, run a command, read a file back, say it is
done. The agent is never told its score: the harness that started the server reads it from ``--results-file``.

    python examples/mcp_client.py http://127.0.0.1:8080 /var/lib/osfleet/api-token
"""

import asyncio
import json
import sys
import tempfile
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(url: str, token_file: str) -> None:
    results = Path(tempfile.mkdtemp()) / "results.jsonl"  # the harness's, out of the agent's reach
    args = ["mcp", "serve", "--url", url, "--token-file", token_file]
    args += ["--task", "cli-write-note", "--results-file", str(results)]
    server = StdioServerParameters(command="osfleet", args=args)
    async with stdio_client(server) as (read, write), ClientSession(read, write) as mcp:
        await mcp.initialize()
        print("tools:", ", ".join(t.name for t in (await mcp.list_tools()).tools))
        started = await mcp.call_tool("reset", {})
        print(started.content[0].text)
        shot = await mcp.call_tool("screenshot", {})
        print("screenshot:", shot.content[1].text)
        await mcp.call_tool("run_command", {"command": "mkdir -p ~/notes && echo 'buy milk' > ~/notes/todo.txt"})
        note = await mcp.call_tool("read_file", {"path": "/home/user/notes/todo.txt"})
        print("the note says:", note.content[0].text.strip())
        done = await mcp.call_tool("evaluate", {})
        print(done.content[0].text)
    # the session is over: its desktop went back to the fleet; the harness reads the score the agent never saw
    score = json.loads(results.read_text().splitlines()[-1])
    print(f"reward {score['reward']:g}, success {str(score['success']).lower()}")


asyncio.run(main(sys.argv[1], sys.argv[2]))
