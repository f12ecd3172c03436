"""The Python client of osfleet: ``AsyncFleet`` (async-first) and ``Fleet`` (its blocking twin).

Both speak the host agent's HTTP contract, which a fleet gateway serves too::

    from osfleet.client import AsyncFleet

    async with AsyncFleet("http://127.0.0.1:8080", token_file="/var/lib/osfleet/api-token") as fleet:
        async with fleet.lease() as session:
            first = await session.reset("cli-write-note")
            result = await session.step({"type": "click", "x": 100, "y": 200})
            reward = (await session.evaluate()).reward

Failures of the infrastructure raise ``InfrastructureError`` (never a reward of 0); every other refusal has its
own exception type (see ``osfleet.client.errors``).
"""

from osfleet.client.errors import (
    AuthenticationError,
    BusyError,
    CapacityError,
    ConflictError,
    FleetError,
    ForbiddenError,
    InfrastructureError,
    InvalidActionError,
    InvalidRequestError,
    InvalidTaskError,
    LeaseError,
    NotFoundError,
    QuotaError,
    ThrottledError,
)
from osfleet.client.fleet import AsyncFleet, AsyncGroup, AsyncSession
from osfleet.client.forward import PortForward
from osfleet.client.sync import Fleet, Group, Session
from osfleet.client.transport import RetryPolicy
from osfleet.client.types import ResetResult, Screen, StepResult

__all__ = [
    "AsyncFleet",
    "AsyncGroup",
    "AsyncSession",
    "AuthenticationError",
    "BusyError",
    "CapacityError",
    "ConflictError",
    "Fleet",
    "FleetError",
    "ForbiddenError",
    "Group",
    "InfrastructureError",
    "InvalidActionError",
    "InvalidRequestError",
    "InvalidTaskError",
    "LeaseError",
    "NotFoundError",
    "PortForward",
    "QuotaError",
    "ResetResult",
    "RetryPolicy",
    "Screen",
    "Session",
    "StepResult",
    "ThrottledError",
]
