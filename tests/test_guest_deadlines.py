"""Guest calls under a deadline: a guest agent that answers empty chunks, junk, too much, or nothing at all
costs the call an error within its budget (a 503 for an evaluation), never a loop or a hung thread.

What is faked is the guest agent behind libvirt (``Virt.agent``): a misbehaving one needs root in a guest.
libvirt's own per-call timeout is played by ``silent``, which waits that long and then raises as libvirt does.
"""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from osfleet.errors import GuestFileTooLargeError, GuestTimeoutError
from osfleet.replicas import actions
from osfleet.tasks import runner
from osfleet.tasks.model import Task
from osfleet.tasks.osworld_format.convert import from_osworld
from osfleet.vm.virt import GuestAgentUnavailableError, Virt

# In-process, but seconds of waits and servers in sum: integration keeps the unit tier under 2 minutes.
pytestmark = pytest.mark.integration


class FakeAgent(Virt):
    """A ``Virt`` whose guest agent behaves as ``mode`` says; everything else of ``Virt`` is the real code."""

    def __init__(self, mode: str, content: bytes = b"hello") -> None:  # no libvirt connection
        self.mode = mode
        self.content = content
        self.calls: list[str] = []
        self.offset = 0
        self.closed = 0
        self.exec_out = b""

    def agent(self, name: str, command: str, arguments: dict[str, Any] | None = None, timeout: int = 5) -> Any:
        self.calls.append(command)
        args = arguments or {}
        if self.mode == "silent" and command != "guest-file-close":
            time.sleep(timeout)  # libvirt waits this long for an agent that never answers, then says so
            raise GuestAgentUnavailableError(f"{name}: guest agent: not responding")
        if command == "guest-file-open":
            self.offset = 0
            return 7
        if command == "guest-file-close":
            self.closed += 1
            return {}
        if command == "guest-file-read":
            count = int(args["count"])
            if self.mode == "empty":
                return {"count": 0, "buf-b64": "", "eof": False}
            if self.mode == "junk":
                return "not an object"
            if self.mode == "flood":
                return {"count": count * 4, "buf-b64": base64.b64encode(b"x" * count * 4).decode(), "eof": False}
            data = self.content[self.offset : self.offset + count]
            self.offset += len(data)
            return {
                "count": len(data),
                "buf-b64": base64.b64encode(data).decode(),
                "eof": self.offset >= len(self.content),
            }
        if command == "guest-exec":
            return {"pid": 42}
        if command == "guest-exec-status":
            if self.mode == "running":
                return {"exited": False}
            return {"exited": True, "exitcode": 0, "out-data": base64.b64encode(self.exec_out).decode()}
        raise AssertionError(command)


def timed(fn: Any) -> tuple[Any, float]:
    t = time.monotonic()
    try:
        out = fn()
    except Exception as exc:  # the test inspects what was raised
        out = exc
    return out, time.monotonic() - t


def test_a_healthy_agent_reads_the_whole_file() -> None:
    v = FakeAgent("ok", b"a" * (3 * actions.READ_CHUNK_BYTES + 5))
    assert actions.read_file(v, "d", "/f", 8 * 2**20, whole=True) == v.content
    assert v.closed == 1


def test_empty_chunks_without_an_end_raise_instead_of_looping() -> None:
    v = FakeAgent("empty")
    out, took = timed(lambda: actions.read_file(v, "d", "/f", 2**20, timeout=30))
    assert isinstance(out, GuestAgentUnavailableError) and "no data and no end of file" in str(out)
    assert took < 1 and v.calls.count("guest-file-read") == actions.MAX_EMPTY_READS and v.closed == 1


@pytest.mark.parametrize("mode,words", [("junk", "junk"), ("flood", "more")])
def test_junk_or_more_than_asked_is_refused(mode: str, words: str) -> None:
    v = FakeAgent(mode)
    out, _ = timed(lambda: actions.read_file(v, "d", "/f", 2**20))
    assert isinstance(out, GuestAgentUnavailableError) and words in str(out)


def test_a_silent_agent_costs_the_read_its_deadline_not_more() -> None:
    v = FakeAgent("silent")
    out, took = timed(lambda: actions.read_file(v, "d", "/f", 2**20, timeout=2))
    assert isinstance(out, GuestAgentUnavailableError | GuestTimeoutError)
    assert took < 4, took  # one agent call is cut to what is left of the read's 2 s


def test_a_file_over_the_cap_is_reported_never_cut_short() -> None:
    v = FakeAgent("ok", b"b" * (2**20 + 1))
    out, _ = timed(lambda: actions.read_file(v, "d", "/f", 2**20, whole=True))
    assert isinstance(out, GuestFileTooLargeError) and "file over 1 MiB" in str(out)
    v = FakeAgent("ok", b"b" * (2**20 + 1))  # the agent's own read_file action: the first max_bytes, as documented
    assert actions.read_file(v, "d", "/f", 2**20) == b"b" * 2**20


def test_a_guest_command_that_never_exits_times_out() -> None:
    v = FakeAgent("running")
    out, took = timed(lambda: actions.shell(v, "d", "sleep 1000", 0.5))
    assert isinstance(out, GuestTimeoutError) and took < 0.5 + actions.GUEST_TIMEOUT_SLACK_SECONDS + 1


class AgentHost:
    """The runner's view of a replica over the real ``actions`` code and a ``FakeAgent``."""

    def __init__(self, virt: FakeAgent) -> None:
        self.virt = virt

    def shell(self, rid: str, command: str, timeout: float, as_root: bool = False) -> dict[str, Any]:
        if "stat -c %s" in command:  # the getters' size probe: the file exists, small (one path asked)
            self.virt.exec_out = b"4096\n"
        return actions.shell(self.virt, "d", command, timeout, as_root)

    def read_file(self, rid: str, path: str, limit: int, timeout: float = actions.READ_FILE_SECONDS) -> bytes:
        return actions.read_file(self.virt, "d", path, limit, timeout, whole=True)

    def reset(self, rid: str, unless_pristine: bool = False) -> None:
        pass


def xlsx_task() -> Task:
    return from_osworld(
        {
            "id": "deadline",
            "instruction": "x",
            "evaluator": {
                "func": "compare_table",
                "result": {"type": "vm_file", "path": "/home/user/r.xlsx", "dest": "r.xlsx"},
                "expected": {"type": "vm_file", "path": "/home/user/e.xlsx", "dest": "e.xlsx"},
            },
        }
    )


@pytest.mark.parametrize("mode", ["empty", "silent"])
def test_an_evaluation_on_a_stuck_guest_agent_is_an_infrastructure_error_within_its_budget(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "EVALUATE_BUDGET_SECONDS", 8.0)
    host = AgentHost(FakeAgent(mode))
    box: list[Any] = []
    worker = threading.Thread(target=lambda: box.append(timed(lambda: runner.evaluate(host, "r-1", xlsx_task()))))  # type: ignore[arg-type]
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "the evaluation thread hung"
    out, took = box[0]
    assert isinstance(out, runner.VerifierError), out  # the API answers 503 (infrastructure), never a 0
    assert took < 8.0 + actions.GUEST_TIMEOUT_SLACK_SECONDS + 1


def test_a_result_file_over_the_cap_scores_zero_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("osfleet.tasks.runner.MAX_READ_BYTES", 2**20)
    monkeypatch.setattr("osfleet.tasks.osworld_format.getters.MAX_READ_BYTES", 2**20)
    host = AgentHost(FakeAgent("ok", b"PK" + b"\0" * 2**20))
    evaluation = runner.evaluate(host, "r-1", xlsx_task())  # type: ignore[arg-type]
    assert evaluation.reward == 0.0
    assert "file over 1 MiB: /home/user/r.xlsx" in evaluation.criteria[0].detail
