"""Episodes on disk, beside each replica's record, so a restarted host agent can go on with them.

An episode is what the API knows about a lease beyond the record: the task (so ``evaluate`` works after a
restart), the generation it is on, and the action ids already applied with their results (so a retried step
after a restart is replayed, not applied twice). A step is written as *pending* before it reaches the guest and
as *applied* after: if the agent dies in between, a retry is told that the outcome is unknown instead of
applying it again.

On disk, in the replica's folder, named by the lease (``episode-<lease>.*``), so that a late request of an
ended lease can only ever write into its own, dead episode, never into the replica's next holder's:

- ``.json``: the header (lease, owner, task, generation, OSGym vm), written atomically, and only when the
  episode starts, is reset to a task or forked, never per step;
- ``.log``: one JSON line appended (and flushed to disk) per event: ``{"pending": id}``, ``{"cleared": id}``
  (refused before it reached the guest), ``{"applied": {...}}``. A line torn by a crash can only be the last
  one and is ignored. Every ``COMPACT_EVERY`` steps the log is rewritten to the steps still remembered, so it
  stays bounded however long the episode runs;
- ``.base``: a fork child's inheritance, the parent's remembered steps at the fork, written once per fork and
  hard-linked into every child (no copy per child; read-only, never appended to).

Results are bounded before they are kept (in memory and in the log): a step's results over
``STEP_RESULTS_MAX_BYTES``, or past ``EPISODE_RESULTS_MAX_BYTES`` for the steps remembered, keep their long
text fields as digests (``sha256:<hex>``, with their length); a replay returns those digests.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, PrivateAttr, ValidationError

from osfleet.errors import OsfleetError, as_osfleet

log = logging.getLogger(__name__)

STEPS_REMEMBERED = 256
COMPACT_EVERY = 2 * STEPS_REMEMBERED  # log lines after which the log is rewritten to what is remembered
STEP_RESULTS_MAX_BYTES = 256 * 2**10
EPISODE_RESULTS_MAX_BYTES = 2**20
DIGEST_OVER_CHARS = 1024  # text fields longer than this become digests when a step's results are over a cap
PREFIX = "episode-"
HEADER, LOG, BASE = ".json", ".log", ".base"
LEGACY_FILE = "episode.json"  # one file per replica, rewritten per step (before the log)


class CorruptEpisodeError(OsfleetError):
    """An episode's files cannot be read back (damaged on disk): it is set aside, not retried forever."""


class AppliedStep(BaseModel):
    action_id: str
    done: bool
    results: list[dict[str, Any]]
    # Its last action was ``terminate`` with status ``failure``: the agent declared the task infeasible.
    declared_infeasible: bool = False


# A host agent's OSGym vm ids are below this (they wrap around), so a gateway folds them with the host's key into
# one number (``osfleet.fleet.ids``) that never names another host.
OSGYM_VM_IDS = 1_000_000


class OsgymClient(BaseModel):
    """An OSGym vm id handed to a client that authenticated as ``owner``."""

    vm_id: int
    owner: str


class Episode(BaseModel):
    replica_id: str
    lease_id: str
    owner: str = ""  # the client whose lease this is (osfleet.api.auth.Principal.name)
    generation: int | None = None  # the replica's generation the episode is on (None: not known yet)
    task: dict[str, Any] | None = None  # the task as osfleet's own model dumps it
    osgym: OsgymClient | None = None
    # In memory (and in the log), not in the header; read from an older header too.
    steps: list[AppliedStep] = []  # oldest first, at most STEPS_REMEMBERED
    pending: str | None = None  # an action id whose step was started but not finished
    _kept_bytes: int = PrivateAttr(0)  # JSON bytes of the results of ``steps``

    def declared_infeasible(self) -> bool:
        """Whether the agent's last action declared the task infeasible (OSWorld scores that, see runner)."""
        return bool(self.steps) and self.steps[-1].declared_infeasible

    def applied(self, action_id: str) -> AppliedStep | None:
        return next((s for s in reversed(self.steps) if s.action_id == action_id), None)

    def remember(self, step: AppliedStep) -> AppliedStep:
        """Keep ``step`` (its results bounded by the caps); returns what is kept."""
        size = _size(step.results)
        if size > STEP_RESULTS_MAX_BYTES or self._kept_bytes + size > EPISODE_RESULTS_MAX_BYTES:
            step = step.model_copy(update={"results": [_digested(r) for r in step.results]})
            size = _size(step.results)
        self.steps.append(step)
        self._kept_bytes += size
        while len(self.steps) > STEPS_REMEMBERED:
            self._kept_bytes -= _size(self.steps.pop(0).results)
        return step

    def header(self) -> str:
        return self.model_dump_json(exclude={"steps", "pending"})

    def child(self, replica_id: str, lease_id: str, generation: int) -> Episode:
        """A fork child's episode: the same task, owner and applied steps (shared, never copied: a step is not
        changed once kept), its own lease and generation, nothing pending, no OSGym vm."""
        out = Episode(
            replica_id=replica_id,
            lease_id=lease_id,
            owner=self.owner,
            generation=generation,
            task=self.task,
            steps=list(self.steps),
        )
        out._kept_bytes = self._kept_bytes
        return out


def _size(results: list[dict[str, Any]]) -> int:
    return len(json.dumps(results, separators=(",", ":")))


def _digested(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with its long text fields replaced by their digests (``digests``: field -> digest)."""
    out, digests = dict(result), dict(result.get("digests") or {})
    for key, value in result.items():
        if isinstance(value, str) and len(value) > DIGEST_OVER_CHARS:
            raw = value.encode()
            digests[key] = f"sha256:{hashlib.sha256(raw).hexdigest()} ({len(raw)} bytes)"
            out[key] = None
    if digests:
        out["digests"] = digests
    return out


def _key(lease_id: str) -> str:
    """The lease's part of its episode's file names (a lease id is hex; anything else is hashed)."""
    return lease_id if re.fullmatch(r"[0-9a-f]{8,64}", lease_id) else hashlib.sha256(lease_id.encode()).hexdigest()


class EpisodeStore:
    """The episodes of ``<replicas_dir>/<replica>/``; removed with the replica's folder."""

    def __init__(self, replicas_dir: Path) -> None:
        self.dir = replicas_dir
        self._lines: dict[Path, int] = {}  # log length in lines (each log is written by one thread at a time)

    def path(self, replica_id: str, lease_id: str, kind: str = HEADER) -> Path:
        return self.dir / replica_id / f"{PREFIX}{_key(lease_id)}{kind}"

    # --- writing ---------------------------------------------------------------------------------------------
    def save(self, episode: Episode) -> None:
        """Write the header; the log goes on (a new episode starts with ``start``)."""
        target = self.path(episode.replica_id, episode.lease_id)
        tmp = target.with_suffix(f".tmp-{os.getpid()}")
        try:
            with open(tmp, "w") as f:
                f.write(episode.header())
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise as_osfleet(exc, f"writing the episode of {episode.replica_id}") from exc

    def start(self, episode: Episode, base: Path | None = None) -> None:
        """An episode starts (over): its header, an empty log, a fork child's inheritance (``base``, a file of
        the parent's steps, hard-linked), and the steps it already holds (a reset keeps none)."""
        rid, lid = episode.replica_id, episode.lease_id
        for kind in (LOG, BASE):
            self._unlink(self.path(rid, lid, kind))
        if base is not None:
            try:
                os.link(base, self.path(rid, lid, BASE))
            except OSError as exc:
                raise as_osfleet(exc, f"linking the fork's steps into {rid}") from exc
        elif episode.steps or episode.pending:  # an older episode file read back: its steps go to the log
            self._compact(episode)
        self.save(episode)

    def pending(self, episode: Episode, action_id: str) -> None:
        episode.pending = action_id
        self._append(episode, {"pending": action_id})

    def cleared(self, episode: Episode, action_id: str) -> None:
        """The pending step was refused before anything reached the guest: it may be sent again."""
        episode.pending = None
        self._append(episode, {"cleared": action_id})

    def applied(self, episode: Episode, step: AppliedStep) -> AppliedStep:
        """Remember an applied step (bounded) and log it; returns what was kept (what a replay returns)."""
        kept = episode.remember(step)
        episode.pending = None
        if self._append(episode, {"applied": kept.model_dump(mode="json")}) >= COMPACT_EVERY:
            self._compact(episode)
        return kept

    def fork_base(self, parent: Episode, fork_id: str) -> Path:
        """The parent's remembered steps, written once for all of a fork's children (each links it)."""
        target = self.path(parent.replica_id, parent.lease_id, f"{BASE}.{_key(fork_id)}")
        try:
            with open(target, "w") as f:
                f.writelines(_line({"applied": step.model_dump(mode="json")}) for step in parent.steps)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            target.unlink(missing_ok=True)
            raise as_osfleet(exc, f"writing the steps of {parent.replica_id} for its fork") from exc
        return target

    def _append(self, episode: Episode, event: dict[str, Any]) -> int:
        """Append one line and flush it to disk; returns the log's length in lines."""
        path = self.path(episode.replica_id, episode.lease_id, LOG)
        line = _line(event).encode()
        try:
            with open(path, "ab") as f:
                f.write(line)
                f.flush()
                os.fdatasync(f.fileno())
                fresh = f.tell() == len(line)
        except OSError as exc:
            raise as_osfleet(exc, f"writing the episode of {episode.replica_id}") from exc
        count = 1 if fresh else self._lines.get(path, 0) + 1
        self._lines[path] = count
        return count

    def _compact(self, episode: Episode) -> None:
        """Rewrite the log to the remembered steps (and what is pending), and drop the fork's inheritance."""
        path = self.path(episode.replica_id, episode.lease_id, LOG)
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        events: list[dict[str, Any]] = [{"applied": s.model_dump(mode="json")} for s in episode.steps]
        if episode.pending is not None:
            events.append({"pending": episode.pending})
        try:
            with open(tmp, "w") as f:
                f.writelines(_line(e) for e in events)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(path)
            self._unlink(self.path(episode.replica_id, episode.lease_id, BASE))
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            log.warning("episode of %s: compacting its log failed (it goes on growing): %s", episode.replica_id, exc)
            return
        self._lines[path] = len(events)

    # --- reading ---------------------------------------------------------------------------------------------
    def load(self, replica_id: str, lease_id: str) -> Episode | None:
        """The episode of ``lease_id`` on ``replica_id`` (None when there is none); ``CorruptEpisodeError`` when
        its files cannot be read back. An older agent's single ``episode.json`` is read too."""
        header = self.path(replica_id, lease_id)
        legacy = self.dir / replica_id / LEGACY_FILE
        if not header.exists() and legacy.exists():
            episode = self._header(legacy)
            return episode if episode.lease_id == lease_id else None
        if not header.exists():
            return None
        episode = self._header(header)
        if episode.lease_id != lease_id or episode.replica_id != replica_id:
            raise CorruptEpisodeError(f"{header} is the episode of {episode.replica_id}/{episode.lease_id}")
        lines = 0
        for kind in (BASE, LOG):
            lines += self._replay(episode, self.path(replica_id, lease_id, kind))
        self._lines[self.path(replica_id, lease_id, LOG)] = lines
        return episode

    def _header(self, path: Path) -> Episode:
        try:
            episode = Episode.model_validate_json(path.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise CorruptEpisodeError(f"{path}: {exc}") from None
        except ValidationError as exc:
            raise CorruptEpisodeError(f"{path}: {str(exc).splitlines()[0]}") from None
        kept, episode.steps = episode.steps, []
        for step in kept:  # an older header kept its steps itself
            episode.remember(step)
        return episode

    def _replay(self, episode: Episode, path: Path) -> int:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise CorruptEpisodeError(f"{path}: {exc}") from None
        lines = raw.split(b"\n")
        torn = lines.pop()  # after the last newline: empty, or a line a crash cut short
        if torn:
            log.warning("%s: ignoring its last line, cut short (%d bytes)", path, len(torn))
        for number, line in enumerate(lines, 1):
            try:
                event = json.loads(line)
                if "pending" in event:
                    episode.pending = str(event["pending"])
                elif "cleared" in event:
                    episode.pending = None
                else:
                    episode.remember(AppliedStep.model_validate(event["applied"]))
                    episode.pending = None
            except (ValueError, KeyError, TypeError, ValidationError) as exc:
                raise CorruptEpisodeError(f"{path} line {number}: {str(exc).splitlines()[0][:120]}") from None
        return len(lines)

    # --- removing --------------------------------------------------------------------------------------------
    def files(self, replica_id: str) -> list[Path]:
        """Every episode file in the replica's folder (of any lease, and an older agent's)."""
        folder = self.dir / replica_id
        return sorted([*folder.glob(f"{PREFIX}*"), *folder.glob(f"{LEGACY_FILE}*")]) if folder.is_dir() else []

    def set_aside(self, replica_id: str) -> list[Path]:
        """Move a replica's damaged episode files out of the way (kept for a person to look at); returns where."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        moved = []
        for path in self.files(replica_id):
            if ".corrupt-" in path.name:
                continue
            target = path.with_name(f"{path.name}.corrupt-{stamp}")
            try:
                path.replace(target)
                moved.append(target)
            except OSError as exc:
                log.error("episode of %s: cannot set %s aside: %s", replica_id, path, exc)
                self._unlink(path)
        return moved

    def delete(self, replica_id: str, lease_id: str | None = None, keep: str | None = None) -> None:
        """The episode of ``lease_id``; without one, every episode file of the replica but those set aside and
        those of ``keep``."""
        if lease_id is not None:
            for kind in (HEADER, LOG, BASE):
                self._unlink(self.path(replica_id, lease_id, kind))
            return
        kept = f"{PREFIX}{_key(keep)}." if keep is not None else None
        for path in self.files(replica_id):
            if ".corrupt-" not in path.name and (kept is None or not path.name.startswith(kept)):
                self._unlink(path)

    def _unlink(self, path: Path) -> None:
        path.unlink(missing_ok=True)
        self._lines.pop(path, None)


def _line(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":")) + "\n"
