"""Request and response bodies of the ``/v1`` API: leases, replicas, reset, step, observation, fork.

The host agent publishes these in its OpenAPI, the gateway serves the very same operations, and the client
parses answers with them. Requests are strict (a ``true`` or ``"1"`` is not a number); responses are plain.
An inline task in a reset may also be in OSWorld's format, which only the host parses: the server's reset
request (``osfleet.api.models.ResetRequest``) extends ``ResetOptions`` with it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from osfleet.protocol.actions import Action, ActionResult
from osfleet.protocol.wire import ImageFormat, JsonInt, Quality

Mode = Literal["cold", "snapshot"]
"""How a replica is brought up and reset: a cold boot, or a restore of the image's saved running state."""
MODES: tuple[Mode, ...] = get_args(Mode)

FORMATS: tuple[ImageFormat, ...] = get_args(ImageFormat)
DEFAULT_QUALITY = 85  # JPEG and WebP when the client names none (what OSGym's screenshots have always used)
ObservationPart = Literal["accessibility_tree", "terminal", "cursor"]
INCLUDE_DOC = (
    "more in the observation: accessibility_tree (OSWorld's AT-SPI tree as XML), terminal (the text of the focused "
    "terminal, as OSWorld's /terminal), cursor (the mouse pointer drawn into the screenshot, as OSWorld shows it)"
)
INCLUDE_PATTERN = r"^((accessibility_tree|terminal|cursor)(,(accessibility_tree|terminal|cursor))*)?$"
QUALITY_DOC = f"JPEG/WebP quality, 1 (smallest) to 100; default {DEFAULT_QUALITY}; ignored for png"
FORMAT_DOC = "image format of the observation: png (lossless), or jpeg / webp (several times smaller)"

MAX_ID = 200  # characters of a lease id, task id or action id
MAX_FORK_CHILDREN = 64

LeaseId = Annotated[str, Field(min_length=1, max_length=MAX_ID)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # no "1" or true where the schema says a number

    @model_validator(mode="before")
    @classmethod
    def _whole_numbers(cls, data: Any) -> Any:
        """JSON has one kind of number: ``3867.0`` is the integer 3867 to JSON Schema (and to whoever sent it), so a
        whole float where the model says ``int`` is taken as that int; the rest stays strict (no "1", no true)."""
        if not isinstance(data, dict):
            return data
        ints = {f.alias or name for name, f in cls.model_fields.items() if f.annotation in (int, int | None)}
        return {k: int(v) if k in ints and isinstance(v, float) and v.is_integer() else v for k, v in data.items()}


CHECKPOINT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
CheckpointName = Annotated[
    str,
    Field(
        pattern=CHECKPOINT_NAME_PATTERN,
        max_length=64,
        description="1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit",
    ),
]
MAX_CHECKPOINT_COPIES = 64


class LeaseRequest(_Strict):
    # count goes with checkpoint (JSON Schema's dependentRequired, so generated clients and fuzzers know it)
    model_config = ConfigDict(json_schema_extra={"dependentRequired": {"count": ["checkpoint"]}})

    holder: str = Field("anonymous", max_length=200)
    ttl_seconds: float | None = Field(None, gt=0, le=86400)
    checkpoint: CheckpointName | SkipJsonSchema[None] = Field(
        None, description="start new replicas at exactly this checkpoint's state instead of leasing a ready one"
    )
    count: JsonInt = Field(
        1, ge=1, le=MAX_CHECKPOINT_COPIES, description="with checkpoint: how many replicas to start from it"
    )

    @model_validator(mode="after")
    def _count_needs_checkpoint(self) -> LeaseRequest:
        if "count" in self.model_fields_set and self.checkpoint is None:
            raise ValueError("count is for starting replicas from a checkpoint: give checkpoint too")
        return self


class LeaseGrant(BaseModel):
    replica_id: str
    lease_id: str
    expires_at: float


class LeaseResponse(LeaseGrant):
    leases: list[LeaseGrant] | None = Field(
        None, description="from a checkpoint: every replica started (the first is the one above)"
    )
    seconds: float | None = Field(None, description="from a checkpoint: until every replica was ready")
    task_id: str | None = Field(None, description="from a checkpoint: the task its replicas are on")


class CheckpointView(BaseModel):
    name: str
    host: str | None = Field(None, description="through a gateway: the host that keeps it")
    image: str
    created_at: float
    bytes: int = Field(description="disk layers and memory it holds on its host")
    save_seconds: float | None = Field(None, description="how long saving it took (the replica then went on)")
    task_id: str | None = Field(None, description="the task its episode was on (evaluate works on its copies)")


class CheckpointDeleted(BaseModel):
    name: str
    deleted: bool


class ScaleRequest(_Strict):
    count: JsonInt = Field(ge=1, le=1024)
    mode: Mode | None = None


class ScaleResponse(BaseModel):
    requested: int
    mode: Mode
    placement: dict[str, int] | None = Field(None, description="through a gateway: how many each host brings up")


class ReplicaView(BaseModel):
    id: str
    state: str
    generation: int
    mode: Mode
    image: str
    leased: bool
    created_at: float
    ready_at: float | None
    host: str | None = Field(None, description="through a gateway: the host the replica runs on")


class Retired(BaseModel):
    replica_id: str
    retired: bool


class Released(BaseModel):
    replica_id: str
    released: bool
    ready_again: bool = Field(description="false when the reset after release failed (the replica is rebuilt)")


class LeaseBody(_Strict):
    lease_id: LeaseId


class CheckpointRequest(LeaseBody):
    name: CheckpointName


class ForkRequest(LeaseBody):
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


class ObserveOptions(_Strict):
    """How the screen after a reset or step is sent back (only when ``observe`` is true)."""

    observation_format: ImageFormat = Field("png", description=FORMAT_DOC)
    observation_quality: Quality | None = Field(None, description=QUALITY_DOC)
    observation_include: list[ObservationPart] = Field(default_factory=list, max_length=3, description=INCLUDE_DOC)


class ObservationQuery(BaseModel):
    """The query of ``GET /v1/replicas/{rid}/observation`` (query strings are text: not strict)."""

    lease_id: LeaseId
    format: ImageFormat = Field("png", description=FORMAT_DOC)
    quality: int | None = Field(None, ge=1, le=100, description=QUALITY_DOC)
    include: str = Field("", max_length=100, pattern=INCLUDE_PATTERN, description=INCLUDE_DOC + "; comma-separated")

    @property
    def parts(self) -> list[ObservationPart]:
        return [p for p in self.include.split(",") if p]  # type: ignore[misc]  # the pattern admits these only


MAX_GUEST_PATH = 4096  # characters of a file's path in the desktop (Linux's PATH_MAX)
FILE_ROOTS = ("/home/user/", "/tmp/")  # where a client may put or get files: the desktop user's home and /tmp
FILE_PATH_DOC = (
    "absolute, normalised path of a file in the desktop, under /home/user/ or /tmp/; a path without the leading "
    "'/', empty or with a NUL is 422; one elsewhere, or with '.' or '..' parts, '//' or a trailing '/', is 403"
)


class FileQuery(BaseModel):
    """The query of ``PUT`` and ``GET /v1/replicas/{rid}/files`` (query strings are text: not strict)."""

    lease_id: LeaseId
    path: str = Field(min_length=2, max_length=MAX_GUEST_PATH, pattern=r"^/[^\x00]+$", description=FILE_PATH_DOC)


class FileWritten(BaseModel):
    path: str
    bytes: int = Field(description="how many bytes the file now holds")


TUNNEL_ID_PATTERN = r"^t-[A-Za-z0-9_-]{1,40}$"
MAX_TUNNEL_WAIT = 25.0  # seconds a receive waits for bytes (under every proxy's idle timeout)
MAX_TUNNEL_READ = 1 << 20  # bytes one receive returns at most


class TunnelRequest(LeaseBody):
    """``POST /v1/replicas/{rid}/tunnels``: a connection to a port on the replica's own loopback."""

    port: int = Field(ge=1, le=65535, description="the TCP port on 127.0.0.1 inside the replica")


class TunnelOpened(BaseModel):
    tunnel_id: str = Field(description="names the stream in the tunnel calls that follow (unguessable)")
    port: int


class TunnelQuery(BaseModel):
    """The query of ``PUT``/``DELETE /v1/replicas/{rid}/tunnel`` (query strings are text: not strict)."""

    lease_id: LeaseId
    tunnel_id: str = Field(pattern=TUNNEL_ID_PATTERN)


class TunnelReceiveQuery(TunnelQuery):
    """The query of ``GET /v1/replicas/{rid}/tunnel``."""

    wait: float = Field(20.0, ge=0, le=MAX_TUNNEL_WAIT, description="seconds to wait for bytes when none are there")
    max_bytes: int = Field(MAX_TUNNEL_READ, ge=1, le=MAX_TUNNEL_READ, description="the most bytes returned")


class TunnelSent(BaseModel):
    bytes: int = Field(description="how many bytes went into the stream")


class TunnelClosed(BaseModel):
    tunnel_id: str
    closed: bool = True


class ResetOptions(LeaseBody, ObserveOptions):
    """A reset's fields besides an inline task."""

    task_id: str | None = Field(None, min_length=1, max_length=MAX_ID, description="a built-in task")
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
    action_id: str = Field(min_length=1, max_length=MAX_ID, description="caller-chosen; a retry with it applies once")
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
    max_body_bytes: int | None = Field(
        None, description="the largest request body the server takes (--max-body-mib): an upload's file at most"
    )
