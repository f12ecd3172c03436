"""Locustfile: ask a host agent for N replicas at once (the scenario ships with osfleet, in
``osfleet/loadtest/bringup.py``; this file only makes it runnable from a checkout).

    locust -f loadtest/bringup.py --host http://127.0.0.1:8080 --token $TOKEN --replicas 4 -u 1 --headless
"""

from __future__ import annotations

from osfleet.loadtest.bringup import Bringup

__all__ = ["Bringup"]

if __name__ == "__main__":
    from locust import run_single_user

    run_single_user(Bringup)
