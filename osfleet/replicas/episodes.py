"""Episodes on disk, beside each replica's record, so a restarted host agent can go on with them.

An episode is what the API knows about a lease beyond the record: the task (so ``evaluate`` works after a
restart) and the action ids already applied with their results (so a retried step after a restart is
replayed, not applied twice). A step is written as *pending* before it reaches the guest and as done after:
if the agent dies in between, a retry is told that the outcome is unknown instead of applying it again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from osfleet.errors import as_osfleet

STEPS_REMEMBERED = 256
EPISODE_FILE = "episode.json"


class AppliedStep(BaseModel):
    action_id: str
    done: bool
    results: list[dict[str, Any]]
    # Its last action was ``terminate`` with status ``failure``: the agent declared the task infeasible.
    declared_infeasible: bool = False


class OsgymClient(BaseModel):
    """An OSGym vm id handed to a client that authenticated as ``owner``."""

    vm_id: int
    owner: str


class Episode(BaseModel):
    replica_id: str
    lease_id: str
    task: dict[str, Any] | None = None  # the task as osfleet's own model dumps it
    steps: list[AppliedStep] = []  # oldest first, at most STEPS_REMEMBERED
    pending: str | None = None  # an action id whose step was started but not finished
    osgym: OsgymClient | None = None

    def declared_infeasible(self) -> bool:
        """Whether the agent's last action declared the task infeasible (OSWorld scores that, see runner)."""
        return bool(self.steps) and self.steps[-1].declared_infeasible

    def applied(self, action_id: str) -> AppliedStep | None:
        return next((s for s in self.steps if s.action_id == action_id), None)

    def remember(self, step: AppliedStep) -> None:
        self.steps.append(step)
        del self.steps[:-STEPS_REMEMBERED]


class EpisodeStore:
    """``<replicas_dir>/<replica>/episode.json``, written atomically; removed with the replica's folder."""

    def __init__(self, replicas_dir: Path) -> None:
        self.dir = replicas_dir

    def path(self, replica_id: str) -> Path:
        return self.dir / replica_id / EPISODE_FILE

    def save(self, episode: Episode) -> None:
        target = self.path(episode.replica_id)
        tmp = target.with_suffix(f".tmp-{os.getpid()}")
        try:
            tmp.write_text(episode.model_dump_json())
            with open(tmp) as f:
                os.fsync(f.fileno())
            tmp.replace(target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise as_osfleet(exc, f"writing the episode of {episode.replica_id}") from exc

    def load(self, replica_id: str) -> Episode | None:
        try:
            return Episode.model_validate_json(self.path(replica_id).read_text())
        except (OSError, ValidationError):
            return None

    def delete(self, replica_id: str) -> None:
        self.path(replica_id).unlink(missing_ok=True)
