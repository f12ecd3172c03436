"""Checkpoints: keep a desktop's running state under a name, then start replicas from it, as often as you like.

    python examples/checkpoints.py --url http://127.0.0.1:8080 --token-file /var/lib/osfleet/api-token --copies 2

One replica is reset to a task and moved to "the hard middle" (here: a file written); its state (memory and disk)
is kept as a checkpoint. The replica is then released, and later (another process, another day, after a restart
of the host agent) copies start at exactly that state, each its own leased replica on the same task, so each can
be stepped and scored on its own: tree search, or restarts from the middle of a long task across a training run.
"""

from __future__ import annotations

import argparse
import time

from osfleet.client import Fleet

SHELL = "cat ~/notes/progress.txt"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--token-file", default=None, help="default: $OSFLEET_API_TOKEN")
    p.add_argument("--task", default="cli-write-note")
    p.add_argument("--copies", type=int, default=2)
    p.add_argument("--name", default=f"example-{int(time.time())}")
    args = p.parse_args()
    with Fleet(args.url, token_file=args.token_file) as fleet:
        with fleet.lease() as session:
            session.reset(args.task, observe=False)
            session.step({"type": "shell", "command": "mkdir -p ~/notes && echo halfway > ~/notes/progress.txt"})
            kept = session.checkpoint(args.name)
            print(f"checkpoint {kept.name}: {kept.bytes / 2**20:.0f} MiB, saved in {kept.save_seconds:.2f} s")
        print("checkpoints:", ", ".join(c.name for c in fleet.checkpoints()))
        try:
            with fleet.from_checkpoint(args.name, args.copies) as copies:
                for i, copy in enumerate(copies):
                    seen = copy.step({"type": "shell", "command": SHELL}, observe=False).results[0].stdout or ""
                    reward = copy.evaluate().reward
                    print(f"copy {i}: {seen.strip()!r}, reward on {copy.task_id or args.task} now {reward}")
                print(f"{len(copies)} copies started in {copies.ready_seconds:.2f} s")
        finally:
            fleet.delete_checkpoint(args.name)
            print(f"deleted {args.name}")


if __name__ == "__main__":
    main()
