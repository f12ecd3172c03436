"""Many episodes at once from one process with the async client (one event loop, one connection pool).

    python examples/async_rollouts.py --url http://127.0.0.1:8080 --token-file /var/lib/osfleet/api-token --episodes 16

Each episode leases a desktop (waiting for one when all are busy), resets it to the task, runs a short scripted
policy — here: type the task's answer into the terminal for the built-in ``cli-write-note`` — and scores it.
An infrastructure failure ends that episode as such (``InfrastructureError``), never as a reward of 0.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from osfleet.client import AsyncFleet, InfrastructureError

POLICY = [
    {"type": "click", "x": 200, "y": 200},
    {"type": "type", "text": "mkdir -p ~/notes && echo 'buy milk' > ~/notes/todo.txt\n"},
    {"type": "wait", "seconds": 1},
]


async def episode(fleet: AsyncFleet, task: str, i: int, scripted: bool) -> float | None:
    try:
        async with fleet.lease(holder=f"rollout-{i}") as session:
            await session.reset(task, observe=False)
            actions = POLICY if scripted else [{"type": "wait", "seconds": 0.5}]
            for action in actions:
                await session.step(action, observe=False)
            return (await session.evaluate()).reward
    except InfrastructureError as exc:
        print(f"episode {i}: infrastructure failure, discarded: {exc}")
        return None


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--token-file", default=None, help="default: $OSFLEET_API_TOKEN")
    p.add_argument("--task", default="cli-write-note")
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--noop", action="store_true", help="do nothing instead of the scripted answer (scores 0)")
    args = p.parse_args()
    start = time.monotonic()
    async with AsyncFleet(args.url, token_file=args.token_file) as fleet:
        rewards = await asyncio.gather(*(episode(fleet, args.task, i, not args.noop) for i in range(args.episodes)))
    scored = [r for r in rewards if r is not None]
    took = time.monotonic() - start
    print(f"{len(scored)} of {args.episodes} episodes scored in {took:.1f} s; rewards {scored}")


if __name__ == "__main__":
    asyncio.run(main())
