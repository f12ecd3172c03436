"""The host agent's state: the replica host, and the episode of each lease (persisted, see episodes.py).

Lives as long as the app (made in its lifespan). A restarted agent reloads the episodes of the leases its
replicas still hold, so ``evaluate``, step replay and OSGym vm ids keep working across a restart; an episode
whose files are damaged is set aside with a log line (the agent starts anyway).

Who may touch an episode is decided here once per request (``episode``: 404 for another client's replica,
409 for a lease that does not hold it) and again under the replica's lock by every host call, through the
episode's ``LeasedHost``.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from osfleet.api.admission import Ledger, Shares
from osfleet.api.auth import OPERATOR, Principal
from osfleet.api.errors import Conflict, NotFound
from osfleet.api.host import AgentHost
from osfleet.api.metrics import Metrics
from osfleet.config import AgentConfig
from osfleet.protocol.actions import Action, ActionResult
from osfleet.protocol.models import ImageFormat
from osfleet.recording import Recorder, TrajectoryStore, store_dir
from osfleet.recording.store import EndReason
from osfleet.replicas.actions import READ_FILE_SECONDS
from osfleet.replicas.episodes import OSGYM_VM_IDS, Episode, EpisodeStore
from osfleet.replicas.errors import LeaseError, LeaseLostError, ReplicaBusyError, ReplicaNotFoundError
from osfleet.replicas.leases import Claim
from osfleet.replicas.lifecycle import Timed
from osfleet.replicas.records import ReplicaRecord, State
from osfleet.replicas.tunnels import Stream
from osfleet.tasks.model import Task

log = logging.getLogger(__name__)


class LeasedHost:
    """The replica host as one episode may use it: every call carries the episode's claim (its lease, the
    caller, the generation it is on), checked under the replica's lock, so a call that waited behind a release
    or an expiry never acts on the replica's next holder. A reset moves the claim to the new generation."""

    def __init__(self, host: AgentHost, claim: Claim) -> None:
        self.host = host
        self.claim = claim

    def reset(self, replica_id: str, mode: Any = None, unless_pristine: bool = False) -> Timed:
        timed = self.host.reset(replica_id, mode, unless_pristine, claim=self.claim)
        self.claim = replace(self.claim, generation=timed.generation)
        return timed

    def shell(self, replica_id: str, command: str, timeout: float, as_root: bool = False) -> dict[str, Any]:
        return self.host.shell(replica_id, command, timeout, as_root, claim=self.claim)

    def read_file(self, replica_id: str, path: str, limit: int, timeout: float = READ_FILE_SECONDS) -> bytes:
        return self.host.read_file(replica_id, path, limit, timeout, claim=self.claim)

    def upload_file(self, replica_id: str, path: str, data: bytes) -> None:
        self.host.upload_file(replica_id, path, data, claim=self.claim)

    def download_file(self, replica_id: str, path: str) -> bytes:
        return self.host.download_file(replica_id, path, claim=self.claim)

    def open_tunnel(self, replica_id: str, port: int) -> Stream:
        return self.host.open_tunnel(replica_id, port, claim=self.claim)

    def tunnel(self, replica_id: str, tunnel_id: str) -> Stream:
        return self.host.tunnel(replica_id, tunnel_id, claim=self.claim)

    def act(self, replica_id: str, actions: list[Action]) -> list[ActionResult]:
        return self.host.act(replica_id, actions, claim=self.claim)

    def screenshot(self, replica_id: str, fmt: ImageFormat = "png", quality: int | None = None) -> bytes:
        return self.host.screenshot(replica_id, fmt, quality, claim=self.claim)

    @property
    def replica_proxy(self) -> str | None:
        return self.host.replica_proxy


@dataclass
class LiveEpisode:
    """An episode and the lock that serialises its steps, resets, evaluations and its release."""

    data: Episode
    task: Task | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: bool = False  # its header is on disk (written before its first step is logged)

    def on(self, host: AgentHost, who: Principal) -> LeasedHost:
        """The host as ``who`` may use it for this episode."""
        return LeasedHost(host, Claim(who.owner, self.data.lease_id, self.data.generation))


class AgentState:
    def __init__(self, host: AgentHost, config: AgentConfig) -> None:
        self.host = host
        self.config = config
        self.metrics = Metrics()
        shares = Shares.for_host(config.max_body_bytes, config.client_share)
        self.ledger = Ledger(shares, self.leases_held)  # each client's fair share of this host (api.admission)
        self.store = EpisodeStore(host.settings.replicas_dir)
        self.audit_dir = host.settings.home / "audit"
        self.audit_dir.mkdir(parents=True, exist_ok=True)
        self._episodes: dict[str, LiveEpisode] = {}
        self._osgym: dict[int, str] = {}  # vm id -> replica
        self._next_vm = 0
        self._lock = threading.Lock()
        # /v1/host's sample (disk walks, libvirt) runs here, never in the thread pool that steps can fill
        self.sampler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="osfleet-sample")
        self._reload()
        # --- recording (osfleet.recording) and a person's take-over from the dashboard (osfleet.ui) ---------
        self.recorder: Recorder | None = None
        rc = config.recording
        if rc is not None:
            trajectories = TrajectoryStore(store_dir(host.settings.home), rc.max_bytes, rc.max_episodes)
            self.recorder = Recorder(
                trajectories, rc, socket.gethostname(), config.client_share, unbounded=frozenset({OPERATOR})
            )
            self.recorder.start(self.lease_ended)
        # replica -> the lease a person drives it under from the dashboard (a later lease is not affected)
        self.taken_over: dict[str, str] = {}

    def _reload(self) -> None:
        """Episodes of leases that survived a restart; others (released, expired) are dropped; damaged ones
        are set aside (one bad file must not keep the agent from starting)."""
        for rec in self.host.replicas():
            held = rec.lease.id if rec.state == State.LEASED and rec.lease is not None else None
            try:
                ep = self.store.load(rec.id, held) if held is not None else None
                task = Task.model_validate(ep.task) if ep is not None and ep.task is not None else None
                self.store.delete(rec.id)  # episodes of leases that ended, an older agent's file
                if ep is None:
                    continue
                self.store.start(ep)  # written back whole: its log compacted, an older agent's file converted
            except Exception as exc:  # damaged on disk: set aside with a line in the log, never a crash loop
                moved = self.store.set_aside(rec.id)
                log.error("replica %s: its episode is unreadable and was set aside (%s): %s", rec.id, moved, exc)
                continue
            self._episodes[rec.id] = LiveEpisode(ep, task, started=True)
            if ep.osgym is not None:
                self._osgym[ep.osgym.vm_id] = rec.id
                self._next_vm = max(self._next_vm, (ep.osgym.vm_id + 1) % OSGYM_VM_IDS)

    # --- episodes ------------------------------------------------------------------------------------------------
    def episode(self, rid: str, lease_id: str, who: Principal) -> LiveEpisode:
        """The episode of this lease (a new one for a new lease): 404 when the replica is not ``who``'s, 409
        when the lease does not hold it. A first check only: every host call checks again under the lock."""
        rec = self.host.check_lease(rid, lease_id, who.owner)
        with self._lock:
            live = self._episodes.get(rid)
            if live is None or live.data.lease_id != lease_id:
                if live is not None:
                    self._drop_vm(live)
                owner = rec.lease.owner if rec.lease is not None else ""
                live = LiveEpisode(Episode(replica_id=rid, lease_id=lease_id, owner=owner, generation=rec.generation))
                self._episodes[rid] = live
            return live

    def started(self, live: LiveEpisode) -> None:
        """Its header on disk before anything of it is logged (the caller holds its lock). Files that ended
        leases left on the replica go (a late request of one may have written after its release)."""
        if not live.started:
            self.store.delete(live.data.replica_id, keep=live.data.lease_id)
            self.store.start(live.data)
            live.started = True

    def set_task(self, live: LiveEpisode, task: Task | None, generation: int) -> None:
        """The episode starts over on a task (a reset): no steps, the replica's new generation."""
        live.task = task
        live.data = Episode(
            replica_id=live.data.replica_id,
            lease_id=live.data.lease_id,
            owner=live.data.owner,
            generation=generation,
            task=task.model_dump(mode="json") if task is not None else None,
            osgym=live.data.osgym,
        )
        self.store.start(live.data)
        live.started = True

    def adopt_fork_children(
        self, parent: LiveEpisode, fork_id: str, children: list[ReplicaRecord]
    ) -> list[LiveEpisode]:
        """A fork's children go on with their parent's episode: same task (so ``evaluate`` works), same applied
        steps (a step retried by its action id is replayed, not applied again); no OSGym vm id. The parent's
        steps are written once and linked into every child (see episodes.py)."""
        base = self.store.fork_base(parent.data, fork_id) if parent.data.steps else None
        made = []
        try:
            for rec in children:
                assert rec.lease is not None  # a lease holder's fork leases every child
                live = LiveEpisode(parent.data.child(rec.id, rec.lease.id, rec.generation), parent.task)
                self.store.start(live.data, base)
                live.started = True
                with self._lock:
                    self._episodes[rec.id] = live
                made.append(live)
        finally:
            if base is not None:
                base.unlink(missing_ok=True)  # each child holds its own link
        return made

    def adopt_checkpoint_copies(self, task: dict[str, Any] | None, children: list[ReplicaRecord]) -> None:
        """Replicas started from a checkpoint go on with its episode's task (so ``evaluate`` works on each);
        the steps before it are not carried over (a copy's action ids start afresh)."""
        parsed = Task.model_validate(task) if task is not None else None
        for rec in children:
            assert rec.lease is not None  # every copy is leased to whoever started it
            data = Episode(
                replica_id=rec.id, lease_id=rec.lease.id, owner=rec.lease.owner, generation=rec.generation, task=task
            )
            live = LiveEpisode(data, parsed)
            self.store.start(live.data)
            live.started = True
            with self._lock:
                self._episodes[rec.id] = live

    def save(self, live: LiveEpisode) -> None:
        """Write the episode's header (its task, OSGym vm): not per step (steps go to its log)."""
        self.store.save(live.data)
        live.started = True

    def audit(self, rid: str, lease_id: str, action_id: str) -> None:
        """Append an applied step to the host's audit log (kept after the replica is gone, so a load test can
        check that every step acknowledged to a client was applied exactly once)."""
        line = json.dumps({"time": time.time(), "replica": rid, "lease": lease_id, "action_id": action_id})
        try:
            with open(self.audit_dir / f"{rid}.jsonl", "a") as f:
                f.write(line + "\n")
        except OSError as exc:
            log.error("audit log of %s: %s", rid, exc)

    def forget(self, rid: str, lease_id: str | None = None) -> None:
        """Drop the episode of ``lease_id`` on ``rid`` (None: whatever episode the replica has: it is retired)."""
        with self._lock:
            live = self._episodes.get(rid)
            if live is not None and lease_id in (None, live.data.lease_id):
                del self._episodes[rid]
                self._drop_vm(live)
        self.store.delete(rid, lease_id)

    def _drop_vm(self, live: LiveEpisode) -> None:
        if live.data.osgym is not None and self._osgym.get(live.data.osgym.vm_id) == live.data.replica_id:
            del self._osgym[live.data.osgym.vm_id]

    # --- replicas a caller may see -----------------------------------------------------------------------------
    def leases_held(self, owner: str) -> int:
        """How many replicas ``owner`` holds a lease on (its share of requests in flight grows with them)."""
        return sum(1 for r in self.host.replicas() if r.lease is not None and r.lease.owner == owner)

    def visible(self, who: Principal) -> list[ReplicaRecord]:
        """Every replica for the operator; a client's own leased ones for a client (the warm pool is not theirs)."""
        return [r for r in self.host.replicas() if who.operator or (r.lease is not None and r.lease.owner == who.name)]

    # --- OSGym vm ids ----------------------------------------------------------------------------------------
    def new_vm(self, rid: str) -> int:
        """The next OSGym vm id not in use, below ``OSGYM_VM_IDS`` (wrapping around): a gateway folds it with this
        host's key into one number, which must never spill into another host's."""
        with self._lock:
            while (vm_id := self._next_vm) in self._osgym:  # fewer vms than ids are ever held: it ends
                self._next_vm = (vm_id + 1) % OSGYM_VM_IDS
            self._next_vm = (vm_id + 1) % OSGYM_VM_IDS
            self._osgym[vm_id] = rid
            return vm_id

    def vm(self, vm_id: int, who: Principal) -> tuple[str, LiveEpisode]:
        """The replica and episode of an OSGym vm id held by ``who`` (any, for the operator). A vm id whose
        episode ended (its replica leased anew since) is pruned, never mapped to the newer episode."""
        with self._lock:
            rid = self._osgym.get(vm_id)
            live = self._episodes.get(rid) if rid is not None else None
            if rid is not None and (live is None or live.data.osgym is None or live.data.osgym.vm_id != vm_id):
                del self._osgym[vm_id]
                live = None
        if rid is None or live is None or live.data.osgym is None or not who.owns(live.data.osgym.owner):
            raise NotFound(f"vm {vm_id} is not allocated to this client")
        return rid, live

    def vms_of(self, who: Principal) -> list[int]:
        """The vm ids ``who`` holds (its own only, the operator's too), pruning those whose lease has ended."""
        with self._lock:
            held = [(vm, self._episodes.get(rid)) for vm, rid in self._osgym.items()]
        out = []
        for vm, live in held:
            if live is None or live.data.osgym is None or live.data.osgym.vm_id != vm:
                with self._lock:
                    self._osgym.pop(vm, None)
                continue
            if live.data.osgym.owner == who.name:
                out.append(vm)
        return out

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
        self.sampler.shutdown(wait=False, cancel_futures=True)


__all__ = ["AgentState", "LeasedHost", "LiveEpisode"]
