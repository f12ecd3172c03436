"""A GRPO-style group: n rollouts that start from the very same running desktop, scored by the verifier.

    python examples/grpo_group.py --url http://127.0.0.1:8080 --token-file /var/lib/osfleet/api-token --size 8

One replica is reset to the task and forked n-1 ways (``AsyncFleet.group``), so every rollout sees the same
screen, windows and clock. Each rollout then follows its own policy (here: half answer the task, half do
nothing), is scored by ``evaluate``, and the group's advantages are reward minus the group mean.
"""

from __future__ import annotations

import argparse
import asyncio

from osfleet.client import AsyncFleet, AsyncSession

ANSWER = [
    {"type": "click", "x": 200, "y": 200},
    {"type": "type", "text": "mkdir -p ~/notes && echo 'buy milk' > ~/notes/todo.txt\n"},
    {"type": "wait", "seconds": 1},
]


async def rollout(session: AsyncSession, answer: bool) -> float:
    for action in ANSWER if answer else [{"type": "wait", "seconds": 0.5}]:
        await session.step(action, observe=False)
    return (await session.evaluate()).reward


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--token-file", default=None, help="default: $OSFLEET_API_TOKEN")
    p.add_argument("--task", default="cli-write-note")
    p.add_argument("--size", type=int, default=8)
    args = p.parse_args()
    async with (
        AsyncFleet(args.url, token_file=args.token_file) as fleet,
        await fleet.group(args.task, args.size) as group,
    ):
        same = len({s.data for s in group.screens if s is not None}) == 1
        print(f"group of {len(group)} ready in {group.ready_seconds:.2f} s; identical first screens: {same}")
        rewards = await asyncio.gather(*(rollout(s, i % 2 == 0) for i, s in enumerate(group)))
    mean = sum(rewards) / len(rewards)
    print(f"rewards {rewards}; advantages {[round(r - mean, 3) for r in rewards]}")


if __name__ == "__main__":
    asyncio.run(main())
