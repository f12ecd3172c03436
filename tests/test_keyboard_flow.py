"""Typing into a keyboard that holds 16 bytes and drops the rest, as QEMU's PS/2 keyboard does (no VM: the
keyboard and the guest reading it are simulated; tests/test_keyboard_flow_vm.py types into a real guest)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from osfleet.replicas import keyboard_flow
from osfleet.replicas.input import Input, InputError, key_for_char

# In-process, but seconds of waits and servers in sum: integration keeps the unit tier under 2 minutes.
pytestmark = pytest.mark.integration

QUEUE = 16


class SlowGuestKeyboard:
    """QEMU's side (a 16-byte queue, IRQ 1 counted per byte) and a guest that reads one byte every
    ``read_every`` seconds, stopping for ``pause`` seconds after every 10 bytes (a vCPU not scheduled)."""

    def __init__(self, read_every: float = 0.001, pause: float = 0.15, reads: bool = True) -> None:
        self.queue: list[int] = []
        self.typed: list[int] = []  # what the guest read, in order
        self.dropped = 0
        self.irqs = 0
        self.lock = threading.Lock()
        self.read_every, self.pause, self.reads = read_every, pause, reads
        self.stop = threading.Event()
        self.reader = threading.Thread(target=self._guest, daemon=True)
        self.reader.start()

    def _guest(self) -> None:
        n = 0
        while not self.stop.is_set():
            time.sleep(self.read_every)
            if not self.reads:
                continue
            with self.lock:
                if self.queue:
                    self.typed.append(self.queue.pop(0))
                    self.irqs += 1
                    n += 1
            if n and n % 10 == 0:
                n += 1
                time.sleep(self.pause)

    def qmp(self, domain: str, command: str, arguments: dict[str, Any] | None = None) -> Any:
        if command == "human-monitor-command":
            with self.lock:
                irqs = self.irqs
            lines = ["IRQ statistics for ioapic:", " 0: 1"] + ([f" 1: {irqs}"] if irqs else []) + [" 9: 1"]
            return "\n".join(lines + ["IRQ statistics for isa-i8259:", " 0: 1", ""])
        assert command == "input-send-event" and arguments is not None
        with self.lock:
            for event in arguments["events"]:
                if event["type"] != "key":
                    continue
                code = event["data"]["key"]["data"]
                for _ in range(keyboard_flow.scancode_bytes([event])):
                    if len(self.queue) >= QUEUE:
                        self.dropped += 1
                    else:
                        self.queue.append(hash((code, event["data"]["down"])))
        return {}

    def drained(self, timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if not self.queue:
                    return
            time.sleep(0.01)


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr("osfleet.replicas.input.KEY_GAP_SECONDS", 0.0)
    yield


def _expected(text: str) -> int:
    return sum(4 if key_for_char(c)[1] else 2 for c in text)


TEXT = "echo Hello-from-a-starved-guest > ~/gui.txt; ls -la /tmp | wc -l\n" * 3


@pytest.mark.usefixtures("fast")
def test_a_guest_that_falls_behind_gets_every_key() -> None:
    kb = SlowGuestKeyboard()
    try:
        Input(kb, "osfleet-flow-a", (1280, 800)).type_text(TEXT)  # type: ignore[arg-type]
        with kb.lock:
            assert not kb.queue  # the action returns once the guest has read every key
    finally:
        kb.stop.set()
    assert kb.dropped == 0
    assert len(kb.typed) == _expected(TEXT)


@pytest.mark.usefixtures("fast")
def test_without_flow_the_same_guest_loses_keys() -> None:
    """The control: the simulated keyboard does drop what a typist sends too fast (QEMU measured the same)."""
    kb = SlowGuestKeyboard()
    try:
        pointer = Input(kb, "osfleet-flow-b", (1280, 800))  # type: ignore[arg-type]
        pointer.keyboard.enabled = False
        pointer.type_text(TEXT)
        kb.drained()
    finally:
        kb.stop.set()
    assert kb.dropped > 0 and len(kb.typed) < _expected(TEXT)


@pytest.mark.usefixtures("fast")
def test_a_guest_that_reads_nothing_fails_the_action_saying_how_far_it_got(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyboard_flow, "STALL_SECONDS", 0.3)
    kb = SlowGuestKeyboard(reads=False)
    try:
        start = time.monotonic()
        with pytest.raises(InputError, match=r"typed 5 of 66 characters: the guest read no keystroke"):
            Input(kb, "osfleet-flow-c", (1280, 800)).type_text(TEXT[:66])  # type: ignore[arg-type]
        assert time.monotonic() - start < 2
    finally:
        kb.stop.set()
    assert kb.dropped == 0  # nothing was sent into the full queue


def test_irq_counts_are_read_from_the_first_controller() -> None:
    both = "IRQ statistics for ioapic:\n 0: 1\n{} 9: 1\nIRQ statistics for isa-i8259:\n 1: 40\n"
    assert keyboard_flow.irq1_count(both.format(" 1: 38\n")) == 38
    assert keyboard_flow.irq1_count(both.format("")) == 0  # no line until the count is not 0
    assert keyboard_flow.irq1_count("") is None


def test_extended_keys_take_two_bytes_a_transition() -> None:
    def key(code: str, down: bool) -> dict[str, Any]:
        return {"type": "key", "data": {"down": down, "key": {"type": "qcode", "data": code}}}

    assert keyboard_flow.scancode_bytes([key("a", True), key("a", False)]) == 2
    assert keyboard_flow.scancode_bytes([key("up", True), key("up", False)]) == 4
    assert keyboard_flow.scancode_bytes([{"type": "btn", "data": {"down": True, "button": "left"}}]) == 0


def test_a_machine_without_irq_statistics_types_as_before() -> None:
    sent: list[int] = []

    class NoStats:
        def qmp(self, domain: str, command: str, arguments: dict[str, Any] | None = None) -> Any:
            if command == "human-monitor-command":
                return ""
            sent.append(len(arguments["events"]) if arguments else 0)
            return {}

    pointer = Input(NoStats(), "osfleet-flow-d", (1280, 800))  # type: ignore[arg-type]
    pointer.type_text("Ab")
    assert sent == [4, 2] and not pointer.keyboard.enabled


def test_keys_right_after_a_click_wait_for_the_pointer_to_settle() -> None:
    """The tablet and the keyboard are two devices the guest's X server reads in its own order: the first key
    after a click goes no sooner than ``POINTER_SETTLE_SECONDS`` after it; later keys do not wait."""
    sent: list[tuple[float, str]] = []

    class Recorder:
        read = 0  # a guest that reads every byte at once

        def qmp(self, domain: str, command: str, arguments: dict[str, Any] | None = None) -> Any:
            if command == "human-monitor-command":
                return f"IRQ statistics for ioapic:\n 1: {self.read}\n"
            assert arguments is not None
            self.read += keyboard_flow.scancode_bytes(arguments["events"])
            sent.append((time.monotonic(), arguments["events"][0]["type"]))
            return {}

    pointer = Input(Recorder(), "osfleet-flow-e", (1280, 800))  # type: ignore[arg-type]
    pointer.click(10, 10)
    pointer.type_text("ab")
    last_pointer = max(t for t, kind in sent if kind in ("abs", "btn"))
    keys = [t for t, kind in sent if kind == "key"]
    assert keys[0] - last_pointer >= keyboard_flow.POINTER_SETTLE_SECONDS
    assert keys[1] - keys[0] < keyboard_flow.POINTER_SETTLE_SECONDS
