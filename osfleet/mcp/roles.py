"""Agent and grader: two surfaces of one MCP server, so that what scores an episode is never the agent's tool.

An agent with ``evaluate`` has an oracle: it can try, score, and try again until the verifier says yes, reading
what the verifier expected in each criterion's detail; with ``reset(task=...)`` it can swap its task for one it
wrote (an easy one, or a verifier that leaks). So, as OpenEnv's RFC 009 puts it, the agent and the grader are
different principals, each with its own surface:

- **agent** (the default): the desktop's tools, ``reset()`` with no task of its own (back to the start of the task
  its session was given: the server's ``--task``, or the one a grader assigned), and ``evaluate()`` that *submits*:
  the task is scored now, for the grader, and the agent is told only that it was submitted (no reward, no
  criterion). Its score goes to the grader's ``sessions``/``evaluate_session`` (HTTP) and to ``--results-file``.
- **grader**: its own token (``--grader-token-file``, at ``/grader`` over HTTP) or ``--role grader`` (stdio: whoever
  starts the process chooses): everything the agent has, with ``reset(task_id | task)`` and an ``evaluate`` that
  answers the reward and every criterion; over HTTP, also the agent sessions of the same server: ``sessions``,
  ``assign_task`` (the task an agent session's next ``reset()`` starts) and ``evaluate_session``.

``Board`` is what both surfaces of one server share: the task given to each agent session, its desktop once it has
one, and its last submission.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.types import ContentBlock, ToolAnnotations
from pydantic import Field

from osfleet.client.types import TaskLike
from osfleet.mcp.content import DeskContext, desk_of, guarded, say, screen_parts, session_id
from osfleet.mcp.desk import Desk
from osfleet.protocol.tasks import Evaluation

log = logging.getLogger(__name__)

Role = Literal["agent", "grader"]
ROLES: tuple[Role, ...] = get_args(Role)
ROLE_TOOLS = ("reset", "evaluate")  # every role has them, each with its own meaning (the module's docstring)
GRADER_SESSION_TOOLS = ("sessions", "assign_task", "evaluate_session")  # over HTTP: the agent sessions
MAX_SESSIONS_LISTED = 1000
MAX_SUBMISSIONS_KEPT = 1000  # the last submission of this many agent sessions (ended ones too), newest kept

TaskId = Annotated[str | None, Field(max_length=200, description="a task the fleet has built in")]
TaskBody = Annotated[
    dict[str, Any] | None, Field(description="an inline task: osfleet's format or an OSWorld task's JSON")
]


@dataclass
class Submission:
    """An agent session's last ``evaluate``: what it scored, when, on which replica."""

    session: str
    replica_id: str | None
    task_id: str | None
    at: float
    evaluation: Evaluation

    def line(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "replica_id": self.replica_id,
            "task_id": self.task_id,
            "at": self.at,
            **self.evaluation.model_dump(mode="json"),
        }


@dataclass
class Board:
    """What the agent and grader surfaces of one server share (the module's docstring). ``default_task``: the
    task of every agent session no grader assigned one to (``--task``); ``results_file``: each submission
    appended as a JSON line."""

    default_task: TaskLike | None = None
    results_file: Path | None = None
    tasks: dict[str, TaskLike] = field(default_factory=dict)
    started: dict[str, str | None] = field(default_factory=dict)  # the task id each session was last reset to
    desks: dict[str, Desk] = field(default_factory=dict)
    submissions: dict[str, Submission] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def task_of(self, session: str) -> TaskLike | None:
        with self.lock:
            return self.tasks.get(session, self.default_task)

    def seen(self, session: str, desk: Desk) -> None:
        with self.lock:
            self.desks[session] = desk

    def ended(self, desk: Desk) -> None:
        """A session ended: forget its desktop and its assigned task (its last submission stays to be read)."""
        with self.lock:
            for sid in [sid for sid, d in self.desks.items() if d is desk]:
                del self.desks[sid]
                self.tasks.pop(sid, None)
                self.started.pop(sid, None)

    def submit(self, submission: Submission) -> None:
        with self.lock:
            self.submissions.pop(submission.session, None)  # moved to the newest end
            self.submissions[submission.session] = submission
            while len(self.submissions) > MAX_SUBMISSIONS_KEPT:
                del self.submissions[next(iter(self.submissions))]
        if self.results_file is not None:
            try:
                with self.results_file.open("a") as f:
                    f.write(json.dumps(submission.line()) + "\n")
            except OSError as exc:
                log.error("results file %s: %s", self.results_file, exc)

    def desk(self, session: str) -> Desk:
        with self.lock:
            desk = self.desks.get(session)
        if desk is None:
            raise ToolError(f"no agent session {session[:80]!r} of this server has used its desktop yet")
        return desk


def _chosen(task_id: str | None, task: dict[str, Any] | None) -> TaskLike | None:
    if task_id is not None and task is not None:
        raise ToolError("give task_id or task, not both")
    return task_id if task_id is not None else task


def _scored(e: Evaluation) -> str:
    lines = [f"reward {e.reward:g}, success {str(e.success).lower()}"]
    lines += [f"- {c.name}: {'met' if c.met else 'not met'} {c.detail}".rstrip() for c in e.criteria]
    return "\n".join(lines)


async def _reset(
    desk: Desk, task: TaskLike | None, board: Board | None = None, session: str = ""
) -> list[ContentBlock]:
    r = await desk.call(lambda s: s.reset(task))
    if board is not None:
        with board.lock:
            board.started[session] = r.task_id
    said = f"task {r.task_id}: {r.instruction}" if r.task_id else "reset to the initial state (no task)"
    return [say(said), *screen_parts(r.screen)]


def install(server: FastMCP[Desk], role: Role, board: Board, sessions: bool = False) -> None:
    """The role's tools on ``server`` (the acting tools are the server's own); ``sessions``: a grader also reaches
    the agent sessions of the same server (HTTP)."""
    if role == "agent":
        _agent(server, board)
    else:
        _grader(server, board, sessions)


def _tool(server: FastMCP[Desk], title: str, read_only: bool = False, name: str | None = None) -> Any:
    annotations = ToolAnnotations(title=title, readOnlyHint=read_only)
    return server.tool(name=name, title=title, annotations=annotations, structured_output=False)


def _agent(server: FastMCP[Desk], board: Board) -> None:
    @_tool(server, "Reset")
    async def reset(ctx: DeskContext) -> list[ContentBlock]:
        """Put the desktop back to the start of this session's task (or its initial state when it has none);
        answers the task's instruction and the screen."""
        desk, sid = desk_of(ctx), session_id(ctx)
        board.seen(sid, desk)
        return await guarded(_reset(desk, board.task_of(sid), board, sid))

    @_tool(server, "Evaluate")
    async def evaluate(ctx: DeskContext) -> list[ContentBlock]:
        """Say the task is done: it is scored now, for whoever grades this session. The score is not shown here
        (the agent's work is judged, never probed)."""
        desk, sid = desk_of(ctx), session_id(ctx)
        board.seen(sid, desk)

        async def work() -> list[ContentBlock]:
            e = await desk.call(lambda s: s.evaluate())
            session = desk.session
            replica = session.replica_id if session is not None else None
            with board.lock:
                task_id = board.started.get(sid)
            board.submit(Submission(sid, replica, task_id, time.time(), e))
            log.info("agent session %s submitted its task on %s", sid, replica)
            return [say("submitted: the task was scored for your grader (the score is not shown to the agent)")]

        return await guarded(work())


def _grader(server: FastMCP[Desk], board: Board, sessions: bool) -> None:
    @_tool(server, "Reset")
    async def reset(ctx: DeskContext, task_id: TaskId = None, task: TaskBody = None) -> list[ContentBlock]:
        """Put the desktop back to its initial state and, given a task, to that task's start; answers the task's
        instruction and the screen."""
        return await guarded(_reset(desk_of(ctx), _chosen(task_id, task)))

    @_tool(server, "Evaluate", read_only=True)
    async def evaluate(ctx: DeskContext) -> list[ContentBlock]:
        """Score the task the desktop was reset to, now: reward in [0, 1], success, and each criterion."""

        async def work() -> list[ContentBlock]:
            return [say(_scored(await desk_of(ctx).call(lambda s: s.evaluate())))]

        return await guarded(work())

    if not sessions:
        return

    @_tool(server, "Agent sessions", read_only=True, name="sessions")
    async def list_sessions(ctx: DeskContext) -> list[ContentBlock]:
        """The agent sessions of this server: each one's id, desktop, task and last submitted score."""
        with board.lock:
            ids = sorted(set(board.desks) | set(board.tasks) | set(board.submissions))[:MAX_SESSIONS_LISTED]
            rows = []
            for sid in ids:
                desk, sub = board.desks.get(sid), board.submissions.get(sid)
                session = desk.session if desk is not None else None
                rows.append(
                    {
                        "session": sid,
                        "replica_id": session.replica_id if session is not None else None,
                        "task": board.started.get(sid) or _task_id(board.tasks.get(sid, board.default_task)),
                        "submitted": None if sub is None else {"reward": sub.evaluation.reward, "at": sub.at},
                    }
                )
        return [say(json.dumps(rows, indent=1))]

    @_tool(server, "Assign a task")
    async def assign_task(
        ctx: DeskContext,
        session: Annotated[str, Field(min_length=1, max_length=200, description="the agent session's id")],
        task_id: TaskId = None,
        task: TaskBody = None,
    ) -> list[ContentBlock]:
        """The task an agent session's next ``reset()`` starts (its Mcp-Session-Id); none: the server's default."""
        chosen = _chosen(task_id, task)
        with board.lock:
            if chosen is None:
                board.tasks.pop(session, None)
            else:
                board.tasks[session] = chosen
        return [say(f"agent session {session}: its next reset starts {_task_id(chosen) or 'the default task'}")]

    @_tool(server, "Evaluate an agent session", read_only=True)
    async def evaluate_session(
        ctx: DeskContext,
        session: Annotated[str, Field(min_length=1, max_length=200, description="the agent session's id")],
    ) -> list[ContentBlock]:
        """Score an agent session's desktop now: reward, success and each criterion."""

        async def work() -> list[ContentBlock]:
            return [say(_scored(await board.desk(session).call(lambda s: s.evaluate())))]

        return await guarded(work())


def _task_id(task: TaskLike | None) -> str | None:
    if task is None or isinstance(task, str):
        return task
    if isinstance(task, Path):
        return str(task)
    found = task.get("id") if isinstance(task, dict) else getattr(task, "id", None)
    return str(found) if found is not None else "an inline task"


__all__ = ["GRADER_SESSION_TOOLS", "ROLES", "ROLE_TOOLS", "Board", "Role", "Submission", "install"]
