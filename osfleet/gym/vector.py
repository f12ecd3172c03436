"""A vector of desktops stepped concurrently over one connection pool (``gymnasium.vector`` API).

Unlike Gymnasium's ``AsyncVectorEnv`` (one process per environment), the work of a desktop step happens on the
host agent, so the client side only waits: one event loop drives every replica's request at once, and a batch
step takes about as long as the slowest replica's step, not the sum. Autoreset is Gymnasium's default
``NEXT_STEP``: the step after an episode ended resets that desktop (its reward 0, not terminated).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from osfleet.client import AsyncFleet, AsyncSession, FleetError
from osfleet.client.sync import _Loop
from osfleet.client.types import Screen, StepResult, TaskLike
from osfleet.gym.env import DesktopEnvError, InvalidDesktopAction, ObservationKind, _translate
from osfleet.gym.spaces import action_space, instruction_space, native_actions, screen_space, to_action
from osfleet.protocol.models import ImageFormat


async def _make(url: str, token: str | None, **options: Any) -> AsyncFleet:
    return AsyncFleet(url, token, **options)


class DesktopVectorEnv(VectorEnv[Any, Any, Any]):
    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(
        self,
        num_envs: int,
        url: str,
        token: str | None = None,
        task: TaskLike | None = None,
        max_steps: int = 50,
        observation: ObservationKind = "screen",
        format: ImageFormat = "png",
        quality: int | None = None,
        *,
        token_file: str | Path | None = None,
        holder: str = "gymnasium-vector",
        lease_seconds: float | None = None,
        lease_wait: float = 600.0,
        max_connections: int | None = None,
        **_: Any,
    ) -> None:
        if num_envs < 1:
            raise DesktopEnvError(f"num_envs must be at least 1, not {num_envs}")
        self.num_envs, self.task, self.max_steps, self.observation_kind = num_envs, task, max_steps, observation
        self._loop = _Loop()
        self._sessions: list[AsyncSession] = []
        self.closed = False
        try:
            self._fleet = self._loop.run(
                _make(
                    url,
                    token,
                    token_file=token_file,
                    observation_format=format,
                    observation_quality=quality,
                    max_connections=max_connections or max(8, 2 * num_envs),
                )
            )
            self._sessions = list(
                self._loop.run(
                    self._all([self._fleet._lease(holder, lease_seconds, lease_wait) for _ in range(num_envs)])
                )
            )
            first = self._loop.run(self._sessions[0].observe())
        except FleetError as exc:
            self.close()
            raise _translate(exc) from None
        except BaseException:
            self.close()
            raise
        self.width, self.height = first.width, first.height
        self.single_action_space = action_space(self.width, self.height)
        self.single_observation_space: spaces.Space[Any] = screen_space(self.width, self.height)
        if observation == "dict":
            self.single_observation_space = spaces.Dict(
                {"screen": screen_space(self.width, self.height), "instruction": instruction_space()}
            )
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self._steps = np.zeros(num_envs, dtype=np.int64)
        self._ended = np.zeros(num_envs, dtype=bool)
        self._instructions = [""] * num_envs

    async def _all(self, coros: list[Any]) -> list[Any]:
        """Every coroutine at once; if one fails the others still finish (no half-done batch), then it raises."""
        results = await asyncio.gather(*coros, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                if isinstance(r, FleetError):
                    raise _translate(r) from r
                raise r
        return results

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset every desktop to the task (``options={"task": ...}`` changes it), all at once; the infos hold each
        one's instruction and reset time."""
        super().reset(seed=seed)
        self._check_open()
        if options and "task" in options:
            self.task = options["task"]
        results = self._loop.run(self._all([s.reset(self.task) for s in self._sessions]))
        self._steps[:] = 0
        self._ended[:] = False
        self._instructions = [r.instruction or "" for r in results]
        screens = [r.screen for r in results]
        infos = {
            "instruction": np.array(self._instructions, dtype=object),
            "reset_seconds": np.array([r.seconds for r in results]),
        }
        return self._batch(screens), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One action per desktop, applied concurrently; a desktop whose episode ended is reset by this step instead
        (Gymnasium's next-step autoreset). The reward is the task's, evaluated when an episode ends."""
        self._check_open()
        if isinstance(actions, list | tuple):  # one action per desktop: samples of the single space, or native
            per_env = list(actions)
        elif self.action_space.contains(actions):  # a sample of the batched space
            per_env = [dict(a) for a in iterate(self.action_space, actions)]
        else:
            raise InvalidDesktopAction(f"actions {actions!r} are not in the vector's action space")
        if len(per_env) != self.num_envs:
            raise InvalidDesktopAction(f"expected {self.num_envs} actions, got {len(per_env)}")
        jobs: list[Any] = []
        for i, (session, action) in enumerate(zip(self._sessions, per_env, strict=True)):
            if self._ended[i]:
                jobs.append(session.reset(self.task))
                continue
            native = native_actions(action)
            if native is None and isinstance(actions, list | tuple) and not self.single_action_space.contains(action):
                raise InvalidDesktopAction(f"action {i} ({action!r}) is not in the action space")
            jobs.append(self._step_one(i, session, native or [to_action(action)]))
        outcomes = self._loop.run(self._all(jobs))
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        screens: list[Screen | None] = []
        for i, out in enumerate(outcomes):
            if self._ended[i]:  # this slot was reset (NEXT_STEP autoreset)
                self._ended[i], self._steps[i] = False, 0
                self._instructions[i] = out.instruction or ""
                screens.append(out.screen)
                continue
            step, reward = out
            self._steps[i] += 1
            terminated[i] = step.done
            truncated[i] = not step.done and self._steps[i] >= self.max_steps
            rewards[i] = reward
            self._ended[i] = terminated[i] or truncated[i]
            screens.append(step.screen)
        return self._batch(screens), rewards, terminated, truncated, {"steps": self._steps.copy()}

    async def _step_one(self, i: int, session: AsyncSession, actions: list[Any]) -> tuple[StepResult, float]:
        result = await session.step(actions)
        ends = result.done or self._steps[i] + 1 >= self.max_steps
        reward = float((await session.evaluate()).reward) if ends else 0.0
        return result, reward

    def _batch(self, screens: list[Screen | None]) -> Any:
        items: list[Any] = []
        for screen, instruction in zip(screens, self._instructions, strict=True):
            assert screen is not None
            array = screen.array()
            items.append(array if self.observation_kind == "screen" else {"screen": array, "instruction": instruction})
        out = create_empty_array(self.single_observation_space, self.num_envs)
        return concatenate(self.single_observation_space, items, out)  # type: ignore[arg-type]

    async def _release_all(self) -> None:
        await asyncio.gather(*(s.release() for s in self._sessions), return_exceptions=True)

    def _check_open(self) -> None:
        if self.closed:
            raise gymnasium.error.ClosedEnvironmentError("the vector environment is closed")

    def close_extras(self, **kwargs: Any) -> None:
        """Release every lease and close the client (Gymnasium's hook, called by ``close``)."""
        loop = getattr(self, "_loop", None)
        if loop is None:
            return
        if self._sessions:
            loop.run(self._release_all())
        if getattr(self, "_fleet", None) is not None:
            loop.run(self._fleet.aclose())
        loop.stop()
        self._loop = None  # type: ignore[assignment]

    def close(self, **kwargs: Any) -> None:
        """Release the desktops and close the client; safe to call twice."""
        if self.closed:
            return
        self.close_extras(**kwargs)
        self.closed = True
