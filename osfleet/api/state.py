"""The host agent's state: the replica host, and the episode of each lease (persisted, see episodes.py).

Lives as long as the app (made in its lifespan). A restarted agent reloads the episodes of the leases its
replicas still hold, so ``evaluate``, step replay and OSGym vm ids keep working across a restart.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, field

from osfleet.api.errors import Conflict, NotFound
from osfleet.api.metrics import Metrics
from osfleet.config import AgentConfig
from osfleet.recording import Recorder, TrajectoryStore, store_dir
from osfleet.recording.store import EndReason
from osfleet.replicas.episodes import Episode, EpisodeStore
from osfleet.replicas.errors import LeaseError, LeaseLostError, ReplicaBusyError, ReplicaNotFoundError
from osfleet.replicas.manager import ReplicaHost
from osfleet.replicas.records import State
from osfleet.tasks.model import Task

log = logging.getLogger(__name__)


@dataclass
class LiveEpisode:
    """An episode and the lock that serialises its steps, resets and evaluations."""

    data: Episode
    task: Task | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class AgentState:
    def __init__(self, host: ReplicaHost, config: AgentConfig) -> None:
        self.host = host
        self.config = config
        self.metrics = Metrics()
        self.store = EpisodeStore(host.settings.replicas_dir)
        self.audit_dir = host.settings.home / "audit"
        self.audit_dir.mkdir(parents=True, exist_ok=True)
        self._episodes: dict[str, LiveEpisode] = {}
        self._osgym: dict[int, str] = {}  # vm id -> replica
        self._next_vm = 0
        self._lock = threading.Lock()
        self._reload()
        # --- recording (osfleet.recording) and a person's take-over from the dashboard (osfleet.ui) ---------
        self.recorder: Recorder | None = None
        rc = config.recording
        if rc is not None:
            trajectories = TrajectoryStore(store_dir(host.settings.home), rc.max_bytes, rc.max_episodes)
            self.recorder = Recorder(trajectories, rc, host_name=socket.gethostname())
            self.recorder.start(self.lease_ended)
        # replica -> the lease a person drives it under from the dashboard (a later lease is not affected)
        self.taken_over: dict[str, str] = {}

    def _reload(self) -> None:
        """Episodes of leases that survived a restart; others (released, expired) are dropped."""
        for rec in self.host.replicas():
            ep = self.store.load(rec.id)
            if ep is None:
                continue
            if rec.state != State.LEASED or rec.lease is None or rec.lease.id != ep.lease_id:
                self.store.delete(rec.id)
                continue
            live = LiveEpisode(ep, Task.model_validate(ep.task) if ep.task is not None else None)
            self._episodes[rec.id] = live
            if ep.osgym is not None:
                self._osgym[ep.osgym.vm_id] = rec.id
                self._next_vm = max(self._next_vm, ep.osgym.vm_id + 1)

    def episode(self, rid: str, lease_id: str) -> LiveEpisode:
        """The episode of this lease (a new one for a new lease); 404/409 when the lease does not hold."""
        self.host.check_lease(rid, lease_id)
        with self._lock:
            live = self._episodes.get(rid)
            if live is None or live.data.lease_id != lease_id:
                live = LiveEpisode(Episode(replica_id=rid, lease_id=lease_id))
                self._episodes[rid] = live
            return live

    def adopt_fork_child(self, rid: str, lease_id: str, parent: LiveEpisode) -> LiveEpisode:
        """A fork's child goes on with its parent's episode: same task (so ``evaluate`` works), same applied
        steps (a step retried by its action id is replayed, not applied again); no OSGym vm id."""
        data = parent.data.model_copy(
            deep=True, update={"replica_id": rid, "lease_id": lease_id, "pending": None, "osgym": None}
        )
        live = LiveEpisode(data, parent.task)
        self.save(live)
        with self._lock:
            self._episodes[rid] = live
        return live

    def save(self, live: LiveEpisode) -> None:
        self.store.save(live.data)

    def audit(self, rid: str, lease_id: str, action_id: str) -> None:
        """Append an applied step to the host's audit log (kept after the replica is gone, so a load test can
        check that every step acknowledged to a client was applied exactly once)."""
        line = json.dumps({"time": time.time(), "replica": rid, "lease": lease_id, "action_id": action_id})
        try:
            with open(self.audit_dir / f"{rid}.jsonl", "a") as f:
                f.write(line + "\n")
        except OSError as exc:
            log.error("audit log of %s: %s", rid, exc)

    def forget(self, rid: str) -> None:
        with self._lock:
            live = self._episodes.pop(rid, None)
            if live is not None and live.data.osgym is not None:
                self._osgym.pop(live.data.osgym.vm_id, None)
        self.store.delete(rid)

    # --- OSGym vm ids ----------------------------------------------------------------------------------------
    def new_vm(self, rid: str) -> int:
        with self._lock:
            vm_id = self._next_vm
            self._next_vm += 1
            self._osgym[vm_id] = rid
            return vm_id

    def vm(self, vm_id: int, who: str) -> tuple[str, LiveEpisode]:
        """The replica and episode of an OSGym vm id held by ``who``."""
        with self._lock:
            rid = self._osgym.get(vm_id)
            live = self._episodes.get(rid) if rid is not None else None
        if rid is None or live is None or live.data.osgym is None or live.data.osgym.owner != who:
            raise NotFound(f"vm {vm_id} is not allocated to this client")
        return rid, live

    def vms_of(self, who: str) -> list[int]:
        with self._lock:
            return [
                vm
                for vm, rid in self._osgym.items()
                if (ep := self._episodes.get(rid)) is not None
                and ep.data.osgym is not None
                and ep.data.osgym.owner == who
            ]

    def task_of(self, live: LiveEpisode, rid: str) -> Task:
        if live.task is None:
            raise Conflict(f"replica {rid} has no task: reset it with task_id or task first")
        return live.task

    # --- recording and take-over ------------------------------------------------------------------------------
    def lease_ended(self, rid: str, lease_id: str) -> EndReason | None:
        """None while ``lease_id`` holds ``rid``; else how it ended without the agent (for the recorder)."""
        try:
            self.host.check_lease(rid, lease_id)
        except ReplicaNotFoundError:
            return "replica_retired"
        except LeaseLostError:
            return "lease_lost"
        except LeaseError as exc:
            return "lease_expired" if "expired" in str(exc) else "lease_lost"
        return None

    def check_not_taken_over(self, rid: str, lease_id: str) -> None:
        """A replica a person drives from the dashboard refuses the agent's steps (409 busy) until handed back."""
        if self.taken_over.get(rid) == lease_id:
            raise ReplicaBusyError(f"a person has taken over replica {rid} from the dashboard; retry when handed back")

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()
