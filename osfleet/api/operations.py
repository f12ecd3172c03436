"""Every operation of the API, once: the host agent serves each one, and the gateway serves the very same ones.

An operation is its method and path, its body or query model, its answer, its statuses, who may call it and what
it does (the published description). Both servers mount their handlers with ``osfleet.api.contract.Routes``,
which takes all of that from here and refuses a handler whose parameters say otherwise (a query parameter
declared by hand, another body model, another caller), and each server refuses to start unless every operation
has a handler. So the gateway cannot drift from the host (a ``lease_id`` of 400 characters on one and 200 on the
other), and an operation added here reaches the gateway or stops it from building.

OSGym's operations are here too (its wire format, served by both for OSGym's clients).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from osfleet.api.models import (
    CheckpointDeleted,
    CheckpointRequest,
    CheckpointView,
    FileQuery,
    FileWritten,
    ForkRequest,
    ForkResponse,
    LeaseBody,
    LeaseRequest,
    LeaseResponse,
    Observation,
    ObservationQuery,
    OsgymReset,
    OsgymResetResponse,
    OsgymScreenshot,
    OsgymShutdown,
    OsgymShutdownResponse,
    OsgymStep,
    OsgymStepResponse,
    Released,
    ReplicaView,
    ResetRequest,
    ResetResponse,
    Retired,
    ScaleRequest,
    ScaleResponse,
    StepRequest,
    StepResponse,
    TunnelClosed,
    TunnelOpened,
    TunnelQuery,
    TunnelReceiveQuery,
    TunnelRequest,
    TunnelSent,
)
from osfleet.protocol.actions import MAX_READ_BYTES
from osfleet.protocol.tasks import Evaluation
from osfleet.replicas.tunnels import MAX_QUEUED, SEND_SECONDS

Auth = Literal["caller", "operator", "osgym"]
"""``caller``: any principal (the operator or a client); ``operator``: the operator's token only (403 for a
client); ``osgym``: a principal, or an address let in with ``--osgym-allow`` (OSGym's clients send no token)."""


class OsgymScreenshotQuery(BaseModel):
    """The query of OSGym's ``GET /screenshot``."""

    vm_id: int = Field(alias="vmId")


@dataclass(frozen=True)
class Operation:
    name: str  # the operationId
    method: Literal["GET", "POST", "PUT", "DELETE"]
    path: str
    doc: str
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    response: Any = None
    status: int = 200
    errors: tuple[int, ...] = ()  # besides 401, 413, 422 and 429, which every operation can answer
    auth: Auth = "caller"
    tag: str = "replicas"
    # A file's bytes as they are (``application/octet-stream``), not JSON: the request's body (instead of a
    # ``body`` model), or the answer (instead of a ``response`` model); see ``osfleet.api.contract``.
    raw_body: bool = False
    raw_response: bool = False
    path_params: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        names = tuple(part[1:-1] for part in self.path.split("/") if part.startswith("{") and part.endswith("}"))
        object.__setattr__(self, "path_params", names)
        if (self.raw_body and self.body is not None) or (self.raw_response and self.response is not None):
            raise ValueError(f"{self.name}: a raw body or answer has no model")

    @property
    def summary(self) -> str:
        return self.name.replace("_", " ").capitalize()


LEASE = Operation(
    "lease",
    "POST",
    "/v1/leases",
    "Lease a ready replica (503 capacity with Retry-After when none is ready). It is the caller's: only they (and "
    "the operator) see and touch it until it is released or the lease expires. With ``checkpoint``: start "
    "``count`` new replicas at exactly that checkpoint's state (memory and disk), each leased to the caller (404 "
    "for a name the caller does not keep).",
    body=LeaseRequest,
    response=LeaseResponse,
    status=201,
    errors=(404, 503),
)
RELEASE = Operation(
    "release",
    "POST",
    "/v1/replicas/{rid}/release",
    "End the lease; the replica is reset before anyone else can lease it. Waits for a step under way.",
    body=LeaseBody,
    response=Released,
    errors=(404, 409),
)
LIST_REPLICAS = Operation(
    "list_replicas",
    "GET",
    "/v1/replicas",
    "Every replica for the operator; for a client, the replicas it holds a lease on (no others).",
    response=list[ReplicaView],
)
SCALE_UP = Operation(
    "scale_up",
    "POST",
    "/v1/replicas",
    "Bring up more replicas in the background; watch them with GET /v1/replicas. 503 capacity when there is no "
    "room for that many more. The operator's.",
    body=ScaleRequest,
    response=ScaleResponse,
    status=202,
    errors=(403, 503),
    auth="operator",
)
RETIRE = Operation(
    "retire",
    "DELETE",
    "/v1/replicas/{rid}",
    "Take a replica down for good: any for the operator; for a client, one it holds a lease on.",
    response=Retired,
    errors=(404, 409, 503),
)
HOST_SAMPLE = Operation(
    "host_sample",
    "GET",
    "/v1/host",
    "A sample of the host (through a gateway: of every host) for load tests and placement: replicas by state, "
    "disk bytes, CPU and memory. The operator's (it covers every tenant).",
    response=dict[str, Any],
    errors=(403,),
    auth="operator",
)
RESET = Operation(
    "reset",
    "POST",
    "/v1/replicas/{rid}/reset",
    "Reset the replica to its initial state, then to the task's (``task_id``: built in; ``task``: inline, "
    "osfleet's format or OSWorld's). 403 for a client's inline task with a step or getter that acts as root in "
    "the guest (osfleet.api.policy), naming it.",
    body=ResetRequest,
    response=ResetResponse,
    errors=(403, 404, 409, 503),
)
OBSERVATION = Operation(
    "observation",
    "GET",
    "/v1/replicas/{rid}/observation",
    "The replica's screen now; ``include=accessibility_tree,terminal,cursor`` adds OSWorld's observation parts.",
    query=ObservationQuery,
    response=Observation,
    errors=(404, 409, 503),
)
STEP = Operation(
    "step",
    "POST",
    "/v1/replicas/{rid}/step",
    "Apply a batch of actions once per ``action_id``: a retry (even after an agent restart) gets the stored "
    "results back with ``replayed: true`` and a fresh observation. The ``Server-Timing`` header says where the "
    "time went (act, persist, capture, encode, record, total). 403 for a client's ``shell`` with ``as_root`` "
    "(unless the host runs with ``--allow-agent-root``).",
    body=StepRequest,
    response=StepResponse,
    errors=(403, 404, 409, 503),
)
FORK = Operation(
    "fork",
    "POST",
    "/v1/replicas/{rid}/fork",
    "Fork the leased replica mid-episode: ``children`` replicas start from its current state (screen, memory, "
    "disk), each with its own identity, leased to the caller, with the parent's task and applied steps "
    "(``evaluate`` works on each). The parent pauses only while it is saved, then goes on. The caller's own excess "
    "is a 4xx with the reason: 409 quota when its saved forks and checkpoints fill its share of the host's fork "
    "budget (release forked replicas or delete a checkpoint), 413 for a fork larger than that share by itself, 429 "
    "(Retry-After) when only its own saves under way are in the way, 409 conflict for a replica that is a fork as "
    "deep as the host allows. 503 capacity only for the host's shortage: it cannot hold that many more replicas, "
    "its fork budget is full, or its disk would be nearly full.",
    body=ForkRequest,
    response=ForkResponse,
    status=201,
    errors=(404, 409, 503),
)
EVALUATE = Operation(
    "evaluate",
    "POST",
    "/v1/replicas/{rid}/evaluate",
    "The task's reward now. An evaluation the infrastructure could not finish is 503 (kind infrastructure), "
    "never a reward of 0. 429 (kind throttled, with Retry-After) while the caller's share of the host's evaluation "
    "slots is in use by its other evaluations.",
    body=LeaseBody,
    response=Evaluation,
    errors=(404, 409, 503),
)
_FILE_RULES = (
    "``path``: absolute and normalised, under /home/user/ or /tmp/ (403 elsewhere, or with '.' or '..' parts, "
    "naming why); the desktop user's own permissions decide the rest (403 when it may not)."
)
UPLOAD_FILE = Operation(
    "upload_file",
    "PUT",
    "/v1/replicas/{rid}/files",
    "Write the request's body (the file's bytes, application/octet-stream) to ``path`` in the desktop as the "
    "desktop user: its folder is made, a file already there is replaced. " + _FILE_RULES + " A body over the "
    "server's limit (``--max-body-mib``) is 413, unread; 409 when a folder is in the way or the guest cannot hold "
    "the file (its reason named).",
    query=FileQuery,
    raw_body=True,
    response=FileWritten,
    errors=(403, 404, 409, 503),
)
DOWNLOAD_FILE = Operation(
    "download_file",
    "GET",
    "/v1/replicas/{rid}/files",
    "The file at ``path`` in the desktop, read as the desktop user, as its bytes (application/octet-stream). "
    + _FILE_RULES
    + f" 404 for a file the user cannot see, 409 for one that is not a regular file, 413 for one over "
    f"{MAX_READ_BYTES // 2**20} MiB (the most a host reads from a guest file), never a file cut short.",
    query=FileQuery,
    raw_response=True,
    errors=(403, 404, 409, 503),
)
_TUNNEL_RULES = (
    "A tunnel is a TCP connection the client makes to a port on the replica's own loopback (its services: "
    "Chrome's DevTools, VLC's HTTP interface), as the desktop user, carried by the host through a guest channel: "
    "the replica has no network and reaches nothing itself. It ends with the lease, a reset or the connection. "
)
OPEN_TUNNEL = Operation(
    "open_tunnel",
    "POST",
    "/v1/replicas/{rid}/tunnels",
    _TUNNEL_RULES + "Connect to ``port``; 409 (kind conflict) when nothing accepts it there (named) or 16 tunnels "
    "are open on the replica already.",
    body=TunnelRequest,
    response=TunnelOpened,
    status=201,
    errors=(404, 409, 503),
)
TUNNEL_SEND = Operation(
    "tunnel_send",
    "PUT",
    "/v1/replicas/{rid}/tunnel",
    "Send the request's body (bytes, application/octet-stream) into the tunnel. 404 once the tunnel is closed; "
    f"409 (the tunnel then closed) when the replica takes too little of it within {SEND_SECONDS:.0f} s (a tunnel "
    f"holds at most {MAX_QUEUED // 2**20} MiB the replica has not taken yet).",
    query=TunnelQuery,
    raw_body=True,
    response=TunnelSent,
    errors=(404, 409, 503),
)
TUNNEL_RECEIVE = Operation(
    "tunnel_receive",
    "GET",
    "/v1/replicas/{rid}/tunnel",
    "What came out of the tunnel (bytes, application/octet-stream), up to ``max_bytes``; waits up to ``wait`` "
    "seconds when nothing is there and answers empty when nothing came. 404 once the connection is over and "
    "everything was read. Bytes the client leaves unread past 8 MiB close the tunnel.",
    query=TunnelReceiveQuery,
    raw_response=True,
    errors=(404, 409, 503),
)
CLOSE_TUNNEL = Operation(
    "close_tunnel",
    "DELETE",
    "/v1/replicas/{rid}/tunnel",
    "Close the tunnel (404 for one that is not open).",
    query=TunnelQuery,
    response=TunnelClosed,
    errors=(404, 409),
)
CHECKPOINT = Operation(
    "checkpoint",
    "POST",
    "/v1/replicas/{rid}/checkpoints",
    "Keep the leased replica's running state (memory and disk) under a name of the caller's; the replica goes on. "
    "Start replicas from it later with POST /v1/leases {checkpoint}. It outlives the replica and the host "
    "agent's restarts until deleted. 409 for a name the caller keeps already; 409 quota when the caller's "
    "checkpoint quota on the host (number or bytes, named) is full, or its forks and checkpoints fill its share of "
    "the host's fork budget; 413 for one larger than that quota or share by itself; 429 (Retry-After) when only its "
    "own saves under way are in the way; 503 capacity when the host's disk would be nearly full.",
    body=CheckpointRequest,
    response=CheckpointView,
    status=201,
    errors=(404, 409, 503),
    tag="checkpoints",
)
LIST_CHECKPOINTS = Operation(
    "list_checkpoints",
    "GET",
    "/v1/checkpoints",
    "The caller's checkpoints (no one else's), oldest first.",
    response=list[CheckpointView],
    tag="checkpoints",
)
DELETE_CHECKPOINT = Operation(
    "delete_checkpoint",
    "DELETE",
    "/v1/checkpoints/{name}",
    "Delete one of the caller's checkpoints (404 for any other name); replicas started from it go on, its files "
    "go once none of them uses them.",
    response=CheckpointDeleted,
    errors=(404,),
    tag="checkpoints",
)

OSGYM_RESET = Operation(
    "osgym_reset",
    "POST",
    "/reset",
    "OSGym's reset: lease a replica, set up the OSWorld task, answer its first screen and a vm id.",
    body=OsgymReset,
    response=OsgymResetResponse,
    errors=(503,),
    auth="osgym",
    tag="osgym",
)
OSGYM_STEP = Operation(
    "osgym_step",
    "POST",
    "/step",
    "OSGym's step: one action string; a finishing one (DONE, FAIL) scores the task and releases the vm.",
    body=OsgymStep,
    response=OsgymStepResponse,
    errors=(404, 409, 503),
    auth="osgym",
    tag="osgym",
)
OSGYM_SHUTDOWN = Operation(
    "osgym_shutdown",
    "POST",
    "/shutdown",
    "Release the caller's vm (or all of the caller's vms); another client's vms are never touched.",
    body=OsgymShutdown,
    response=OsgymShutdownResponse,
    errors=(404,),
    auth="osgym",
    tag="osgym",
)
OSGYM_SCREENSHOT = Operation(
    "osgym_screenshot",
    "GET",
    "/screenshot",
    "OSGym's screenshot of a vm (JPEG, base64).",
    query=OsgymScreenshotQuery,
    response=OsgymScreenshot,
    errors=(404, 409, 503),
    auth="osgym",
    tag="osgym",
)

OPERATIONS: tuple[Operation, ...] = (
    LEASE,
    RELEASE,
    LIST_REPLICAS,
    SCALE_UP,
    RETIRE,
    HOST_SAMPLE,
    RESET,
    OBSERVATION,
    STEP,
    FORK,
    EVALUATE,
    UPLOAD_FILE,
    DOWNLOAD_FILE,
    OPEN_TUNNEL,
    TUNNEL_SEND,
    TUNNEL_RECEIVE,
    CLOSE_TUNNEL,
    CHECKPOINT,
    LIST_CHECKPOINTS,
    DELETE_CHECKPOINT,
    OSGYM_RESET,
    OSGYM_STEP,
    OSGYM_SHUTDOWN,
    OSGYM_SCREENSHOT,
)
