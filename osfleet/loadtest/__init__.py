"""Locust scenarios shipped with osfleet (one locustfile per scenario), and where to find them.

``osfleet bench all`` runs them from the installed package; in a checkout, ``loadtest/<scenario>.py`` are
thin locustfiles importing the same scenarios, for ``locust -f loadtest/trajectories.py ...``. Importing
this package does not import Locust (an optional extra: ``osfleet[loadtest]``).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

SCENARIOS = ("trajectories", "bringup")


def locustfile(scenario: str) -> Path:
    """The installed locustfile of ``scenario`` (a file of this package)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"no Locust scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
    return Path(str(resources.files(__name__) / f"{scenario}.py"))
