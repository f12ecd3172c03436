"""Recorded episodes on disk: ``<root>/<episode-id>/`` with ``meta.json``, ``steps.jsonl`` and the images.

One folder per episode, named so that names sort by start time (``t-<UTC time to the millisecond>-<random>``).
``meta.json`` is rewritten atomically whenever the episode's summary changes (started, a step, evaluated,
ended); each step is one JSON line appended to ``steps.jsonl`` after its image is written, so a reader never
sees a step whose image is missing. The store keeps under a byte cap and an episode count, and each client under its
share of the cap: the episodes of a client over its share go first, then those of whoever holds the most, finished
before unfinished, oldest first (``prune``); the recorder, which knows which episodes are being written, evicts
unfinished ones the same way after them when that is not enough (``Recorder``), so the caps hold under any flood of
steps, and one client's flood costs its own recordings.
Everything a client sent is clipped before it is stored: action and result texts, client metadata.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import secrets
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Literal

from PIL import Image
from pydantic import BaseModel, Field, ValidationError

from osfleet.errors import OsfleetError

log = logging.getLogger(__name__)

META = "meta.json"
STEPS = "steps.jsonl"
RESET_IMAGE = "reset"
METADATA_MAX_BYTES = 256 * 1024  # larger client metadata is kept as a note of its size, not refused
RESULT_TEXT_MAX = 4096  # stdout/stderr/file contents in a stored result are cut to this many characters
ACTION_TEXT_MAX = 4096  # an action's text (typed text, a shell command) is cut the same way

ImageFormat = Literal["jpeg", "webp"]
EndedBy = Literal["agent", "infrastructure"]
EndReason = Literal[
    "released",  # the agent released the lease (without evaluating)
    "evaluated",  # the agent evaluated, then released (or reset to a new task)
    "reset",  # the agent reset the replica to a new task without evaluating
    "replica_failed",  # the replica or its guest failed during the episode
    "lease_lost",  # the replica failed and was rebuilt; its lease ended with it
    "lease_expired",  # the lease ran out before the agent released it
    "replica_retired",  # the replica was retired (DELETE) while leased
]
AGENT_REASONS = frozenset({"released", "evaluated", "reset"})


class TrajectoryError(OsfleetError):
    """A recorded episode is missing or unreadable."""


class TrajectoryMeta(BaseModel):
    """The summary of one recorded episode."""

    id: str
    replica_id: str
    lease_id: str
    holder: str = ""
    owner: str = ""  # the client whose lease it was (osfleet.api.auth.Principal.name): only they see it
    host: str = ""
    task_id: str | None = None
    instruction: str | None = None
    task: dict[str, Any] | None = None
    started_at: float
    ended_at: float | None = None
    ended_by: EndedBy | None = None
    end_reason: EndReason | None = None
    error: str | None = None
    reward: float | None = None
    success: bool | None = None
    steps: int = 0
    bytes: int = 0
    image_format: ImageFormat = "jpeg"
    image_quality: int = 75
    reset_image: str | None = Field(None, description="file name of the observation right after the reset")
    capped_at_step: int | None = Field(
        None, description="steps from this index on were not recorded: the episode reached its byte cap"
    )

    @property
    def open(self) -> bool:
        return self.ended_at is None


class StepRecord(BaseModel):
    """One step as recorded: what the client sent, what happened, and the screen after it."""

    index: int
    action_id: str
    time: float = Field(description="when the step finished (Unix time)")
    seconds: float = Field(description="how long applying the actions took")
    actions: list[dict[str, Any]]
    results: list[dict[str, Any]]
    done: bool
    metadata: Any = None
    image: str | None = None
    width: int | None = None
    height: int | None = None
    source: Literal["agent", "person"] = "agent"


def new_id(now: float | None = None) -> str:
    now = time.time() if now is None else now
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    return f"t-{stamp}{int(now * 1000) % 1000:03d}-{secrets.token_hex(4)}"


def encode_image(data: bytes, fmt: ImageFormat, quality: int) -> tuple[bytes, int, int]:
    """An observation (PNG, JPEG, ...) re-encoded as ``fmt`` at ``quality``; with its width and height."""
    with Image.open(io.BytesIO(data)) as img:
        rgb = img.convert("RGB")
    buf = io.BytesIO()
    rgb.save(buf, "JPEG" if fmt == "jpeg" else "WEBP", quality=quality)
    return buf.getvalue(), rgb.width, rgb.height


def clip_metadata(metadata: Any) -> Any:
    if metadata is None:
        return None
    size = len(json.dumps(metadata))
    if size > METADATA_MAX_BYTES:
        return {"osfleet_note": f"client metadata of {size} bytes not kept (over {METADATA_MAX_BYTES})"}
    return metadata


def clip_result(result: dict[str, Any]) -> dict[str, Any]:
    out = dict(result)
    for key in ("stdout", "stderr", "content_base64"):
        value = out.get(key)
        if isinstance(value, str) and len(value) > RESULT_TEXT_MAX:
            out[key] = value[:RESULT_TEXT_MAX]
            out[f"{key}_truncated_from"] = len(value)
    return out


def clip_action(action: dict[str, Any]) -> dict[str, Any]:
    """An action as stored: every text over ``ACTION_TEXT_MAX`` characters cut, with its length noted (a batch
    of 100 actions could otherwise put 10 MB of typed text and commands in one step line)."""
    out = dict(action)
    for key, value in action.items():
        if isinstance(value, str) and len(value) > ACTION_TEXT_MAX:
            out[key] = value[:ACTION_TEXT_MAX]
            out[f"{key}_truncated_from"] = len(value)
    return out


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    tmp.write_text(text)
    tmp.replace(path)


def _folder_bytes(folder: Path) -> int:
    total = 0
    for p in folder.iterdir():
        with contextlib.suppress(OSError):
            total += p.stat().st_size
    return total


class TrajectoryStore:
    """Recorded episodes under ``root``, kept under ``max_bytes`` and ``max_episodes``."""

    def __init__(self, root: Path, max_bytes: int | None = None, max_episodes: int | None = None) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.max_episodes = max_episodes
        self._lock = threading.Lock()

    # --- reading --------------------------------------------------------------------------------------------
    def ids(self) -> list[str]:
        """Every episode id, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and (p / META).exists())

    def meta(self, tid: str) -> TrajectoryMeta:
        folder = self._folder(tid)
        try:
            return TrajectoryMeta.model_validate_json((folder / META).read_text())
        except FileNotFoundError:
            raise TrajectoryError(f"no recorded episode {tid} in {self.root}") from None
        except (OSError, ValidationError) as exc:
            raise TrajectoryError(f"recorded episode {tid} is unreadable: {exc}") from None

    def all(self) -> list[TrajectoryMeta]:
        """Every readable episode, newest first (by start time; ids of one millisecond may sort either way)."""
        out = []
        for tid in self.ids():
            try:
                out.append(self.meta(tid))
            except TrajectoryError as exc:
                log.warning("%s", exc)
        return sorted(out, key=lambda m: m.started_at, reverse=True)

    def steps(self, tid: str) -> list[StepRecord]:
        path = self._folder(tid) / STEPS
        if not self._folder(tid).is_dir():
            raise TrajectoryError(f"no recorded episode {tid} in {self.root}")
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    out.append(StepRecord.model_validate_json(line))
                except ValidationError:  # a line cut short by a crash: the rest is still good
                    log.warning("episode %s: skipping an unreadable step line", tid)
        return out

    def image_path(self, tid: str, name: str) -> Path:
        if "/" in name or name.startswith("."):
            raise TrajectoryError(f"no image {name!r} in episode {tid}")
        path = self._folder(tid) / name
        if not path.is_file():
            raise TrajectoryError(f"no image {name!r} in episode {tid}")
        return path

    def _folder(self, tid: str) -> Path:
        if not tid or "/" in tid or tid.startswith("."):
            raise TrajectoryError(f"no recorded episode {tid!r}")
        return self.root / tid

    # --- writing --------------------------------------------------------------------------------------------
    def create(self, meta: TrajectoryMeta) -> None:
        folder = self._folder(meta.id)
        folder.mkdir(parents=True, exist_ok=False)
        self.write_meta(meta)

    def write_meta(self, meta: TrajectoryMeta) -> None:
        _write_atomic(self._folder(meta.id) / META, meta.model_dump_json())

    def write_image(self, meta: TrajectoryMeta, name: str, data: bytes) -> None:
        (self._folder(meta.id) / name).write_bytes(data)
        meta.bytes += len(data)

    def append_step(self, meta: TrajectoryMeta, step: StepRecord) -> None:
        line = step.model_dump_json() + "\n"
        with open(self._folder(meta.id) / STEPS, "a") as f:
            f.write(line)
        meta.bytes += len(line)
        meta.steps = step.index + 1
        self.write_meta(meta)

    def prune(
        self,
        keep: frozenset[str] | set[str] = frozenset(),
        low_water: float = 1.0,
        owner_max_bytes: int | None = None,
        unbounded: frozenset[str] = frozenset(),
    ) -> list[str]:
        """Remove episodes until the store is within its caps (its byte cap times ``low_water``, so that a store
        at its cap is not pruned again at every step) and every client within ``owner_max_bytes`` (times
        ``low_water``) but those ``unbounded`` (the operator); never those in ``keep``. Fairly: an owner over its
        own cap loses its episodes first, then, while the store is over its cap, whoever holds the most; each
        owner's finished episodes go before its unfinished ones (a crashed agent's), oldest first. So one
        tenant's flood costs its own recordings, never another's while it holds more than they do."""
        if self.max_bytes is None and self.max_episodes is None and owner_max_bytes is None:
            return []
        with self._lock:
            metas = list(reversed(self.all()))  # oldest first
            sizes = {m.id: _folder_bytes(self.root / m.id) for m in metas}
            total, count = sum(sizes.values()), len(metas)
            held: dict[str, int] = {}
            for m in metas:
                held[m.owner] = held.get(m.owner, 0) + sizes[m.id]
            # each owner's removable episodes: finished first, then unfinished, each oldest first
            queue: dict[str, list[TrajectoryMeta]] = {}
            for m in [m for m in metas if not m.open] + [m for m in metas if m.open]:
                if m.id not in keep:
                    queue.setdefault(m.owner, []).append(m)
            removed: list[str] = []
            while True:
                owners = [o for o in queue if queue[o]]
                over_owner = [
                    o
                    for o in owners
                    if owner_max_bytes is not None and o not in unbounded and held[o] > owner_max_bytes * low_water
                ]
                over_bytes = self.max_bytes is not None and total > self.max_bytes * low_water
                over_count = self.max_episodes is not None and count > self.max_episodes
                if over_owner:
                    owner = max(over_owner, key=lambda o: held[o])
                elif (over_bytes or over_count) and owners:
                    owner = max(owners, key=lambda o: held[o])
                else:
                    break
                m = queue[owner].pop(0)
                shutil.rmtree(self.root / m.id, ignore_errors=True)
                total -= sizes[m.id]
                held[owner] -= sizes[m.id]
                count -= 1
                removed.append(m.id)
            if removed:
                log.info("trajectory store over a cap: removed %d episode(s), largest holders first", len(removed))
            return removed

    def delete(self, tid: str) -> None:
        shutil.rmtree(self._folder(tid), ignore_errors=True)

    def bytes_on_disk(self) -> int:
        """What every episode folder holds (including folders a crash left without ``meta.json``)."""
        if not self.root.is_dir():
            return 0
        return sum(_folder_bytes(p) for p in self.root.iterdir() if p.is_dir())
