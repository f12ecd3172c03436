"""Keystrokes a busy guest cannot lose.

The guest's keyboard is QEMU's emulated PS/2 keyboard, whose queue holds 16 bytes: what arrives while 16 are
unread is dropped without a word (measured: 30 keys sent at once, 16 bytes arrived). A guest reads a byte per
interrupt, so it keeps up while its vCPU runs, but a TCG vCPU that is not scheduled for a few tens of ms (two
busy replicas and a Locust run on two cores) falls behind a typist sending a key every 10 ms, and the text
typed is not the text asked for: `echo hello > f` became a command that failed and left `f` empty.

The host can see how far the guest has read: each byte the keyboard presents raises IRQ 1 once, and QEMU counts
those (HMP ``info irq``). So keys are sent while fewer than ``WINDOW_BYTES`` are unread, and otherwise only
once the guest has read enough of them. On an idle guest this costs one monitor round trip every few keys; on
a starved one the typist waits for the guest instead of typing into a full queue. A guest that reads nothing
for ``STALL_SECONDS`` is not waited for longer: the action fails saying how much was typed.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from osfleet.errors import OsfleetError
from osfleet.replicas import unicode_keys

WINDOW_BYTES = 12  # unread at most; 4 of the 16 are left for the keyboard's own replies (e.g. LED changes)
# Once the window is full, typing waits until at most this many are unread: the next keys then go without asking
# QEMU again (asking for every key made a busy host busier: typing 56 characters took 2.2 s instead of 0.6 s).
LOW_WATER_BYTES = 2
POLL_SECONDS = 0.01
STALL_SECONDS = 5.0
MAX_DOMAINS = 4096  # domains remembered (one per generation; the oldest are forgotten)
# Pointer events come through another device (the virtio tablet), and the guest's X server reads its devices in
# its own order: a key sent right after a click can be handled before the pointer moved, and go to the window
# that was under it. Keys wait until this long after the last pointer event (a heuristic: the tablet's queue
# is not visible from here; an agent that looks at the screen between a click and typing never waits).
POINTER_SETTLE_SECONDS = 0.15
# Keys whose scancode (set 1, as the i8042 translates for Linux) has an 0xE0 prefix: two bytes a transition.
EXTENDED = frozenset(
    {"ctrl_r", "alt_r", "meta_l", "meta_r", "menu", "kp_enter", "kp_divide", "insert", "delete", "home", "end"}
    | {"pgup", "pgdn", "up", "down", "left", "right"}
    # the extra keys unicode_keys uses and their neighbours (measured: 4 bytes a press and release)
    | {"stop", "mail", "calculator", "computer", "mediaselect", "ac_home", "ac_bookmarks", "ac_refresh", "audiostop"}
)
_IRQ_LINE = re.compile(r"^\s*1:\s*(\d+)\s*$")


class KeyboardStalledError(OsfleetError):
    """The guest stopped reading its keyboard: more keys would only be dropped."""


def scancode_bytes(events: list[dict[str, Any]]) -> int:
    """How many bytes QEMU's PS/2 keyboard queues for these input events (pointer events: none)."""
    n = 0
    for e in events:
        if e.get("type") == "key":
            n += 2 if e["data"]["key"]["data"] in EXTENDED else 1
    return n


def irq1_count(info_irq: str) -> int | None:
    """IRQ 1's count in the first controller HMP ``info irq`` lists (the I/O APIC on a PC; a line appears
    once the count is not 0), or None when the machine reports no statistics at all."""
    section = None
    for line in info_irq.splitlines():
        if line.startswith("IRQ statistics for"):
            if section is not None:
                break
            section = line
            continue
        m = _IRQ_LINE.match(line)
        if section is not None and m:
            return int(m.group(1))
    return None if section is None else 0


class KeyboardFlow:
    """The bytes sent to one domain's keyboard and how many of them its guest has read; also what else osfleet
    knows of the domain's input: where it put the pointer last, and what the spare keys carry (``unicode_keys``)."""

    def __init__(self, read_count: Callable[[], int | None]) -> None:
        self._read_count = read_count
        self._lock = threading.Lock()
        self.sent = 0
        self.read = 0  # as last seen
        self._base: int | None = None
        self.enabled = True
        self.pointer_at = 0.0  # monotonic time of the last pointer event sent
        self.pointer: tuple[int, int] | None = None  # where osfleet put the pointer last (None: not known)
        self.spare: dict[str, str] = {}  # spare key (qcode) -> the character the guest's X server maps it to now
        self._spare_at: dict[str, float] = {}  # spare key -> monotonic time it was last pressed

    def pointer_sent(self) -> None:
        self.pointer_at = time.monotonic()

    def spare_code(self, ch: str) -> str | None:
        """The spare key that types ``ch`` now, if any."""
        return next((code for code, held in self.spare.items() if held == ch), None)

    def spare_used(self, code: str) -> None:
        self._spare_at[code] = time.monotonic()

    def settle_spares(self, codes: list[str]) -> None:
        """Wait until none of ``codes`` was pressed in the last ``unicode_keys.SETTLE_SECONDS``."""
        last = max((self._spare_at.get(c, 0.0) for c in codes), default=0.0)
        left = last + unicode_keys.SETTLE_SECONDS - time.monotonic()
        if left > 0:
            time.sleep(left)

    def settle_after_pointer(self) -> None:
        """Wait out what is left of ``POINTER_SETTLE_SECONDS`` since the last pointer event."""
        left = self.pointer_at + POINTER_SETTLE_SECONDS - time.monotonic()
        if left > 0:
            time.sleep(left)

    def _seen(self) -> int | None:
        count = self._read_count()
        if count is None:
            self.enabled = False  # nothing to pace on: keys go as they come (the old behaviour)
            return None
        if self._base is None or count - self._base > self.sent:
            # The first time the queue is taken to be empty; a count above what was sent means the keyboard's
            # own replies were counted too (two ACKs per LED change): they are not ours, and do not add up.
            self._base = count - self.sent
        self.read = max(self.read, count - self._base)
        return self.read

    def before(self, nbytes: int) -> None:
        """Return once ``nbytes`` more fit in the window (immediately when they already do, as far as known)."""
        with self._lock:
            if not self.enabled:
                return
            if self._base is not None and self.sent - self.read + nbytes <= WINDOW_BYTES:
                return
            if not self._wait_unread(max(0, min(LOW_WATER_BYTES, WINDOW_BYTES - nbytes))):
                self._base = None  # start afresh if the guest wakes up and the action is retried
                self.sent = self.read = 0
                raise KeyboardStalledError(
                    f"the guest read no keystroke for {STALL_SECONDS:g} s (its keyboard holds 16 bytes; "
                    "keys sent now would be lost)"
                )

    def drain(self) -> bool:
        """Wait until the guest has read every key sent (so what follows, e.g. a wait, starts once the guest has
        the whole text); False if it stopped reading (STALL_SECONDS without progress)."""
        with self._lock:
            return not self.enabled or self._base is None or self._wait_unread(0)

    def _wait_unread(self, at_most: int) -> bool:
        """Poll QEMU until at most ``at_most`` bytes are unread; False after STALL_SECONDS without progress."""
        last_progress, last_read = time.monotonic(), None
        while True:
            read = self._seen()
            if read is None or self.sent - read <= at_most:
                return True
            now = time.monotonic()
            if read != last_read:
                last_progress, last_read = now, read
            elif now - last_progress > STALL_SECONDS:
                return False
            time.sleep(POLL_SECONDS)

    def after(self, nbytes: int) -> None:
        with self._lock:
            self.sent += nbytes


_flows: OrderedDict[str, KeyboardFlow] = OrderedDict()
_flows_lock = threading.Lock()


def flow_for(domain: str, read_count: Callable[[], int | None]) -> KeyboardFlow:
    """The flow of ``domain`` (each generation is its own domain and QEMU, so its own count)."""
    with _flows_lock:
        flow = _flows.get(domain)
        if flow is None:
            flow = _flows[domain] = KeyboardFlow(read_count)
            while len(_flows) > MAX_DOMAINS:
                _flows.popitem(last=False)
        else:
            _flows.move_to_end(domain)
        return flow
