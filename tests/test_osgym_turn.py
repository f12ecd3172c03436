"""OSGym's step body is read up to what a step can carry before it waits for its vm's turn (``api.osgym_turn``):
the reading itself, over ASGI messages as a server hands them."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message, Receive

from osfleet.api.osgym_turn import MAX_STEP_BODY, read_bounded, replaying


def messages_of(*bodies: bytes) -> list[Message]:
    """A body as the server hands it: chunks, ``more_body`` on all but the last."""
    return [{"type": "http.request", "body": b, "more_body": i < len(bodies) - 1} for i, b in enumerate(bodies)]


def receiving(messages: list[Message]) -> tuple[list[Message], Receive]:
    queue = list(messages)
    taken: list[Message] = []

    async def receive() -> Message:
        message = queue.pop(0) if queue else {"type": "http.disconnect"}
        taken.append(message)
        return message

    return taken, receive


@pytest.mark.unit
def test_a_step_body_is_read_whole_and_handed_on_as_it_came_then_the_connection_s_own() -> None:
    sent = messages_of(b'{"vm_id": 1,', b' "action": "x"}')
    taken, receive = receiving(sent)

    async def run() -> tuple[bytes, list[Message]]:
        read = await read_bounded(receive)
        assert read is not None
        data, messages = read
        replayed = replaying(messages, receive)
        return data, [await replayed() for _ in range(3)]

    data, replayed = asyncio.run(run())
    assert data == b'{"vm_id": 1, "action": "x"}'
    assert replayed == [*sent, {"type": "http.disconnect"}]  # the route sees the body, then the client leaving


@pytest.mark.unit
def test_a_chunked_step_body_past_what_any_step_carries_is_given_up_at_the_bound() -> None:
    chunk = b"x" * (MAX_STEP_BODY // 4 + 1)
    taken, receive = receiving(messages_of(*[chunk] * 8))
    assert asyncio.run(read_bounded(receive)) is None
    assert len(taken) == 4  # read no further than the bound: the rest is never taken in
