"""Request and response bodies of the host agent (native ``/v1`` and OSGym's endpoints)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag

from osfleet.config import Mode
from osfleet.replicas.actions import Action, ActionResult
from osfleet.screen import DEFAULT_QUALITY, ImageFormat
from osfleet.tasks.model import Task
from osfleet.tasks.osworld import OsworldTask
from osfleet.wire import JsonInt, integral


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # no "1" or true where the schema says a number


class LeaseRequest(_Strict):
    holder: str = Field("anonymous", max_length=200)
    ttl_seconds: float | None = Field(None, gt=0, le=86400)


class ScaleRequest(_Strict):
    count: JsonInt = Field(ge=1, le=1024)
    mode: Mode | None = None


class ScaleResponse(BaseModel):
    requested: int
    mode: Mode


class LeaseResponse(BaseModel):
    replica_id: str
    lease_id: str
    expires_at: float


class ReplicaView(BaseModel):
    id: str
    state: str
    generation: int
    mode: Mode
    image: str
    leased: bool
    created_at: float
    ready_at: float | None


class Retired(BaseModel):
    replica_id: str
    retired: bool


class Released(BaseModel):
    replica_id: str
    released: bool
    ready_again: bool = Field(description="false when the reset after release failed (the replica is rebuilt)")


class LeaseBody(_Strict):
    lease_id: str = Field(min_length=1, max_length=200)


MAX_FORK_CHILDREN = 64


class ForkRequest(_Strict):
    lease_id: str = Field(min_length=1, max_length=200)
    children: JsonInt = Field(1, ge=1, le=MAX_FORK_CHILDREN)


class ForkChild(BaseModel):
    replica_id: str
    lease_id: str
    expires_at: float
    seconds: float = Field(description="this child's bring-up from the saved fork until ready")


class ForkResponse(BaseModel):
    parent_id: str
    fork_id: str
    memory_mode: Literal["template", "stream"]
    save_seconds: float = Field(description="pausing the parent and saving its state (the parent then goes on)")
    total_seconds: float = Field(description="from the request until every child was ready")
    children: list[ForkChild]


def _task_format(data: Any) -> str:
    """Which format a task is in, as ``parse_task`` decides: OSWorld's has ``evaluator``/``config``."""
    if isinstance(data, dict):
        return "osworld" if ("evaluator" in data or "config" in data) else "osfleet"
    return "osworld" if isinstance(data, OsworldTask) else "osfleet"


AnyTask = Annotated[
    Annotated[Task, Tag("osfleet")] | Annotated[OsworldTask, Tag("osworld")], Discriminator(_task_format)
]


ObservationPart = Literal["accessibility_tree", "terminal", "cursor"]
INCLUDE_DOC = (
    "more in the observation: accessibility_tree (OSWorld's AT-SPI tree as XML), terminal (the text of the focused "
    "terminal, as OSWorld's /terminal), cursor (the mouse pointer drawn into the screenshot, as OSWorld shows it)"
)
INCLUDE_PATTERN = r"^((accessibility_tree|terminal|cursor)(,(accessibility_tree|terminal|cursor))*)?$"
QUALITY_DOC = f"JPEG/WebP quality, 1 (smallest) to 100; default {DEFAULT_QUALITY}; ignored for png"
FORMAT_DOC = "image format of the observation: png (lossless), or jpeg / webp (several times smaller)"


class ObserveOptions(_Strict):
    """How the screen after a reset or step is sent back (only when ``observe`` is true)."""

    observation_format: ImageFormat = Field("png", description=FORMAT_DOC)
    observation_quality: Annotated[int, Field(ge=1, le=100), BeforeValidator(integral)] | None = Field(
        None, description=QUALITY_DOC
    )
    observation_include: list[ObservationPart] = Field(default_factory=list, max_length=3, description=INCLUDE_DOC)


class ResetRequest(LeaseBody, ObserveOptions):
    task_id: str | None = Field(None, min_length=1, max_length=200, description="a built-in task")
    task: AnyTask | None = Field(None, description="an inline task, osfleet's format or OSWorld's")
    observe: bool = True


class Observation(BaseModel):
    screenshot: str | None = Field(None, description="base64 image")
    format: ImageFormat = "png"
    quality: int | None = Field(None, description="the JPEG/WebP quality it was encoded at; null for png")
    width: int
    height: int
    accessibility_tree: str | None = Field(None, description="OSWorld's accessibility tree (XML), when included")
    terminal: str | None = Field(None, description="the focused terminal's text, when included (null: none)")
    unavailable: dict[str, str] | None = Field(
        None, description="parts that were asked for but could not be read from the guest, with the reason"
    )


class ResetResponse(BaseModel):
    replica_id: str
    generation: int
    task_id: str | None
    instruction: str | None
    seconds: float
    observation: Observation | None


class StepRequest(LeaseBody, ObserveOptions):
    action_id: str = Field(min_length=1, max_length=200, description="caller-chosen; a retry with it applies once")
    actions: list[Action] = Field(min_length=1, max_length=100)
    observe: bool = True
    metadata: dict[str, Any] | None = Field(
        None,
        description="free JSON kept with the step when the host records episodes (model name, tokens, "
        "log-probs, ...); over 256 KiB it is noted by size instead of kept",
    )


class StepResult(ActionResult):
    """An action's result; a replayed step's long outputs may come back as digests (see ``digests``)."""

    digests: dict[str, str] | None = Field(
        None,
        description="only in a replay: outputs that were over the host's cap on stored results (256 KiB a step, "
        "1 MiB an episode) are null here and named with their digest, e.g. "
        '{"content_base64": "sha256:<hex> (8388608 bytes)"}',
    )


class StepResponse(BaseModel):
    action_id: str
    replayed: bool = False
    done: bool
    results: list[StepResult]
    observation: Observation | None


class Health(BaseModel):
    """``/health``: ``status`` to anyone; the rest only to a token holder (``replicas`` and ``problem`` to the
    operator's token), so an open port tells nobody how busy the host is."""

    status: Literal["ok", "failing"]
    image: str | None = None
    accelerator: str | None = None
    replicas: dict[str, int] | None = Field(None, description="replicas by state (the operator's token only)")
    problem: str | None = None


# --- OSGym's wire format ---------------------------------------------------------------------------------------
class _Wire(BaseModel):
    """OSGym's request bodies: extra keys are tolerated (OSGym clients may send more), types are strict."""

    model_config = ConfigDict(strict=True)


class OsgymReset(_Wire):
    task_config: OsworldTask
    timeout: JsonInt = Field(1000, gt=0, le=86400)


class OsgymResetResponse(BaseModel):
    screenshot: str
    problem: str
    vm_id: JsonInt


class OsgymStep(_Wire):
    action: str = Field(max_length=100000)
    vm_id: JsonInt


class OsgymStepResponse(BaseModel):
    screenshot: str
    is_finish: bool
    reward: float


class OsgymShutdown(_Wire):
    vm_id: JsonInt | Literal["all"]


class OsgymShutdownResponse(BaseModel):
    vm_id: int | Literal["all"]


class OsgymScreenshot(BaseModel):
    screenshot: str
    vm_id: int
