"""What a principal may ask of a guest beyond acting as its desktop user.

Agents act as the desktop user. Root in the guest is an operator's tool: an agent with root could rewrite
whatever a verifier reads in the guest (the files it compares, the commands' output, the verifier's own
tools), so a client's ``shell`` action with ``as_root`` — or an inline osfleet-format task whose set-up or
checks ask for root — is refused with 403 (``kind: forbidden``) unless the host was started with
``--allow-agent-root``. Built-in tasks (``task_id``) are the operator's and keep their root steps.
"""

from __future__ import annotations

from collections.abc import Sequence

from osfleet.api.auth import Principal
from osfleet.api.errors import Forbidden
from osfleet.config import AgentConfig
from osfleet.protocol.actions import Action, Shell
from osfleet.tasks.model import CommandOutput, Run, Task

ROOT_REFUSED = (
    "as_root is for the operator's token: a client's shell runs as the desktop user "
    "(a host started with --allow-agent-root lets clients run as root)"
)


def may_be_root(who: Principal, config: AgentConfig) -> bool:
    return who.operator or config.allow_agent_root


def refuse_root_actions(actions: Sequence[Action], who: Principal, config: AgentConfig) -> None:
    """403 for a batch with a root shell from a client, before any of it reaches the guest."""
    if not may_be_root(who, config) and any(isinstance(a, Shell) and a.as_root for a in actions):
        raise Forbidden(ROOT_REFUSED)


def refuse_root_task(task: Task | None, inline: bool, who: Principal, config: AgentConfig) -> None:
    """403 for a client's inline task whose set-up or checks would run as root in the guest."""
    if task is None or not inline or may_be_root(who, config):
        return
    root_steps = any(isinstance(s, Run) and s.as_root for s in [*task.setup, *task.postconfig])
    root_checks = any(isinstance(c.check, CommandOutput) and c.check.as_root for c in task.criteria)
    if root_steps or root_checks:
        raise Forbidden(f"task {task.id}: {ROOT_REFUSED}")
