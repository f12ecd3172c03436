"""How a client past its own quota is refused: what it keeps is its own doing, so the answer is a 4xx with the reason.

A quota bounds what one client keeps on a host (its checkpoints' number and bytes, its saved forks' and checkpoints'
share of the host-wide fork budget). Once one more would pass it, three answers are possible, and they differ in
what the client should do next, so each is its own error (``Refusals``; the API gives each its status):

- **full** (409 ``quota``): what it keeps already fills the quota. Waiting does not help; deleting a checkpoint or
  releasing forked replicas does.
- **too large** (413 ``too_large``): the new one alone is larger than the whole quota. Nothing helps; it can never
  be kept there.
- **pending** (429 ``throttled``, ``Retry-After``): only its own saves under way make the new one not fit. Whether it
  fits is known when they end (a save that fails frees its room), so it is asked again then.

Nothing here is a 503 or a 507: those say the host is short of something, which is no single client's excess (a
disk about to fill, the host-wide fork budget full while each client is within its share).
"""

from __future__ import annotations

from dataclasses import dataclass

from osfleet.errors import OsfleetError

MIB = 2**20
SAVE_RETRY_AFTER_SECONDS = 2  # a fork or checkpoint is saved in well under that (by its pages: tens of ms)


@dataclass(frozen=True)
class Refusals:
    """The error each answer raises (the module's docstring)."""

    full: type[OsfleetError]
    too_large: type[OsfleetError]
    pending: type[OsfleetError]


def refuse_past(
    kept: int, pending: int, new: int, cap: int, refusals: Refusals, *, holding: str, limit: str, remedy: str
) -> None:
    """Raise the right refusal when ``new`` bytes more would pass ``cap``, the client keeping ``kept`` and saving
    ``pending`` now; nothing when it fits. ``holding`` names what it keeps ("this client's checkpoints"), ``limit``
    the quota ("its 32768 MiB"), ``remedy`` what frees room ("delete one first")."""
    if kept + pending + new <= cap:
        return
    if new > cap:
        raise refusals.too_large(
            f"another one (~{new / MIB:.0f} MiB) is larger than {limit} by itself: it cannot be kept on this host"
        )
    if kept + new > cap:
        raise refusals.full(
            f"{holding} hold {(kept + pending) / MIB:.0f} MiB on this host; another (~{new / MIB:.0f} MiB) would pass "
            f"{limit}: {remedy}"
        )
    raise refusals.pending(
        f"{holding} hold {kept / MIB:.0f} MiB on this host and {pending / MIB:.0f} MiB more are being saved now; "
        f"another (~{new / MIB:.0f} MiB) would pass {limit} if they are kept: retry when they end"
    )


def refuse_count_past(kept: int, pending: int, cap: int, refusals: Refusals, *, what: str, remedy: str) -> None:
    """As ``refuse_past`` for a number of things (``what``: "checkpoint(s)"): full, or pending its saves under way."""
    if kept + pending + 1 <= cap:
        return
    if kept + 1 > cap:
        raise refusals.full(f"this client keeps {kept} {what} on this host, at most {cap}: {remedy}")
    raise refusals.pending(
        f"this client keeps {kept} {what} on this host and saves {pending} more now, at most {cap}: retry when they end"
    )
