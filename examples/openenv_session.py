"""An OpenEnv session on an osfleet desktop, with openenv-core's own client.

    osfleet openenv serve --url http://127.0.0.1:8080 --token-file ~/.config/osfleet/tenant-token --port 8000 \
        --task cli-write-note &
    python examples/openenv_session.py --url http://127.0.0.1:8000

``--token-file`` is the fleet token the server spends: a tenant's (a line of the host's ``--clients-file``), not
the operator's. The server lets in processes of its own user on loopback as they are; any other client puts the
server's client token (``$OSFLEET_HOME/openenv-token``) in the URL: ``--url http://osfleet:TOKEN@host:8000``.

One WebSocket session is one leased desktop: reset, a few steps (``{"actions": [osfleet actions]}``), the reward
when the episode ends (the agent's ``terminate`` action), then the session closes and the desktop goes back.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient


class DesktopClient(EnvClient[dict[str, Any], dict[str, Any], dict[str, Any]]):
    """OpenEnv's client for osfleet's payloads (plain dicts: the server's schema is at /schema)."""

    def _step_payload(self, action: dict[str, Any]) -> dict[str, Any]:
        return action

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[dict[str, Any]]:
        return StepResult(
            observation=payload.get("observation") or {}, reward=payload.get("reward"), done=bool(payload.get("done"))
        )

    def _parse_state(self, payload: dict[str, Any]) -> dict[str, Any]:
        return payload


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="the osfleet openenv server")
    args = p.parse_args()
    async with DesktopClient(base_url=args.url) as env:
        r = await env.reset()
        print(f"reset: {r.observation['instruction']!r}, screen {r.observation['width']}x{r.observation['height']}")
        r = await env.step(
            {
                "actions": [
                    {"type": "click", "x": 200, "y": 200},
                    {"type": "type", "text": "mkdir -p ~/notes && echo 'buy milk' > ~/notes/todo.txt\n"},
                    {"type": "wait", "seconds": 1},
                ]
            }
        )
        print(f"step: done {r.done}, results {[x['ok'] for x in r.observation['results']]}")
        r = await env.step({"actions": [{"type": "terminate", "status": "success"}]})
        print(f"terminated: done {r.done}, reward {r.reward}")
        print(f"state: {await env.state()}")


if __name__ == "__main__":
    asyncio.run(main())
