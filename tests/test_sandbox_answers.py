"""How the host reads an evaluation's answers from the jail's zygote when the zygote dies (``Sandbox._answers``).

A zygote that dies with bytes of ours unread (the job it was sent) resets the socket: the host's next read raises
``ConnectionResetError`` instead of returning end of file. CI once saw that escape as a bare exception from a
thread, where the evaluation must end as an infrastructure error (``SandboxError``: the zygote is restarted, the
episode answers 503) or, when the metric had answered already, with that answer. A real socket pair, no zygote.
"""

from __future__ import annotations

import socket
import time

import pytest

from osfleet.tasks.jail.sandbox import Limits, Sandbox, SandboxError

pytestmark = pytest.mark.unit


def reset_by_peer(answer: bytes = b"") -> socket.socket:
    """Our end of a pair whose other end wrote ``answer`` and closed without reading what we sent it."""
    ours, zygote = socket.socketpair()
    ours.sendall(b"the job, never read")
    if answer:
        zygote.sendall(answer)
    zygote.close()
    return ours


def test_a_zygote_that_dies_before_any_answer_is_an_infrastructure_error() -> None:
    with reset_by_peer() as conn, pytest.raises(ConnectionResetError):  # what the socket does: not to leak below
        conn.recv(1)
    went_away = "the evaluation sandbox went away during an evaluation"
    with reset_by_peer() as conn, pytest.raises(SandboxError, match=went_away):
        Sandbox(Limits())._answers(conn, time.monotonic() + 5)


def test_an_answer_given_before_the_zygote_died_stands() -> None:
    with reset_by_peer(b'{"score": 1.0}\n') as conn:
        reply, status = Sandbox(Limits())._answers(conn, time.monotonic() + 5)
    assert reply == {"score": 1.0} and status is None
