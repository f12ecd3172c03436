"""``osfleet/Desktop-v0``: one desktop replica as a Gymnasium environment.

One environment holds one lease from construction to ``close()`` (a desktop is a resource, like a simulator
process): ``reset`` resets that replica to the task (snapshot resets take milliseconds), ``step`` applies one
action and returns the screen, and the reward comes from the task's verifier (``evaluate``) when the episode
ends — the agent's ``terminate`` action (``terminated``) or ``max_steps`` (``truncated``). Failures of the
infrastructure raise ``DesktopInfrastructureError``; they are never a reward of 0.

``env.unwrapped.fork(n)`` gives n environments at exactly the current state (each its own lease), for
rollouts that branch from one desktop.
"""

from __future__ import annotations

import string
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, SupportsFloat

import gymnasium
import numpy as np
from gymnasium import spaces

from osfleet.client import Fleet, FleetError, InfrastructureError, InvalidActionError, Session
from osfleet.client.types import Screen, TaskLike
from osfleet.gym.spaces import ACTION_SPACES, ActionSpaceName, actions_in, instruction_space, screen_space, space_for
from osfleet.protocol.models import ImageFormat, ObservationPart

ObservationKind = Literal["screen", "dict"]
MAX_DESKTOP_TEXT = 16 * 2**20  # an accessibility tree of a big window
DESKTOP_TEXT_CHARS = frozenset(string.printable)


class DesktopEnvError(gymnasium.error.Error):
    """The fleet refused a request (wrong token, unknown task, no capacity, ...); the reason is the message."""


class DesktopInfrastructureError(DesktopEnvError):
    """The replica, its host or the connection failed: discard the episode (it says nothing about the agent)."""


class InvalidDesktopAction(gymnasium.error.InvalidAction):
    """An action outside the screen, with untypable text, or otherwise refused before reaching the desktop."""


def _translate(exc: FleetError) -> gymnasium.error.Error:
    if isinstance(exc, InvalidActionError):
        return InvalidDesktopAction(str(exc))
    if isinstance(exc, InfrastructureError):
        return DesktopInfrastructureError(str(exc))
    return DesktopEnvError(str(exc))


class _SharedFleet:
    """A blocking client shared by a parent environment and its forks; closed when the last one closes."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet, self.users, self.lock = fleet, 0, threading.Lock()

    def acquire(self) -> Fleet:
        with self.lock:
            self.users += 1
        return self.fleet

    def release(self) -> None:
        with self.lock:
            self.users -= 1
            last = self.users == 0
        if last:
            self.fleet.close()


class DesktopEnv(gymnasium.Env[Any, Any]):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(
        self,
        url: str,
        token: str | None = None,
        task: TaskLike | None = None,
        max_steps: int = 50,
        observation: ObservationKind = "screen",
        format: ImageFormat = "png",
        quality: int | None = None,
        *,
        token_file: str | Path | None = None,
        action_space: ActionSpaceName = "osfleet",
        include: Sequence[ObservationPart] = (),
        holder: str = "gymnasium",
        lease_seconds: float | None = None,
        lease_wait: float = 600.0,
        render_mode: str | None = None,
        _shared: _SharedFleet | None = None,
        _session: Session | None = None,
    ) -> None:
        if max_steps < 1:
            raise DesktopEnvError(f"max_steps must be at least 1, not {max_steps}")
        if observation not in ("screen", "dict"):
            raise DesktopEnvError(f"observation must be 'screen' or 'dict', not {observation!r}")
        if render_mode not in (None, "rgb_array"):
            raise DesktopEnvError(f"render_mode must be None or 'rgb_array', not {render_mode!r}")
        if action_space not in ACTION_SPACES:
            raise DesktopEnvError(f"action_space must be one of {', '.join(ACTION_SPACES)}, not {action_space!r}")
        if include and observation != "dict":
            raise DesktopEnvError("include= needs observation='dict' (its parts are keys of the observation)")
        self.action_space_name: ActionSpaceName = action_space
        self._include = tuple(include)
        self.task, self.max_steps, self.observation_kind = task, max_steps, observation
        self.render_mode = render_mode
        self._format, self._quality = format, quality
        self._closed = False
        self._last: np.ndarray | None = None
        self._instruction = ""
        self._steps = 0
        self._done = False
        try:
            if _shared is None:
                _shared = _SharedFleet(
                    Fleet(url, token, token_file=token_file, observation_format=format, observation_quality=quality)
                )
            self._shared = _shared
            self._fleet = _shared.acquire()
        except FleetError as exc:
            raise _translate(exc) from None
        try:
            self._session = _session or self._fleet.lease(holder, ttl=lease_seconds, wait=lease_wait)
            first = self._session.observe()
        except FleetError as exc:
            self._shared.release()
            raise _translate(exc) from None
        self.width, self.height = first.width, first.height
        self._last = first.array()
        if _session is not None:
            self._instruction = _session.instruction or ""
            self._steps = _session.steps
        self.action_space = space_for(action_space, self.width, self.height)
        self.observation_space: spaces.Space[Any] = screen_space(self.width, self.height)
        if observation == "dict":
            parts: dict[str, spaces.Space[Any]] = {
                "screen": screen_space(self.width, self.height),
                "instruction": instruction_space(),
            }
            for part in ("accessibility_tree", "terminal"):
                if part in self._include:
                    parts[part] = spaces.Text(MAX_DESKTOP_TEXT, min_length=0, charset=DESKTOP_TEXT_CHARS)
            self.observation_space = spaces.Dict(parts)

    # --- the Gymnasium API ---------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Back to the task's initial state (``options={"task": ...}`` switches the task for this and later
        episodes). The seed only seeds ``np_random``: the desktop itself starts from the same saved state."""
        super().reset(seed=seed)
        self._check_open()
        if options and "task" in options:
            self.task = options["task"]
        try:
            r = self._session.reset(self.task, include=self._include)
        except FleetError as exc:
            raise _translate(exc) from None
        self._instruction = r.instruction or ""
        self._steps, self._done = 0, False
        assert r.screen is not None
        return self._observation(r.screen), {
            "replica_id": self._session.replica_id,
            "instruction": self._instruction,
            "reset_seconds": r.seconds,
        }

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """One action: a sample of ``action_space``; in the ``pyautogui`` space a code string (or ``WAIT``, ``DONE``,
        ``FAIL``), in ``computer_13`` OSWorld's action dict; native osfleet action dicts in any space. The reward is
        0 until the episode ends (``DONE``, ``FAIL``, ``terminate`` or ``max_steps``), then the verifier's."""
        self._check_open()
        if self._done:
            raise gymnasium.error.ResetNeeded("the episode is over: call reset()")
        actions = actions_in(self.action_space_name, action, self.action_space)
        if actions is None:
            raise InvalidDesktopAction(
                f"action {str(action)[:200]!r} is not in the action space ({self.action_space_name})"
            )
        try:
            r = self._session.step(actions, include=self._include)
        except FleetError as exc:
            raise _translate(exc) from None
        self._steps += 1
        terminated = r.done
        truncated = not terminated and self._steps >= self.max_steps
        info: dict[str, Any] = {"results": [x.model_dump() for x in r.results], "steps": self._steps}
        reward = 0.0
        if terminated or truncated:
            self._done = True
            try:
                evaluation = self._session.evaluate()
            except FleetError as exc:
                raise _translate(exc) from None
            reward = float(evaluation.reward)
            info["evaluation"] = evaluation.model_dump()
        assert r.screen is not None
        return self._observation(r.screen), reward, terminated, truncated, info

    def render(self) -> np.ndarray | None:
        """The last screen as a (height, width, 3) uint8 array with ``render_mode="rgb_array"``; else None."""
        if self.render_mode != "rgb_array" or self._last is None:
            return None
        return self._last.copy()

    def close(self) -> None:
        """Release the lease (the replica is reset and goes back to the pool). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self._session.release()
        except FleetError:
            pass  # the lease ended already (expired or taken back): nothing left to give back
        finally:
            self._shared.release()
        super().close()

    # --- branching -------------------------------------------------------------------------------------------------
    def fork(self, n: int) -> list[tuple[DesktopEnv, Any]]:
        """n environments at exactly this environment's current state (screen, memory, disk, task, step count),
        each with its own lease, and each one's observation (the screen at the fork, as ``reset`` returns one)."""
        self._check_open()
        try:
            children = self._session.fork(n)
        except FleetError as exc:
            raise _translate(exc) from None
        out: list[tuple[DesktopEnv, Any]] = []
        try:
            for child in children:
                env = DesktopEnv(
                    self._fleet.url,
                    task=self.task,
                    max_steps=self.max_steps,
                    observation=self.observation_kind,
                    format=self._format,
                    quality=self._quality,
                    render_mode=self.render_mode,
                    action_space=self.action_space_name,
                    include=self._include,
                    _shared=self._shared,
                    _session=child,
                )
                env._instruction, env._steps = self._instruction, self._steps
                if self.np_random_seed is not None:
                    env._np_random = self.np_random.spawn(1)[0]
                assert env._last is not None
                out.append((env, self._package(env._last, env._instruction)))
        except BaseException:
            for child in children[len(out) :]:
                child.release()
            for env, _ in out:
                env.close()
            raise
        return out

    @property
    def session(self) -> Session:
        """The client session behind this environment (for evaluate, observe in other formats, metadata)."""
        return self._session

    # --- helpers -----------------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise gymnasium.error.ClosedEnvironmentError("the environment is closed")

    def _observation(self, screen: Screen) -> Any:
        self._last = screen.array()
        seen = self._package(self._last, self._instruction)
        if isinstance(seen, dict):
            for part in self._include:
                if part in ("accessibility_tree", "terminal"):
                    text = getattr(screen, part) or ""
                    space = self.observation_space[part]  # type: ignore[index]
                    if not set(text) <= set(space.character_set):  # widened, as for the instruction
                        chars = "".join(sorted(set(space.character_set) | set(text)))
                        self.observation_space[part] = spaces.Text(MAX_DESKTOP_TEXT, min_length=0, charset=chars)  # type: ignore[index]
                    seen[part] = text
        return seen

    def _package(self, array: np.ndarray, instruction: str) -> Any:
        if self.observation_kind == "screen":
            return array.copy()
        text_space = self.observation_space["instruction"]  # type: ignore[index]
        if not set(instruction) <= set(text_space.character_set):
            # an instruction with characters outside printable ASCII widens the space rather than failing it
            self.observation_space["instruction"] = instruction_space("".join(sorted(set(instruction))))  # type: ignore[index]
        return {"screen": array.copy(), "instruction": instruction}
