"""Request and response bodies of the host agent: the protocol's (``osfleet.protocol.models``, re-exported here),
and those that need the host's own parsers: a reset's inline OSWorld task, and OSGym's wire format.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from osfleet.protocol.models import (
    FORMAT_DOC,
    INCLUDE_DOC,
    INCLUDE_PATTERN,
    MAX_FORK_CHILDREN,
    QUALITY_DOC,
    CheckpointDeleted,
    CheckpointRequest,
    CheckpointView,
    FileQuery,
    FileWritten,
    ForkChild,
    ForkRequest,
    ForkResponse,
    Health,
    LeaseBody,
    LeaseRequest,
    LeaseResponse,
    Observation,
    ObservationPart,
    ObservationQuery,
    ObserveOptions,
    Released,
    ReplicaView,
    ResetOptions,
    ResetResponse,
    Retired,
    ScaleRequest,
    ScaleResponse,
    StepRequest,
    StepResponse,
    StepResult,
    TunnelClosed,
    TunnelOpened,
    TunnelQuery,
    TunnelReceiveQuery,
    TunnelRequest,
    TunnelSent,
)
from osfleet.protocol.tasks import Task
from osfleet.protocol.wire import JsonInt
from osfleet.tasks.osworld_format.convert import OsworldTask


def _task_format(data: Any) -> str:
    """Which format a task is in, as ``parse_task`` decides: OSWorld's has ``evaluator``/``config``."""
    if isinstance(data, dict):
        return "osworld" if ("evaluator" in data or "config" in data) else "osfleet"
    return "osworld" if isinstance(data, OsworldTask) else "osfleet"


AnyTask = Annotated[
    Annotated[Task, Tag("osfleet")] | Annotated[OsworldTask, Tag("osworld")], Discriminator(_task_format)
]


class ResetRequest(ResetOptions):
    task: AnyTask | None = Field(None, description="an inline task, osfleet's format or OSWorld's")


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


OSGYM_ACTION_MAX_CHARS = 100_000  # an OSGym step's action string (its model's longest output, with room)


class OsgymStep(_Wire):
    action: str = Field(max_length=OSGYM_ACTION_MAX_CHARS)
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


__all__ = [
    "TunnelClosed",
    "TunnelOpened",
    "TunnelQuery",
    "TunnelReceiveQuery",
    "TunnelRequest",
    "TunnelSent",
    "AnyTask",
    "CheckpointDeleted",
    "CheckpointRequest",
    "CheckpointView",
    "FORMAT_DOC",
    "INCLUDE_DOC",
    "INCLUDE_PATTERN",
    "FileQuery",
    "FileWritten",
    "ForkChild",
    "ForkRequest",
    "ForkResponse",
    "Health",
    "LeaseBody",
    "LeaseRequest",
    "LeaseResponse",
    "MAX_FORK_CHILDREN",
    "Observation",
    "ObservationPart",
    "ObservationQuery",
    "ObserveOptions",
    "OsgymReset",
    "OsgymResetResponse",
    "OsgymScreenshot",
    "OsgymShutdown",
    "OsgymShutdownResponse",
    "OsgymStep",
    "OsgymStepResponse",
    "QUALITY_DOC",
    "Released",
    "ReplicaView",
    "ResetOptions",
    "ResetRequest",
    "ResetResponse",
    "Retired",
    "ScaleRequest",
    "ScaleResponse",
    "StepRequest",
    "StepResponse",
    "StepResult",
]
