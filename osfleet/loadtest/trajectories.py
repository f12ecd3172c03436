"""Agents running episodes against a host agent (or fleet API): lease -> reset(task) -> steps -> evaluate -> release.

    locust -f loadtest/trajectories.py --host http://127.0.0.1:8080 --token $TOKEN --policy oracle

Reset, step and evaluate are Locust requests grouped by name. Each finished episode is a "trajectory"
event; an episode cut short by an infrastructure failure (HTTP 503 "infrastructure") is an unscored
abort, reported as "trajectory_aborted" and never as reward 0. Every episode is a line in
<run-dir>/trajectories-<pid>.jsonl.
"""

from __future__ import annotations

import random
import string
import time
from typing import Any

from locust import HttpUser, constant, events, task
from locust.exception import RescheduleTask

from osfleet.loadtest import support
from osfleet.measure.timing import parse_server_timing
from osfleet.tasks.model import builtin_tasks

TASKS = {t.id: t for t in builtin_tasks()}
RANDOM_STEPS = 5
SCREEN = (1280, 800)


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument(
        "--policy",
        choices=["oracle", "random"],
        default="oracle",
        env_var="OSFLEET_POLICY",
        help="oracle solves the task; random takes random valid actions",
    )
    parser.add_argument(
        "--think-time",
        type=float,
        default=0.0,
        env_var="OSFLEET_THINK_TIME",
        help="seconds an agent thinks before each step",
    )
    parser.add_argument("--tasks", default="", env_var="OSFLEET_TASKS", help="comma-separated task ids (default: all)")


class Infrastructure(Exception):
    """The host agent reported an infrastructure failure: the episode is aborted, unscored."""


class Agent(HttpUser):
    wait_time = constant(0)

    def on_start(self) -> None:
        support.setup_user(self)
        opts = self.environment.parsed_options
        self.headers = support.headers(self.environment)
        self.task_ids = [t for t in opts.tasks.split(",") if t] or sorted(TASKS)
        unknown = [t for t in self.task_ids if t not in TASKS]
        if unknown:
            raise ValueError(f"unknown task ids: {', '.join(unknown)}")
        self.out = support.run_dir(self.environment) / f"trajectories-{support.process_tag()}.jsonl"
        self.rng = random.Random()

    def _post(
        self, path: str, body: dict[str, Any], name: str, server: dict[str, float] | None = None
    ) -> dict[str, Any]:
        """POST and the answer's JSON; ``server``: where the host spent the time (its ``Server-Timing``) is added
        into it by ``<name>.<stage>``."""
        with self.client.post(path, json=body, headers=self.headers, name=name, catch_response=True) as r:
            if server is not None:
                for stage, seconds in parse_server_timing(r.headers.get("Server-Timing")).items():
                    server[f"{name}.{stage}"] = server.get(f"{name}.{stage}", 0.0) + seconds
            if r.status_code == 200 or r.status_code == 201:
                return r.json()  # type: ignore[no-any-return]
            reason = support.why(r, 300)
            r.failure(f"{r.status_code}: {reason}")
            if r.status_code == 503 and '"infrastructure"' in r.text:
                raise Infrastructure(reason)
            raise RescheduleTask(reason)

    def _random_actions(self) -> list[dict[str, Any]]:
        kind = self.rng.choice(["click", "type", "wait", "scroll"])
        x, y = self.rng.randrange(SCREEN[0]), self.rng.randrange(SCREEN[1])
        if kind == "click":
            return [{"type": "click", "x": x, "y": y}]
        if kind == "type":
            return [{"type": "type", "text": "".join(self.rng.choices(string.ascii_lowercase, k=6))}]
        if kind == "scroll":
            return [{"type": "scroll", "x": x, "y": y, "clicks": self.rng.choice([-3, 3])}]
        return [{"type": "wait", "seconds": 0.2}]

    @task
    def episode(self) -> None:
        opts = self.environment.parsed_options
        t_lease = time.monotonic()
        with self.client.post(
            "/v1/leases",
            json={"holder": f"locust-{support.process_tag()}"},
            headers=self.headers,
            name="lease",
            catch_response=True,
        ) as r:
            if r.status_code == 503:
                r.success()  # no ready replica yet: capacity, not an error of the agent
                time.sleep(1.0)
                return
            if r.status_code != 201:
                r.failure(f"{r.status_code}: {support.why(r, 200)}")
                return
            rid, lid = r.json()["replica_id"], r.json()["lease_id"]
        task_id = self.rng.choice(self.task_ids)
        record: dict[str, Any] = {
            "task": task_id,
            "policy": opts.policy,
            "replica": rid,
            "lease": lid,
            "t_start": time.time(),
            "acked": [],  # action ids of the steps the server acknowledged (audited by bench chaos)
            "seconds": {"lease": time.monotonic() - t_lease},  # where the episode's time went, by phase
            "server_seconds": {},  # and inside the hosts' answers, by request and stage (their Server-Timing)
        }
        phases: dict[str, float] = record["seconds"]
        server: dict[str, float] = record["server_seconds"]
        steps = 0
        try:
            t = time.monotonic()
            reset = {"lease_id": lid, "task_id": task_id, "observe": False}
            self._post(f"/v1/replicas/{rid}/reset", reset, "reset", server)
            phases["reset"] = time.monotonic() - t
            t = time.monotonic()
            plan = (
                [[a.model_dump()] for a in TASKS[task_id].oracle]
                if opts.policy == "oracle"
                else [self._random_actions() for _ in range(RANDOM_STEPS)]
            )
            for actions in plan:
                if opts.think_time:
                    time.sleep(opts.think_time)
                answer = self._post(
                    f"/v1/replicas/{rid}/step",
                    {"lease_id": lid, "action_id": f"{steps}", "actions": actions, "observe": True},
                    "step",
                    server,
                )
                record["acked"].append(f"{steps}")
                failed = [f"{a.get('type')}: {a.get('error')}" for a in answer.get("results", []) if not a.get("ok")]
                if failed:  # the episode goes on (an agent sees these too), but a low reward can say why
                    record.setdefault("failed_actions", []).extend(x[:200] for x in failed)
                steps += 1
            phases["steps"] = time.monotonic() - t
            t = time.monotonic()
            ev = self._post(f"/v1/replicas/{rid}/evaluate", {"lease_id": lid}, "evaluate", server)
            phases["evaluate"] = time.monotonic() - t
            record.update(status="scored", reward=ev["reward"], success=ev["success"])
            unmet = [f"{c['name']}: {c.get('detail', '')}"[:300] for c in ev.get("criteria", []) if not c.get("met")]
            if unmet:
                record["unmet"] = unmet
        except Infrastructure as exc:
            record.update(status="aborted", abort_reason=str(exc)[:300])
        except RescheduleTask as exc:
            record.update(status="error", abort_reason=str(exc)[:300])
        except BaseException as exc:  # Locust stopping the user (its time limit, Ctrl-C) mid-episode, or a bug
            reason = str(exc) or "stopped by Locust before the episode ended"
            record.update(status="interrupted", abort_reason=f"{type(exc).__name__}: {reason}"[:300])
            raise
        finally:
            t = time.monotonic()
            self.client.post(
                f"/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=self.headers, name="release"
            )
            phases["release"] = time.monotonic() - t
            record.update(steps=steps, t_end=time.time())
            support.append_jsonl(self.out, record)
        ms = (record["t_end"] - record["t_start"]) * 1000
        name = "trajectory" if record["status"] == "scored" else "trajectory_aborted"
        events.request.fire(
            request_type="EPISODE",
            name=name,
            response_time=ms,
            response_length=steps,
            exception=None if record["status"] == "scored" else Exception(record.get("abort_reason")),
            context={},
        )


if __name__ == "__main__":
    from locust import run_single_user

    run_single_user(Agent)
