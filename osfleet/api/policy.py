"""What a principal may ask of a guest beyond acting as its desktop user: the client task policy.

Agents act as the desktop user. Root in the guest is an operator's tool: an agent with root could rewrite
whatever a verifier reads in the guest (the files it compares, the commands' output, the verifier's own
tools), so a client's ``shell`` action with ``as_root`` is refused with 403 (``kind: forbidden``), and so is
a client's inline task (either format, through ``/v1/.../reset`` or OSGym's ``/reset``) with a step or a getter
that would act with more than the desktop user's rights, each named in the reason:

- a set-up or post-config command, or an osfleet check, that runs as root;
- a ``download`` (or any file put into the guest) outside the desktop user's home or ``/tmp``: those are
  written as root; inside them, as the user (``osfleet.tasks.osworld_format.guest_writes``);
- an ``execute`` step whose ``stdout``/``stderr`` file name is not a plain name (the task cache is root's);
- a getter that reads a file through the guest agent, which reads as root (``vm_file``, ``vscode_config``,
  ``gimp_config_file``, ``cache_file``), outside the user's home, ``/tmp`` or the task's own cache.

Host-side code execution does not appear here because there is none to allow: every metric, including
``check_python_file_by_test_suite`` which imports the agent's code, runs in the evaluation jail
(``osfleet.tasks.jail``) for everyone. ``osfleet host serve --allow-agent-root`` lets clients have all of the
above (a host whose clients are all trusted). Built-in tasks (``task_id``) are the operator's and keep their root
steps. OSGym callers let in by address (``--osgym-allow``) are clients like any other (``ip:<address>``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Sequence
from typing import Any

from osfleet.api.auth import Principal
from osfleet.api.errors import Forbidden
from osfleet.config import AgentConfig
from osfleet.protocol.actions import Action, Shell
from osfleet.replicas.actions import GUEST_USER
from osfleet.tasks.model import CommandOutput, OsworldCheck, PutFile, Run, Task, TaskError, find_task
from osfleet.tasks.osworld_format.guest_writes import CACHE_DIR

ROOT_REFUSED = (
    "as_root is for the operator's token: a client's shell runs as the desktop user "
    "(a host started with --allow-agent-root lets clients run as root)"
)


def may_be_root(who: Principal, config: AgentConfig) -> bool:
    return who.operator or config.allow_agent_root


def reads_as_root(task: Task, who: Principal, config: AgentConfig) -> bool:
    """Whether ``task``'s checks may read the guest as root when ``who`` evaluates it: the operator, a host whose
    clients may be root (``--allow-agent-root``), or a built-in task as it ships (the operator's, whoever resets to
    it). Any other task is a client's own, and every check and getter of it reads as the desktop user
    (``osfleet.tasks.runner.evaluate``'s ``as_user``): a ``file_content`` check of ``/etc/shadow`` is unmet, saying
    the user may not read it, and nothing of the file."""
    if may_be_root(who, config):
        return True
    try:
        return find_task(task.id) == task
    except TaskError:
        return False


def refuse_root_actions(actions: Sequence[Action], who: Principal, config: AgentConfig) -> None:
    """403 for a batch with a root shell from a client, before any of it reaches the guest."""
    if not may_be_root(who, config) and any(isinstance(a, Shell) and a.as_root for a in actions):
        raise Forbidden(ROOT_REFUSED)


USER_AREAS = (f"/home/{GUEST_USER}", "/tmp")  # where a client's task may put or read files (as the user can)
FILE_GETTERS = {"vm_file": "path", "vscode_config": "path"}  # getters that read these paths as root
NAMED_GETTERS = {"gimp_config_file": "file_name", "cache_file": "path"}  # a name within a fixed root-owned folder


def within_user_reach(path: str) -> bool:
    """``path``, made normal (``..`` resolved as the guest would before any link), is in the user's home or /tmp."""
    norm = posixpath.normpath(path)
    return norm.startswith("/") and any(norm == area or norm.startswith(area + "/") for area in USER_AREAS)


def inside_folder(name: str) -> bool:
    """``name`` stays inside whatever folder it is joined to: relative, no ``..``, no NUL."""
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and "\x00" not in name and ".." not in parts


def refuse_root_task(task: Task | None, inline: bool, who: Principal, config: AgentConfig) -> None:
    """403 for a client's inline task with a step or a getter that acts with more than the desktop user's rights
    in the guest (the module docstring lists them), naming the first."""
    if task is None or not inline or may_be_root(who, config):
        return
    problem = next(_root_parts(task), None)
    if problem:
        raise Forbidden(
            f"task {task.id}: {problem}: a client's task acts as the desktop user (a host started with "
            "--allow-agent-root lets clients have root in the guest)"
        )


def _root_parts(task: Task) -> Iterator[str]:
    for where, steps in (("set-up", task.setup), ("post-config", task.postconfig)):
        for i, step in enumerate(steps, 1):
            if isinstance(step, Run) and step.as_root:
                yield f"{where} step {i} runs as root (as_root)"
            if isinstance(step, PutFile) and not within_user_reach(step.path):
                yield f"{where} step {i} (download to {step.path}) would write as root outside the user's home and /tmp"
            if isinstance(step, Run):
                for name in (step.stdout_to, step.stderr_to):
                    if name is not None and not inside_folder(name):
                        yield f"{where} step {i} keeps its output as {name!r}, outside the task cache"
    for c in task.criteria:
        if isinstance(c.check, CommandOutput) and c.check.as_root:
            yield f"check {c.name!r} runs as root (as_root)"
        if isinstance(c.check, OsworldCheck):
            for key in ("result", "expected"):
                spec = getattr(c.check, key)
                if isinstance(spec, dict):
                    yield from (f"criterion {c.name!r} {key}: {p}" for p in _getter_problems(spec))


def _getter_problems(spec: dict[str, Any]) -> Iterator[str]:
    kind = spec.get("type")
    if kind in FILE_GETTERS:
        value = spec.get(FILE_GETTERS[kind])
        for path in value if isinstance(value, list) else [value]:
            if not isinstance(path, str) or not within_user_reach(path):
                yield f"getter {kind} would read {path!r} as root, outside the user's home and /tmp"
    if kind in NAMED_GETTERS:
        name = spec.get(NAMED_GETTERS[kind])
        if not isinstance(name, str) or not inside_folder(name):
            where = CACHE_DIR if kind == "cache_file" else "its folder"
            yield f"getter {kind} names {name!r}, outside {where}"
