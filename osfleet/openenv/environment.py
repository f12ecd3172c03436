"""An OpenEnv environment whose sessions are osfleet desktops: one session = one lease.

OpenEnv (``openenv-core``, which TRL drives) serves environments over HTTP and WebSocket; its server keeps one
environment object per WebSocket session and calls ``reset``/``step``/``state``/``close`` on it. This class
maps those calls onto an osfleet host agent or gateway through the blocking client: the lease is taken at the
first ``reset`` (so OpenEnv's throwaway instances for ``/state``, ``/metadata`` and ``/schema`` cost nothing)
and released at ``close``. A step's action is ``{"actions": [osfleet actions]}``; an observation carries the
screen (``screenshot``, base64), the ``instruction``, the actions' results, and — when the episode ends by the
agent's ``terminate`` action or ``max_steps`` — the verifier's reward with ``done`` true.

Two roles (``osfleet.mcp.roles`` has the why): on the agent's surface (the default) ``reset`` takes a built-in task
id but no task body (a policy must not write its own verifier), and an ended episode says its reward and success
only, not each criterion (whose details can carry what the verifier expected); on the grader's (``/grader``, its
own token) both are open.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import HTTPException
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field

from osfleet import __version__
from osfleet.client import Fleet, FleetError, LeaseError, Session
from osfleet.client.types import Screen, TaskLike
from osfleet.protocol.models import ImageFormat

Role = Literal["agent", "grader"]
TASK_BODY_REFUSED = (
    "a task body is the grader's to give (the grader's surface: /grader, with --grader-token-file's token); "
    "the agent's reset takes a built-in task id"
)


class DesktopAction(Action):
    """A batch of osfleet actions, applied once, in order (the host agent's ``step`` schema)."""

    actions: list[dict[str, Any]] = Field(
        min_length=1, max_length=100, description="osfleet actions, OSWorld's pyautogui and computer_13 ones too"
    )


class DesktopObservation(Observation):
    screenshot: str = Field(description="the screen, base64 of the image in `format`")
    format: str = "png"
    width: int = 0
    height: int = 0
    instruction: str = ""
    results: list[dict[str, Any]] = Field(default_factory=list, description="one result per action of the step")
    evaluation: dict[str, Any] | None = Field(None, description="the verifier's evaluation when the episode ended")


class DesktopState(State):
    replica_id: str | None = None
    task_id: str | None = None
    instruction: str | None = None


@dataclass
class Frontend:
    """What every session of one ``osfleet openenv serve`` shares: the fleet client and the defaults."""

    fleet: Fleet
    task: TaskLike | None = None
    max_steps: int = 50
    observation_format: ImageFormat = "png"
    lease_seconds: float | None = None
    holder: str = "openenv"
    sessions: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class DesktopEnvironment(Environment[DesktopAction, DesktopObservation, DesktopState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, frontend: Frontend, role: Role = "agent") -> None:
        super().__init__()
        self._front = frontend
        self.role = role
        self._session: Session | None = None
        self._state = DesktopState()
        self._done = False

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, task: Any = None, **_: Any
    ) -> DesktopObservation:
        """The desktop back at the task's initial state (``task`` overrides the server's default task: a built-in
        id, or on the grader's surface a task body too)."""
        if task is not None and not isinstance(task, str) and self.role != "grader":
            raise HTTPException(403, TASK_BODY_REFUSED)
        chosen = task if task is not None else self._front.task
        session = self._lease()
        try:
            r = session.reset(chosen, format=self._front.observation_format)
        except LeaseError:  # the lease ran out between episodes: take a new desktop
            self._session = None
            session = self._lease()
            r = session.reset(chosen, format=self._front.observation_format)
        self._done = False
        self._state = DesktopState(
            episode_id=episode_id or uuid.uuid4().hex,
            step_count=0,
            replica_id=session.replica_id,
            task_id=r.task_id,
            instruction=r.instruction,
        )
        assert r.screen is not None
        return self._observation(r.screen, [], None)

    def step(self, action: DesktopAction, timeout_s: float | None = None, **_: Any) -> DesktopObservation:
        if self._session is None:
            raise RuntimeError("no episode: send reset first (an OpenEnv session is one leased desktop)")
        if self._done:
            raise RuntimeError("the episode is over: send reset to start the next one")
        r = self._session.step(action.actions, format=self._front.observation_format, timeout=timeout_s)
        self._state.step_count += 1
        results = [x.model_dump(exclude_none=True) for x in r.results]
        evaluation = None
        if r.done or self._state.step_count >= self._front.max_steps:
            self._done = True
            scored = self._session.evaluate()
            evaluation = (
                scored.model_dump()
                if self.role == "grader"
                else {"reward": scored.reward, "success": scored.success}  # no criterion: no expected value leaks
            )
        assert r.screen is not None
        return self._observation(r.screen, results, evaluation)

    @property
    def state(self) -> DesktopState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="osfleet-desktop",
            description="A full GUI desktop replica of an osfleet fleet: one session is one leased desktop.",
            version=__version__,
        )

    def close(self) -> None:
        """Give the desktop back (the replica is reset for the next client)."""
        session, self._session = self._session, None
        if session is not None:
            with contextlib.suppress(FleetError):  # the lease had ended already: nothing left to give back
                session.release()
            with self._front.lock:
                self._front.sessions -= 1

    def _lease(self) -> Session:
        if self._session is None:
            self._session = self._front.fleet.lease(self._front.holder, ttl=self._front.lease_seconds)
            with self._front.lock:
                self._front.sessions += 1
        return self._session

    def _observation(
        self, screen: Screen, results: list[dict[str, Any]], evaluation: dict[str, Any] | None
    ) -> DesktopObservation:
        return DesktopObservation(
            screenshot=screen.base64(),
            format=screen.format,
            width=screen.width,
            height=screen.height,
            instruction=self._state.instruction or "",
            results=results,
            evaluation=evaluation,
            done=self._done,
            reward=evaluation["reward"] if evaluation is not None else None,
        )
