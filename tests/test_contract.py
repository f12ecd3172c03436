"""The published OpenAPI is the truth: what its request schemas allow, the server runs.

Bodies are generated from the app's own schema by schemathesis (the tool that also checks a live agent's contract)
and fed to the server's parsers; none may be refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from osfleet.api.app import create_app
from osfleet.api.models import OsgymReset, ResetRequest
from osfleet.api.routes.episodes import task_from
from osfleet.config import AgentConfig
from osfleet.tasks.model import Task
from osfleet.tasks.osworld_format.convert import OsworldTask, from_osworld
from tests.fakes import FakeHost

# In-process, but seconds of waits and servers in sum: integration keeps the unit tier under 2 minutes.
pytestmark = pytest.mark.integration


def _strategy(path: str, method: str, inline_task: bool = False) -> st.SearchStrategy[Any]:
    """Bodies of ``method path`` from the published schema; ``inline_task``: every reset body has an inline
    task (left to itself, the generator sends one in about one body of forty)."""
    app = create_app(AgentConfig(token="t"), lambda: FakeHost(Path("/nonexistent")))
    spec = app.openapi()
    if inline_task:
        reset = spec["components"]["schemas"]["ResetRequest"]
        reset["required"] = [*reset.get("required", []), "task"]
        reset["properties"].pop("task_id")
        reset["properties"]["task"] = {k: v for k, v in reset["properties"]["task"].items() if k != "default"}
        reset["properties"]["task"]["anyOf"] = [
            x for x in reset["properties"]["task"]["anyOf"] if x != {"type": "null"}
        ]
    schema = schemathesis.openapi.from_dict(spec)
    return schema[path][method].as_strategy()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=_strategy("/reset", "POST"))
def test_every_schema_valid_osgym_task_config_is_run(case: Any) -> None:
    body = OsgymReset.model_validate(case.body)
    task = from_osworld(body.task_config)
    assert task.criteria and task.source == "osworld"


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=_strategy("/v1/replicas/{rid}/reset", "POST", inline_task=True))
def test_every_schema_valid_inline_task_is_run(case: Any) -> None:
    req = ResetRequest.model_validate(case.body)
    assert req.task is not None and req.task_id is None
    task = task_from(req)  # what the reset route runs
    assert isinstance(task, Task) and task.criteria and task.instruction
    assert task.source == ("osworld" if isinstance(req.task, OsworldTask) else req.task.source)
