"""osfleet's task format, as a client sends it inline and the host agent runs it, and an evaluation's result.

A verifier is a list of criteria, each a check run in the guest (code, not a model) with a weight and a
required flag: reward = weighted share of criteria met, success = every required criterion met. Parts made only
by the OSWorld converter on the host (``PutFile``, ``GuestQuery``, ``OsworldCheck``, ``DeclaredInfeasible``) are
models here too, so one ``Task`` type serves both, but they are left out of the published schema.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from osfleet.protocol.actions import Action
from osfleet.protocol.wire import JsonInt


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Run(_M):
    """Run a shell command as the desktop user (or root) and wait for it."""

    type: Literal["run"]
    command: str
    as_root: bool = False
    timeout: float = Field(30.0, gt=0, le=600)
    # Made by the OSWorld converter only (not published): OSWorld's server reports a command's exit code but its
    # set-up goes on whatever it is, and ``stdout``/``stderr`` keep the output as files of the task's cache.
    ignore_exit: SkipJsonSchema[bool] = False
    stdout_to: SkipJsonSchema[str | None] = None
    stderr_to: SkipJsonSchema[str | None] = None
    # OSWorld's screen placeholders ({SCREEN_WIDTH_HALF}...) are in the command, filled from the replica's screen
    # when the step runs (osfleet.tasks.osworld_format.guest_paths.fill_screen).
    fill_screen: SkipJsonSchema[bool] = False


class Launch(_M):
    """Start a program in the background on the desktop (it keeps running)."""

    type: Literal["launch"]
    command: str
    fill_screen: SkipJsonSchema[bool] = False  # as for Run (made by the OSWorld converter only)
    # OSWorld's launch of google-chrome, which gets --proxy-server when the task runs behind the host's proxy.
    chrome: SkipJsonSchema[bool] = False


class Sleep(_M):
    type: Literal["sleep"]
    seconds: float = Field(ge=0, le=120)


class PutFile(_M):
    """Write a file from the host's asset store into the guest (OSWorld's ``download``, resolved offline).

    Made only by the OSWorld converter, after the URL was found in the store; not part of the published
    osfleet task format."""

    type: Literal["put_file"]
    path: str = Field(pattern=r"^/[^\x00]*$")
    url: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class GuestQuery(_M):
    """An OSWorld set-up step that works on the running desktop (Chrome's tabs through its DevTools protocol,
    its history database), run by osfleet's query script in the guest (osfleet.tasks.osworld_format.guest_query).

    Made only by the OSWorld converter; not part of the published osfleet task format."""

    type: Literal["guest_query"]
    op: str
    args: dict[str, Any] = {}


SetupStep = Annotated[
    Run | Launch | Sleep | SkipJsonSchema[PutFile] | SkipJsonSchema[GuestQuery], Field(discriminator="type")
]


def _pattern(regex: str) -> re.Pattern[str]:
    try:
        return re.compile(regex, re.MULTILINE)
    except re.error:
        return re.compile(re.escape(regex), re.MULTILINE)


class Match(_M):
    """How a text is compared: exactly (after stripping trailing whitespace), by inclusion, or by regex."""

    # The published schema says what the validator below checks: at least one of them, given for real.
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "anyOf": [
                {"required": ["equals"], "properties": {"equals": {"type": "string"}}},
                {"required": ["include"], "properties": {"include": {"minItems": 1}}},
                {"required": ["exclude"], "properties": {"exclude": {"minItems": 1}}},
                {"required": ["regex"], "properties": {"regex": {"type": "string"}}},
            ]
        },
    )

    equals: str | None = None
    include: list[str] = []
    exclude: list[str] = []
    regex: str | None = Field(
        None,
        description="a Python regular expression searched in multi-line mode; one that does not compile is "
        "searched for as plain text (JSON Schema cannot tell which strings compile, so none is refused)",
    )

    def check(self, text: str) -> bool:
        if self.equals is not None and text.rstrip() != self.equals.rstrip():
            return False
        if any(s not in text for s in self.include) or any(s in text for s in self.exclude):
            return False
        return not (self.regex is not None and _pattern(self.regex).search(text) is None)

    @model_validator(mode="after")
    def _something(self) -> Match:
        if self.equals is None and not self.include and not self.exclude and self.regex is None:
            raise ValueError("a match needs equals, include, exclude or regex")
        return self


class CommandOutput(_M):
    """A command's standard output (and optionally its exit code) in the guest."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "anyOf": [
                {"required": ["match"], "properties": {"match": {"type": "object"}}},
                {"required": ["exit_code"], "properties": {"exit_code": {"type": "integer"}}},
            ]
        },
    )

    type: Literal["command_output"]
    command: str
    as_root: bool = False
    match: Match | None = None
    exit_code: JsonInt | None = None

    @model_validator(mode="after")
    def _something(self) -> CommandOutput:
        if self.match is None and self.exit_code is None:
            raise ValueError("command_output needs match or exit_code")
        return self


class FileContent(_M):
    """A file in the guest: it must exist and match, or (``absent``) must not exist."""

    type: Literal["file_content"]
    path: str = Field(pattern=r"^/[^\x00]*$")
    match: Match | None = None
    absent: bool = False


class OsworldCheck(_M):
    """One OSWorld evaluator function with its getters, scored on the host (osfleet.tasks.osworld_format.metrics) on
    files and outputs fetched from the guest. Made only by the OSWorld converter (not published)."""

    type: Literal["osworld"]
    func: str
    result: dict[str, Any]
    expected: dict[str, Any] | None = None
    options: dict[str, Any] = {}


class DeclaredInfeasible(_M):
    """OSWorld's ``infeasible`` evaluator: met when the agent's last action declared the task impossible (a
    ``terminate`` action with status ``failure``, or OSWorld's ``FAIL`` through OSGym). Made by the converter."""

    type: Literal["declared_infeasible"]


Check = Annotated[
    CommandOutput | FileContent | SkipJsonSchema[OsworldCheck] | SkipJsonSchema[DeclaredInfeasible],
    Field(discriminator="type"),
]


class Criterion(_M):
    name: str
    check: Check
    weight: float = Field(1.0, gt=0, allow_inf_nan=False)  # finite: a reward is a weighted share in [0, 1]
    required: bool = True


class OsworldScoring(_M):
    """How OSWorld turns its metrics into one score: ``and`` is 0 as soon as one metric is 0, else their mean;
    ``or`` is 1 as soon as one is 1, else their maximum; and an agent that declared the task infeasible scores 0
    unless the task is one (then that declaration is the whole check)."""

    conj: Literal["and", "or"] = "and"


class Task(_M):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,80}$")
    instruction: str = Field(min_length=1)
    kind: Literal["gui", "cli", "mixed"] = "mixed"
    setup: list[SetupStep] = []
    criteria: list[Criterion] = Field(min_length=1)
    oracle: list[Action] = []
    source: str = "osfleet"
    # OSWorld's post-config: steps run before every evaluation (e.g. save the document); not published.
    postconfig: SkipJsonSchema[list[SetupStep]] = []
    # OSWorld's scoring, for tasks converted from its format (not published): see OsworldScoring.
    osworld: SkipJsonSchema[OsworldScoring | None] = None
    # OSWorld's "proxy": the task's sites block data-centre addresses, so OSWorld runs it behind a proxy; osfleet
    # sets the guest up for the host's --replica-network proxy=URL when there is one (runner.proxy_steps).
    needs_proxy: SkipJsonSchema[bool] = False


class CriterionResult(BaseModel):
    name: str
    met: bool
    weight: float
    required: bool
    detail: str = ""
    score: float | None = Field(None, description="an OSWorld metric's own value in [0, 1] (met when it is 1)")


class Evaluation(BaseModel):
    reward: float
    success: bool
    criteria: list[CriterionResult]
