"""OSGym's ``POST /step`` waits for its replica's turn too, although it names its vm in the body, not the path.

Every other operation on a replica names it in the path, so ``admission.Admission`` makes the request wait for the
same client's earlier one on that replica *before* its body is read (the replica's lock would make it wait anyway;
a queue of waiting requests then holds headers, and no worker thread). OSGym's step says ``{"vm_id": 3, "action":
...}``: which replica it is for is known only once the body is read. Two ways were open:

- read the body, then take the turn: its memory is held while it waits, so it is bounded first, by what a step can
  carry (``MAX_STEP_BODY``: the longest action string OSGym's model allows, every character escaped), not by the
  server's body limit; a body past that is refused 413 unread;
- take one turn per client for every OSGym step, whatever its vm: one slow vm would then hold up the client's steps
  on all the others (an OSGym trainer steps many vms at once).

The first is what is done: the body is bounded, read on the event loop (no worker thread), its vm looked up (the
caller's own only), and the request waits for the turn of that replica, the same turn its ``/v1`` operations take,
before its route runs. A body that does not parse, or names a vm the caller does not hold, takes no turn: its route
answers it (422, 404) at once.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError
from starlette.types import Message, Receive

from osfleet.api.auth import Principal
from osfleet.api.models import OSGYM_ACTION_MAX_CHARS, OsgymStep

PATH = "/step"
# the action at 12 bytes a character (a character outside the BMP escaped as two \uXXXX), and the rest of the object
MAX_STEP_BODY = 12 * OSGYM_ACTION_MAX_CHARS + 4096
VmReplica = Callable[[int, Principal], "str | None"]  # a vm id the caller holds -> its replica (None: not its vm)


def too_large(declared: int | None) -> str:
    """Why a step's body is refused (``declared``: its Content-Length; None for a chunked one cut off)."""
    size = f"{declared} bytes" if declared is not None else f"more than {MAX_STEP_BODY} bytes"
    return (
        f"an OSGym step of {size} is over the {MAX_STEP_BODY} bytes any step can take (an action of at most "
        f"{OSGYM_ACTION_MAX_CHARS} characters): refused unread"
    )


async def read_bounded(receive: Receive) -> tuple[bytes, list[Message]] | None:
    """The whole body, read up to ``MAX_STEP_BODY`` bytes (None past it), and the messages that carried it, to be
    handed on to the route as they came."""
    seen, messages = 0, []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break  # the client left: the route sees it so
        seen += len(message.get("body", b""))
        if seen > MAX_STEP_BODY:
            return None
        if not message.get("more_body", False):
            break
    return b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request"), messages


def replaying(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that gives the messages read already, then the connection's own (a disconnect, later)."""
    waiting = list(messages)

    async def replayed() -> Message:
        if waiting:
            return waiting.pop(0)
        return await receive()

    return replayed


def replica_of(body: bytes, who: Principal, vm_replica: VmReplica) -> str | None:
    """The replica of the vm the step names, when it is one the caller holds (parsed as the route parses it)."""
    try:
        step = OsgymStep.model_validate_json(body)
    except ValidationError:
        return None
    return vm_replica(step.vm_id, who)
