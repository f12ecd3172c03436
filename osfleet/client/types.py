"""What the client hands back: the server's own published models, plus decoded screens.

The wire models are the ones the server publishes (``osfleet.protocol``), so a client and the server never
disagree on a field; ``Screen`` adds the decoded image a trainer wants.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from osfleet.client.errors import InvalidActionError, InvalidTaskError
from osfleet.protocol.actions import ACTIONS, Action
from osfleet.protocol.models import Observation
from osfleet.protocol.models import StepResult as ActionOutcome
from osfleet.protocol.tasks import Evaluation, Task

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

TaskLike = str | Task | BaseModel | dict[str, Any] | Path
"""A built-in task id (``"cli-write-note"``), an osfleet task, an OSWorld task (its JSON as a dict, or the host's
``osfleet.tasks.osworld_format.convert.OsworldTask`` model), or a task file (osfleet YAML/JSON or OSWorld JSON)."""

ActionLike = Action | dict[str, Any]


@dataclass(frozen=True)
class Screen:
    """One observation: the encoded image as the server sent it, decoded on demand."""

    data: bytes
    """The encoded image, as the server sent it."""
    format: str
    """Its format: ``png``, ``jpeg`` or ``webp``."""
    width: int
    """Width of the desktop's screen in pixels (the image's, unless it was scaled by ``screenshot``)."""
    height: int
    """Height in pixels, as ``width``."""
    quality: int | None = None
    """The lossy formats' quality the server encoded with (None for PNG)."""
    accessibility_tree: str | None = None
    """OSWorld's accessibility tree (XML) when the observation asked for it (``include``)."""
    terminal: str | None = None
    """The focused terminal's text when the observation asked for it (``include``)."""
    unavailable: dict[str, str] | None = None
    """Parts asked for that the guest could not give, with the reason."""

    @classmethod
    def of(cls, obs: Observation | None) -> Screen | None:
        """The screen of a server's observation (its base64 decoded), or None when it carries no screenshot."""
        if obs is None or obs.screenshot is None:
            return None
        return cls(
            base64.b64decode(obs.screenshot),
            obs.format,
            obs.width,
            obs.height,
            obs.quality,
            obs.accessibility_tree,
            obs.terminal,
            obs.unavailable,
        )

    def image(self) -> Image.Image:
        """The image decoded by Pillow, in RGB."""
        from PIL import Image

        return Image.open(io.BytesIO(self.data)).convert("RGB")

    def array(self) -> np.ndarray:
        """(height, width, 3) uint8, the layout Gymnasium and most vision models take."""
        import numpy as np

        return np.asarray(self.image(), dtype=np.uint8)

    def base64(self) -> str:
        """The encoded image in base64, as the model APIs take it (with ``media_type``)."""
        return base64.b64encode(self.data).decode()

    @property
    def media_type(self) -> str:
        """``image/<format>``, the MIME type of ``data``."""
        return f"image/{self.format}"


@dataclass(frozen=True)
class ResetResult:
    """What ``Session.reset`` hands back: the replica's new generation, the task's instruction, its first screen."""

    replica_id: str
    """The replica that was reset."""
    generation: int
    """Counts the replica's resets: a new generation is a new disk layer and a fresh desktop."""
    task_id: str | None
    """The task it was reset to (None: no task)."""
    instruction: str | None
    """The task's instruction to the agent."""
    seconds: float
    """How long the reset took on the host, the task's set-up included."""
    screen: Screen | None
    """The first screen after the set-up (None when the reset was asked with ``observe=False``)."""


@dataclass(frozen=True)
class StepResult:
    """What ``Session.step`` hands back: each action's outcome and the screen after them."""

    action_id: str
    """The step's id: sent again, the step is not applied twice but answered from the first time."""
    replayed: bool
    """True when this answer is the first one's, replayed for a retry with the same ``action_id``."""
    done: bool
    """True when an action of the step ended the episode (``terminate``, or OSWorld's ``DONE`` or ``FAIL``)."""
    results: list[ActionOutcome]
    """One per action, in order; a replay's long outputs may be digests (``digests``)."""
    screen: Screen | None
    """The screen after the actions (None when the step was asked with ``observe=False``)."""
    failed: list[ActionOutcome] = field(default_factory=list)
    """The results whose ``ok`` is false, for convenience."""


def actions_of(actions: ActionLike | Sequence[ActionLike]) -> list[Action]:
    """Actions validated locally with the server's own models, so a malformed one fails before a round trip."""
    items = list(actions) if isinstance(actions, list | tuple) else [actions]
    if not items:
        raise InvalidActionError("a step needs at least one action", status=422, kind="invalid_action")
    raw = [a.model_dump(mode="json") if isinstance(a, BaseModel) else a for a in items]
    try:
        return ACTIONS.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidActionError(f"action {where}: {first['msg']}", status=422, kind="invalid_action") from None


def task_body(task: TaskLike | None) -> dict[str, Any]:
    """The part of a reset request that names the task (``task_id`` or ``task``)."""
    if task is None:
        return {}
    if isinstance(task, str):
        return {"task_id": task}
    if isinstance(task, Path):
        try:
            text = task.read_text()
        except OSError as exc:
            raise InvalidTaskError(f"task file {task}: {exc.strerror}", status=422, kind="invalid_task") from None
        data: Any
        try:
            data = json.loads(text)
        except ValueError:
            import yaml

            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise InvalidTaskError(f"task file {task}: not JSON or YAML ({exc})", kind="invalid_task") from None
        if not isinstance(data, dict):
            raise InvalidTaskError(f"task file {task}: expected an object", status=422, kind="invalid_task")
        return {"task": data}
    if isinstance(task, BaseModel):
        # OSWorld's model has optional parts its published schema does not allow as null: only what was given
        return {"task": task.model_dump(mode="json", exclude_unset=not isinstance(task, Task))}
    if isinstance(task, dict):
        return {"task": task}
    raise InvalidTaskError(f"a task is an id, a Task, an OSWorld task or a file, not {type(task).__name__}")


__all__ = ["ActionLike", "Evaluation", "ResetResult", "Screen", "StepResult", "TaskLike", "actions_of", "task_body"]
