"""Bring-up: ask a host agent for N replicas at once; time until all are ready, and each one's bring-up.

    locust -f loadtest/bringup.py --host http://127.0.0.1:8080 --token $TOKEN --replicas 4 -u 1 --headless

One user makes the request, polls GET /v1/replicas until the new replicas are ready (or failed), reports
each as a "replica_ready" event timed from the request, writes <run-dir>/bringup.json, retires the
replicas it asked for (unless --keep) and stops the run.
"""

from __future__ import annotations

import time
from typing import Any

import gevent
from locust import HttpUser, constant, events, task
from locust.exception import StopUser

from osfleet.loadtest import support


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument(
        "--replicas", type=int, default=4, env_var="OSFLEET_BRINGUP_REPLICAS", help="replicas to ask for"
    )
    parser.add_argument("--bringup-timeout", type=float, default=600, env_var="OSFLEET_BRINGUP_TIMEOUT")
    parser.add_argument("--keep", action="store_true", help="leave the replicas running")


class Bringup(HttpUser):
    wait_time = constant(1)
    fixed_count = 1

    def on_start(self) -> None:
        support.setup_user(self)

    @task
    def bring_up(self) -> None:
        opts = self.environment.parsed_options
        hdrs = support.headers(self.environment)
        before = {r["id"] for r in self.client.get("/v1/replicas", headers=hdrs, name="list").json()}
        t0 = time.time()
        resp = self.client.post("/v1/replicas", json={"count": opts.replicas}, headers=hdrs, name="scale_up")
        if resp.status_code != 202:
            support.append_jsonl(
                support.run_dir(self.environment) / "bringup.jsonl",
                {"requested": opts.replicas, "ready": 0, "error": f"HTTP {resp.status_code}"},
            )
            self._finish()
        done: dict[str, dict[str, Any]] = {}
        while time.time() - t0 < opts.bringup_timeout and len(done) < opts.replicas:
            for r in self.client.get("/v1/replicas", headers=hdrs, name="list").json():
                if r["id"] in before or r["id"] in done:
                    continue
                if r["state"] in ("ready", "failed", "leased"):
                    done[r["id"]] = r
                    ok = r["ready_at"] is not None
                    events.request.fire(
                        request_type="BRINGUP",
                        name="replica_ready",
                        response_time=((r["ready_at"] or time.time()) - t0) * 1000,
                        response_length=0,
                        exception=None if ok else Exception("failed"),
                        context={},
                    )
            time.sleep(0.5)
        per = [
            {
                "id": k,
                "ready_seconds_from_request": (v["ready_at"] - t0) if v["ready_at"] else None,
                "bringup_seconds": (v["ready_at"] - v["created_at"]) if v["ready_at"] else None,
                "state": v["state"],
            }
            for k, v in done.items()
        ]
        ready = [p["ready_seconds_from_request"] for p in per if p["ready_seconds_from_request"] is not None]
        support.append_jsonl(
            support.run_dir(self.environment) / "bringup.jsonl",
            {
                "requested": opts.replicas,
                "ready": len(ready),
                "t_request": t0,
                "all_ready_seconds": max(ready) if len(ready) == opts.replicas else None,
                "replicas": per,
            },
        )
        if not opts.keep:
            for rid in done:
                self.client.delete(f"/v1/replicas/{rid}", headers=hdrs, name="retire")
        self._finish()

    def _finish(self) -> None:
        """End the whole run: quit from another greenlet (a user cannot stop the runner from inside itself)."""
        gevent.spawn(self.environment.runner.quit)  # type: ignore[union-attr]
        raise StopUser()


if __name__ == "__main__":
    from locust import run_single_user

    run_single_user(Bringup)
