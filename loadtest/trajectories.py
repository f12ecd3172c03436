"""Locustfile: agents running episodes against a host agent (the scenario ships with osfleet, in
``osfleet/loadtest/trajectories.py``; this file only makes it runnable from a checkout).

    locust -f loadtest/trajectories.py --host http://127.0.0.1:8080 --token $TOKEN --policy oracle
"""

from __future__ import annotations

from osfleet.loadtest.trajectories import Agent

__all__ = ["Agent"]

if __name__ == "__main__":
    from locust import run_single_user

    run_single_user(Agent)
