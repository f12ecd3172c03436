"""The host agent's recorder: turns the API's reset/step/evaluate/release into recorded episodes.

One open episode per replica at a time (keyed by replica and lease). A reset to a task starts an episode (a
step with no reset before it starts one without a task); release, a new reset, or an infrastructure failure
ends it. Leases that end without the agent (expired, lost when the replica failed, replica retired) are found
by ``sweep``, which the agent runs every few seconds, and the episode is ended as the infrastructure's doing.

Recording never fails a request: a write error is logged and that episode stops being recorded.

Caps that hold under a flood: what a client sent is clipped (action and result texts, metadata); one episode
records at most ``1/EPISODE_SHARE`` of the store's cap (``capped_at_step`` says where it stopped); one client's
recordings at most ``client_share`` of it; a client over its share, or a store over its cap, loses episodes
fairly (the client over its share first, else whoever holds the most): finished ones first, then unfinished ones
(a dropped episode is not recorded again until its lease ends), each oldest first, down to ``LOW_WATER``.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from osfleet.config import RecordingConfig
from osfleet.recording.store import (
    AGENT_REASONS,
    RESET_IMAGE,
    EndReason,
    StepRecord,
    TrajectoryMeta,
    TrajectoryStore,
    clip_action,
    clip_metadata,
    clip_result,
    encode_image,
    new_id,
)

log = logging.getLogger(__name__)

SWEEP_SECONDS = 2.0
EPISODE_SHARE = 8  # one episode records at most this share of the store's cap
LOW_WATER = 0.9  # a store over its cap is pruned down to this share of it
FS_SHARE = 10  # recordings never take more than a tenth of the file system they are on (a host's tmpfs home)
LeaseCheck = Callable[[str, str], "EndReason | None"]
"""(replica, lease) -> None while the lease holds, else why it ended (lease_expired, lease_lost, ...)."""


@dataclass
class _Open:
    meta: TrajectoryMeta
    lock: threading.Lock = field(default_factory=threading.Lock)


class Recorder:
    def __init__(
        self,
        store: TrajectoryStore,
        config: RecordingConfig,
        host_name: str = "",
        client_share: float = 1.0,
        unbounded: frozenset[str] = frozenset(),
    ) -> None:
        """``client_share``: the most of the store's cap one client's recordings may hold (``--client-share``), but
        the owners ``unbounded`` (the operator, who is no tenant)."""
        self.store = store
        self.config = config
        self.host_name = host_name
        self._open: dict[str, _Open] = {}  # replica id -> its open episode
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._check: LeaseCheck | None = None
        self._bytes = 0
        self._owner_bytes: dict[str, int] = {}  # what each client's recordings hold (owner "" : the operator's)
        self._grown_while_counting = 0  # growth reported while a prune recounts the store (see _grew)
        self._dropped: set[tuple[str, str]] = set()  # (replica, lease) whose episode was evicted or failed
        self._pruning = threading.Lock()
        store.root.mkdir(parents=True, exist_ok=True)
        store.root.chmod(0o700)  # tenants' screens, typed text and command outputs
        fs_cap = shutil.disk_usage(store.root).total // FS_SHARE
        self.max_bytes = fs_cap if config.max_bytes is None else min(config.max_bytes, fs_cap)
        self.episode_max_bytes = self.max_bytes // EPISODE_SHARE
        self.client_max_bytes = int(self.max_bytes * client_share)
        self.unbounded = unbounded
        store.max_bytes = self.max_bytes
        for meta in store.all():  # episodes left open by an agent that stopped: the sweep ends them
            self._bytes += meta.bytes
            self._owner_bytes[meta.owner] = self._owner_bytes.get(meta.owner, 0) + meta.bytes
            if meta.open:
                self._open.setdefault(meta.replica_id, _Open(meta))

    # --- the episode's life ---------------------------------------------------------------------------------
    def begin(
        self,
        rid: str,
        lease_id: str,
        holder: str = "",
        task: dict[str, Any] | None = None,
        observation: bytes | None = None,
        owner: str = "",
    ) -> str | None:
        """Start recording an episode on ``rid`` (ending the one before on this lease: the agent reset)."""
        current = self._get(rid)
        if current is not None:
            old = current.meta.lease_id
            if old == lease_id:  # the agent reset its own replica to a new task
                self.end(rid, old, "evaluated" if current.meta.reward is not None else "reset")
            else:  # an earlier lease ended without the agent, and the sweep has not seen it yet
                self.end(rid, old, (self._check(rid, old) if self._check else None) or "lease_lost")
        meta = TrajectoryMeta(
            id=new_id(),
            replica_id=rid,
            lease_id=lease_id,
            holder=holder,
            owner=owner,
            host=self.host_name,
            task=clip_metadata(task),
            task_id=(task or {}).get("id"),
            instruction=(task or {}).get("instruction"),
            started_at=time.time(),
            image_format=self.config.image_format,
            image_quality=self.config.quality,
        )
        try:
            self.store.create(meta)
            if observation is not None:
                data = encode_image(observation, meta.image_format, meta.image_quality)[0]
                if len(data) <= self.episode_max_bytes:
                    meta.reset_image = f"{RESET_IMAGE}.{self._ext}"
                    self.store.write_image(meta, meta.reset_image, data)
                else:
                    meta.capped_at_step = 0
                self.store.write_meta(meta)
        except OSError as exc:
            log.error("recording an episode of %s: %s (not recorded)", rid, exc)
            return None
        with self._lock:
            self._open[rid] = _Open(meta)
            self._dropped.discard((rid, lease_id))
        self._grew(meta.bytes, meta.owner, new_episode=True)
        return meta.id

    def step(
        self,
        rid: str,
        lease_id: str,
        action_id: str,
        actions: list[dict[str, Any]],
        results: list[dict[str, Any]],
        seconds: float,
        done: bool,
        metadata: Any = None,
        observation: bytes | None = None,
        source: str = "agent",
        owner: str = "",
    ) -> None:
        with self._lock:
            if (rid, lease_id) in self._dropped:  # evicted or failed: not recorded again until the lease ends
                return
        current = self._get(rid, lease_id)
        if current is None:  # stepping without a reset: an episode with no task
            self.begin(rid, lease_id, owner=owner)
            current = self._get(rid, lease_id)
            if current is None:
                return
        with current.lock:
            meta = current.meta
            if meta.capped_at_step is not None:
                return
            before = meta.bytes
            record = StepRecord(
                index=meta.steps,
                action_id=action_id,
                time=time.time(),
                seconds=seconds,
                actions=[clip_action(a) for a in actions],
                results=[clip_result(r) for r in results],
                done=done,
                metadata=clip_metadata(metadata),
                source="person" if source == "person" else "agent",
            )
            try:
                data = None
                if observation is not None:
                    data, record.width, record.height = encode_image(observation, meta.image_format, meta.image_quality)
                    record.image = f"{record.index:06d}.{self._ext}"
                size = len(record.model_dump_json()) + 1 + (len(data) if data is not None else 0)
                if meta.bytes + size > self.episode_max_bytes:
                    meta.capped_at_step = record.index
                    self.store.write_meta(meta)
                    log.warning("recording %s: the episode reached its %d-byte cap", meta.id, self.episode_max_bytes)
                    return
                if data is not None and record.image is not None:
                    self.store.write_image(meta, record.image, data)
                self.store.append_step(meta, record)
            except OSError as exc:
                log.error("recording step %s of %s: %s (episode no longer recorded)", action_id, meta.id, exc)
                with self._lock:
                    if self._open.get(rid) is current:
                        del self._open[rid]
                    self._dropped.add((rid, lease_id))
                return
        self._grew(meta.bytes - before, meta.owner)

    def evaluated(self, rid: str, lease_id: str, reward: float, success: bool) -> None:
        current = self._get(rid, lease_id)
        if current is None:
            return
        with current.lock:
            current.meta.reward, current.meta.success = reward, success
            self._write(current.meta)

    def end(self, rid: str, lease_id: str, reason: EndReason, error: str | None = None) -> None:
        """End the open episode of this lease (no-op when there is none)."""
        with self._lock:
            self._dropped.discard((rid, lease_id))
            current = self._open.get(rid)
            if current is None or current.meta.lease_id != lease_id:
                return
            del self._open[rid]
        with current.lock:
            meta = current.meta
            if reason == "released" and meta.reward is not None:
                reason = "evaluated"
            meta.ended_at = time.time()
            meta.end_reason = reason
            meta.ended_by = "agent" if reason in AGENT_REASONS else "infrastructure"
            meta.error = error
            self._write(meta)

    def end_replica(self, rid: str, reason: EndReason, error: str | None = None) -> None:
        """End whatever episode is open on ``rid`` (the replica went away)."""
        current = self._get(rid)
        if current is not None:
            self.end(rid, current.meta.lease_id, reason, error)

    def open_by_replica(self) -> dict[str, str]:
        """replica -> the id of its open episode."""
        with self._lock:
            return {rid: o.meta.id for rid, o in self._open.items()}

    def open_ids(self) -> set[str]:
        with self._lock:
            return {o.meta.id for o in self._open.values()}

    # --- leases that end without the agent ------------------------------------------------------------------
    def sweep(self, check: LeaseCheck) -> None:
        with self._lock:
            pairs = [(rid, o.meta.lease_id) for rid, o in self._open.items()] + sorted(self._dropped)
        for rid, lease_id in pairs:
            try:
                why = check(rid, lease_id)
            except Exception:  # a sweep must never die; the next one tries again
                log.exception("checking the lease of a recorded episode on %s", rid)
                continue
            if why is not None:
                self.end(rid, lease_id, why)

    def start(self, check: LeaseCheck) -> None:
        self._check = check

        def loop() -> None:
            while not self._stop.wait(SWEEP_SECONDS):
                self.sweep(check)

        self.sweep(check)
        self._thread = threading.Thread(target=loop, name="osfleet-recording-sweep", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    # --- internals ------------------------------------------------------------------------------------------
    @property
    def _ext(self) -> str:
        return "jpg" if self.config.image_format == "jpeg" else "webp"

    def _get(self, rid: str, lease_id: str | None = None) -> _Open | None:
        with self._lock:
            current = self._open.get(rid)
        if current is None or (lease_id is not None and current.meta.lease_id != lease_id):
            return None
        return current

    def _write(self, meta: TrajectoryMeta) -> None:
        try:
            self.store.write_meta(meta)
        except OSError as exc:
            log.error("recording episode %s: %s", meta.id, exc)

    def _grew(self, added: int, owner: str, new_episode: bool = False) -> None:
        """Account for ``added`` bytes of ``owner``'s and prune when the store is over its cap or the owner over its
        share of it.

        A prune recounts the store from disk while other episodes keep writing. A write that lands after the
        recount read its episode would be lost if the recount simply replaced the running total (the store then
        creeps over its cap unnoticed), so what is reported during a recount is added on top of it. A write seen
        by both is counted twice: an over-estimate, which only makes the next step prune (and recount) again."""
        with self._lock:
            self._bytes += added
            self._owner_bytes[owner] = self._owner_bytes.get(owner, 0) + added
            self._grown_while_counting += added
            over = self._bytes > self.max_bytes or self._owner_bytes[owner] > self._cap(owner)
        limit = self.config.max_episodes
        if not over and not (new_episode and limit is not None and len(self.store.ids()) > limit):
            return
        with self._pruning:  # one prune at a time; a step that waited for one finds the store pruned
            with self._lock:
                within = self._bytes <= self.max_bytes and self._owner_bytes.get(owner, 0) <= self._cap(owner)
                if within and not new_episode:
                    return
                self._grown_while_counting = 0
            self.store.prune(self.open_ids(), LOW_WATER, self.client_max_bytes, self.unbounded)
            held = self._count()
            if sum(held.values()) > self.max_bytes * LOW_WATER or any(b > self._cap(o) for o, b in held.items()):
                held = self._evict_open(held)
            with self._lock:
                self._bytes = sum(held.values()) + self._grown_while_counting
                self._owner_bytes = held
                if self._grown_while_counting:
                    self._owner_bytes[owner] = self._owner_bytes.get(owner, 0) + self._grown_while_counting

    def _cap(self, owner: str) -> int:
        return self.max_bytes if owner in self.unbounded else self.client_max_bytes

    def _count(self) -> dict[str, int]:
        held: dict[str, int] = {}
        for m in self.store.all():
            held[m.owner] = held.get(m.owner, 0) + m.bytes
        return held

    def _evict_open(self, held: dict[str, int]) -> dict[str, int]:
        """Drop unfinished episodes until every client is within its share and the store back under its low-water
        mark: a client over its share first, then whoever holds the most, each its oldest first."""
        with self._lock:
            oldest = sorted(self._open.items(), key=lambda kv: kv[1].meta.started_at)
        while True:
            over = [o for o, b in held.items() if b > self._cap(o) * LOW_WATER]
            if not over and sum(held.values()) <= self.max_bytes * LOW_WATER:
                return held
            candidates = over or list(held)
            victims = [(rid, o) for rid, o in oldest if o.meta.owner in candidates]
            if not victims:
                return held
            owner = max({o.meta.owner for _, o in victims}, key=lambda x: held.get(x, 0))
            rid, current = next((rid, o) for rid, o in victims if o.meta.owner == owner)
            oldest.remove((rid, current))
            with self._lock:
                if self._open.get(rid) is not current:
                    continue
                del self._open[rid]
                self._dropped.add((rid, current.meta.lease_id))
            with current.lock:  # a step being written to it finishes first
                self.store.delete(current.meta.id)
                held[owner] = held.get(owner, 0) - current.meta.bytes
            log.warning(
                "recording: over a cap (the store's %d bytes, or %d for one client); dropped open episode %s of %s",
                self.max_bytes,
                self.client_max_bytes,
                rid,
                owner or "the operator",
            )
