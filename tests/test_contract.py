"""The published OpenAPI is the truth: what its request schemas allow, the server runs.

Bodies are generated from the app's own schema by schemathesis (the tool ../shared/acceptance/api-contract
runs against a live agent) and fed to the server's parsers; none may be refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from osfleet.api.app import create_app
from osfleet.api.models import OsgymReset, ResetRequest
from osfleet.config import AgentConfig
from osfleet.tasks.osworld import OsworldTask, from_osworld
from tests.fakes import FakeHost


def _strategy(path: str, method: str) -> st.SearchStrategy[Any]:
    app = create_app(AgentConfig(token="t"), lambda: FakeHost(Path("/nonexistent")))
    schema = schemathesis.openapi.from_dict(app.openapi())
    return schema[path][method].as_strategy()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=_strategy("/reset", "POST"))
def test_every_schema_valid_osgym_task_config_is_run(case: Any) -> None:
    body = OsgymReset.model_validate(case.body)
    task = from_osworld(body.task_config)
    assert task.criteria and task.source == "osworld"


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=_strategy("/v1/replicas/{rid}/reset", "POST"))
def test_every_schema_valid_inline_task_is_run(case: Any) -> None:
    req = ResetRequest.model_validate(case.body)
    if isinstance(req.task, OsworldTask):
        from_osworld(req.task)
