"""``wait`` until quiet: it ends once the screen has been still for its window, or at its bound when the screen
keeps changing; on a virtual clock (no sleeping), then through ``run_actions`` as a step runs it."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import pytest

from osfleet.protocol.actions import ACTIONS, Wait
from osfleet.replicas import actions as replica_actions
from osfleet.replicas.settle import POLL_SECONDS, wait_until_quiet

pytestmark = pytest.mark.unit


class Clock:
    """Virtual time: ``sleep`` moves it on; each capture costs ``capture_seconds`` of it."""

    def __init__(self, capture_seconds: float = 0.03) -> None:
        self.now = 100.0
        self.capture_seconds = capture_seconds
        self.captures: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds

    def screen(self, frame_at: Callable[[float], Hashable]) -> Callable[[], Hashable]:
        def capture() -> Hashable:
            self.captures.append(self.now)
            self.now += self.capture_seconds
            return frame_at(self.now)

        return capture


def _wait(clock: Clock, frame_at: Callable[[float], Hashable], bound: float, quiet: float) -> tuple[bool, float]:
    start = clock.now
    settled = wait_until_quiet(clock.screen(frame_at), bound, quiet, clock=clock, sleep=clock.sleep)
    return settled, clock.now - start


def test_a_still_screen_ends_the_wait_after_one_quiet_window() -> None:
    clock = Clock()
    settled, waited = _wait(clock, lambda _t: "same", bound=5.0, quiet=0.5)
    assert settled and 0.5 <= waited <= 0.5 + POLL_SECONDS + clock.capture_seconds * 2


def test_a_screen_that_settles_ends_the_wait_one_window_after_its_last_change() -> None:
    clock = Clock()
    last_change = clock.now + 1.2  # an application drawing for 1.2 s, a new frame every 50 ms
    settled, waited = _wait(clock, lambda t: min(int(t * 20), int(last_change * 20)), bound=5.0, quiet=0.5)
    assert settled and 1.2 + 0.5 <= waited <= 1.2 + 0.5 + 2 * POLL_SECONDS


def test_a_screen_that_never_settles_ends_the_wait_at_its_bound() -> None:
    clock = Clock()
    settled, waited = _wait(clock, lambda t: int(t * 1000), bound=2.0, quiet=0.5)
    assert not settled and 2.0 <= waited <= 2.0 + clock.capture_seconds + 1e-9
    assert len(clock.captures) <= 2.0 / (POLL_SECONDS + clock.capture_seconds) + 2  # polls, not a busy loop


def test_a_blinking_caret_does_not_keep_the_default_window_from_closing() -> None:
    clock = Clock()
    default = Wait(type="wait", until="quiet").quiet_seconds
    settled, waited = _wait(clock, lambda t: int(t / 0.6) % 2, bound=5.0, quiet=default)  # on/off every 0.6 s
    assert settled and waited < 1.5


def test_a_zero_bound_looks_once_and_returns() -> None:
    clock = Clock()
    assert _wait(clock, lambda _t: "same", bound=0.0, quiet=0.5)[0] is False
    assert len(clock.captures) == 1


def test_the_wait_action_takes_until_quiet_with_bounds() -> None:
    wait = ACTIONS.validate_python([{"type": "wait", "until": "quiet", "seconds": 5}])[0]
    assert isinstance(wait, Wait) and wait.until == "quiet" and wait.seconds == 5 and wait.quiet_seconds == 0.5
    plain = ACTIONS.validate_python([{"type": "wait", "seconds": 2}])[0]
    assert isinstance(plain, Wait) and plain.until is None
    for bad in ({"until": "idle"}, {"until": "quiet", "quiet_seconds": 0}, {"until": "quiet", "quiet_seconds": 11}):
        with pytest.raises(ValueError, match="until|quiet_seconds"):
            ACTIONS.validate_python([{"type": "wait", **bad}])


def test_a_step_waits_until_quiet_through_the_replicas_screen() -> None:
    frames = iter(["a", "b", "b", "b", "b", "b", "b", "b", "b", "b", "b"])
    looked: list[str] = []

    def screen_state() -> Hashable:
        looked.append(next(frames))
        return looked[-1]

    wait = Wait(type="wait", until="quiet", seconds=5, quiet_seconds=0.02)
    results = replica_actions.run_actions(None, "d", (64, 40), [wait], screen_state=screen_state)  # type: ignore[arg-type]
    assert results[0].ok and results[0].seconds < 5 and looked[:2] == ["a", "b"]


def test_a_quiet_wait_without_a_screen_to_watch_fails_as_a_result() -> None:
    wait = Wait(type="wait", until="quiet", seconds=5)
    results = replica_actions.run_actions(None, "d", (64, 40), [wait])  # type: ignore[arg-type]
    assert not results[0].ok and "cannot be watched" in (results[0].error or "")
