"""A random agent through Gymnasium: ``osfleet/Desktop-v0`` on a host agent or gateway.

    python examples/random_agent_gym.py --url http://127.0.0.1:8080 --token-file /var/lib/osfleet/api-token

Each episode: reset to the task, random GUI actions until the agent's ``terminate`` or ``--max-steps``, then the
verifier's reward. A random agent scores 0 on almost every task: the point is the loop, not the score.
"""

from __future__ import annotations

import argparse

import gymnasium as gym

import osfleet.gym  # noqa: F401  (registers osfleet/Desktop-v0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--token-file", default=None, help="default: $OSFLEET_API_TOKEN")
    p.add_argument("--task", default="cli-write-note")
    p.add_argument("--episodes", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    env = gym.make(
        "osfleet/Desktop-v0",
        url=args.url,
        token_file=args.token_file,
        task=args.task,
        max_steps=args.max_steps,
        observation="dict",
    )
    env.action_space.seed(args.seed)
    try:
        for episode in range(args.episodes):
            obs, info = env.reset(seed=args.seed + episode)
            print(f"episode {episode}: {obs['instruction']!r} on {info['replica_id']}, screen {obs['screen'].shape}")
            reward, done, steps = 0.0, False, 0
            while not done:
                obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
                steps += 1
                done = terminated or truncated
            print(f"episode {episode}: {steps} steps, {'terminated' if terminated else 'truncated'}, reward {reward}")
    finally:
        env.close()


if __name__ == "__main__":
    main()
