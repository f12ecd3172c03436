"""Observe/act latency without VMs: stage timing, screen capture and encoding, the API's observation options
(formats, quality, Server-Timing, off the event loop) and ``osfleet bench step`` over a fake host."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import uvicorn
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from osfleet.api.app import create_app
from osfleet.api.models import StepRequest
from osfleet.bench import step as bench_step
from osfleet.config import AgentConfig
from osfleet.measure.timing import Stages, collecting, parse_server_timing, stage
from osfleet.protocol.models import DEFAULT_QUALITY
from osfleet.vm.screen import encode
from tests.conftest import free_port
from tests.fakes import FakeHost

# In-process, but seconds of waits and servers in sum: integration keeps the unit tier under 2 minutes.
pytestmark = pytest.mark.integration

TOKEN = "t"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


# --- stage timing ---------------------------------------------------------------------------------------------
def test_stages_add_up_per_name_and_render_as_server_timing() -> None:
    with collecting() as stages:
        with stage("capture"):
            time.sleep(0.01)
        with stage("encode"):
            pass
        with stage("capture"):
            time.sleep(0.01)
    assert list(stages.seconds) == ["capture", "encode"]
    assert stages.seconds["capture"] >= 0.02 and stages.total is not None and stages.total >= 0.02
    parsed = parse_server_timing(stages.header())
    assert list(parsed) == ["capture", "encode", "total"]
    assert parsed["capture"] == pytest.approx(stages.seconds["capture"], abs=0.0001)


def test_a_stage_outside_a_request_only_runs_its_block() -> None:
    ran = []
    with stage("capture"):
        ran.append(1)
    assert ran == [1]


def test_server_timing_header_parsing() -> None:
    s = Stages()
    s.add("act", 0.0123)
    assert s.header() == "act;dur=12.3"
    assert parse_server_timing('act;dur=12.5, cache;desc="hit", db;dur="3", bad;dur=x, total;dur=20') == {
        "act": 0.0125,
        "db": 0.003,
        "total": 0.02,
    }
    assert parse_server_timing(None) == {}


# --- encoding -------------------------------------------------------------------------------------------------
def _desktop() -> Image.Image:
    img = Image.new("RGB", (320, 200), (40, 90, 140))
    img.paste((250, 250, 250), (20, 20, 200, 150))  # a window
    for x in range(30, 190, 6):
        img.paste((0, 0, 0), (x, 40, x + 4, 48))  # text
    return img


def test_png_is_lossless_and_jpeg_webp_follow_quality() -> None:
    img = _desktop()
    png = Image.open(io.BytesIO(encode(img, "png")))
    assert png.format == "PNG" and png.convert("RGB").tobytes() == img.tobytes()
    for fmt, name in (("jpeg", "JPEG"), ("webp", "WEBP")):
        low, high = encode(img, fmt, 10), encode(img, fmt, 95)  # type: ignore[arg-type]
        assert len(low) < len(high)
        decoded = Image.open(io.BytesIO(high))
        assert decoded.format == name and decoded.size == img.size
    assert encode(img, "jpeg") == encode(img, "jpeg", DEFAULT_QUALITY)
    with pytest.raises(ValueError, match="quality 0"):
        encode(img, "jpeg", 0)
    with pytest.raises(ValueError, match="gif"):
        encode(img, "gif")  # type: ignore[arg-type]


# --- the API --------------------------------------------------------------------------------------------------
@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, FakeHost]]:
    host = FakeHost(tmp_path)
    with TestClient(create_app(AgentConfig(token=TOKEN), lambda: host)) as client:
        yield client, host


def _lease(client: TestClient) -> tuple[str, str]:
    r = client.post("/v1/leases", json={}, headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()["replica_id"], r.json()["lease_id"]


def _image(obs: dict[str, Any]) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(obs["screenshot"])))


def test_a_step_answers_in_the_asked_format_with_its_stages(api: tuple[TestClient, FakeHost]) -> None:
    client, host = api
    rid, lid = _lease(client)
    click = [{"type": "click", "x": 1, "y": 1}]
    plain = client.post(
        f"/v1/replicas/{rid}/step", json={"lease_id": lid, "action_id": "a", "actions": click}, headers=AUTH
    )
    assert plain.status_code == 200, plain.text
    obs = plain.json()["observation"]
    assert obs["format"] == "png" and obs["quality"] is None and _image(obs).format == "PNG"
    body = {
        "lease_id": lid,
        "action_id": "b",
        "actions": click,
        "observation_format": "webp",
        "observation_quality": 40,
    }
    r = client.post(f"/v1/replicas/{rid}/step", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    obs = r.json()["observation"]
    assert obs["format"] == "webp" and obs["quality"] == 40 and _image(obs).format == "WEBP"
    assert host.shots[-1] == ("webp", 40)
    stages = parse_server_timing(r.headers["server-timing"])
    assert {"persist", "encode", "total"} <= set(stages) and stages["total"] >= stages["persist"]
    jpeg = client.post(
        f"/v1/replicas/{rid}/step",
        json={**body, "action_id": "c", "observation_format": "jpeg", "observation_quality": None},
        headers=AUTH,
    ).json()["observation"]
    assert jpeg["format"] == "jpeg" and jpeg["quality"] == DEFAULT_QUALITY and _image(jpeg).format == "JPEG"
    # a retried step is replayed with a fresh observation in the format asked this time
    again = client.post(f"/v1/replicas/{rid}/step", json={**body, "observation_format": "jpeg"}, headers=AUTH)
    assert again.json()["replayed"] is True and again.json()["observation"]["format"] == "jpeg"


def test_observation_and_reset_take_format_and_quality(api: tuple[TestClient, FakeHost]) -> None:
    client, host = api
    rid, lid = _lease(client)
    r = client.get(
        f"/v1/replicas/{rid}/observation", params={"lease_id": lid, "format": "webp", "quality": 30}, headers=AUTH
    )
    assert r.status_code == 200 and r.json()["quality"] == 30 and _image(r.json()).format == "WEBP"
    assert "encode" in parse_server_timing(r.headers["server-timing"])
    reset = client.post(
        f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "observation_format": "jpeg"}, headers=AUTH
    ).json()
    assert _image(reset["observation"]).format == "JPEG" and host.shots[-1] == ("jpeg", None)


@pytest.mark.parametrize(
    "change",
    [
        {"observation_quality": 0},
        {"observation_quality": 101},
        {"observation_quality": "80"},
        {"observation_quality": True},
        {"observation_format": "gif"},
        {"observation_format": "JPEG"},
    ],
)
def test_bad_observation_options_are_refused_with_422(api: tuple[TestClient, FakeHost], change: dict[str, Any]) -> None:
    client, host = api
    rid, lid = _lease(client)
    body = {"lease_id": lid, "action_id": "a", "actions": [{"type": "wait", "seconds": 0}], **change}
    r = client.post(f"/v1/replicas/{rid}/step", json=body, headers=AUTH)
    assert r.status_code == 422 and r.json()["kind"] == "invalid_request", r.text
    assert host.applied == []  # refused before anything reached the guest


@pytest.mark.parametrize("params", [{"quality": 0}, {"quality": 101}, {"format": "bmp"}, {"quality": "high"}])
def test_bad_observation_query_is_refused_with_422(api: tuple[TestClient, FakeHost], params: dict[str, Any]) -> None:
    client, _ = api
    rid, lid = _lease(client)
    r = client.get(f"/v1/replicas/{rid}/observation", params={"lease_id": lid, **params}, headers=AUTH)
    assert r.status_code == 422 and r.json()["kind"] == "invalid_request", r.text


def test_capture_and_encoding_run_in_a_worker_thread_not_on_the_event_loop(
    api: tuple[TestClient, FakeHost], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, host = api
    seen: list[bool] = []
    real = host.screenshot

    def screenshot(rid: str, fmt: Any = "png", quality: int | None = None, claim: Any = None) -> bytes:
        try:
            asyncio.get_running_loop()
            seen.append(True)
        except RuntimeError:  # no event loop runs in this thread
            seen.append(False)
        return real(rid, fmt, quality, claim=claim)

    monkeypatch.setattr(host, "screenshot", screenshot)
    rid, lid = _lease(client)
    client.post(
        f"/v1/replicas/{rid}/step",
        json={"lease_id": lid, "action_id": "a", "actions": [{"type": "wait", "seconds": 0}]},
        headers=AUTH,
    )
    client.get(f"/v1/replicas/{rid}/observation", params={"lease_id": lid, "format": "jpeg"}, headers=AUTH)
    assert seen == [False, False]


def test_the_openapi_documents_the_options_with_their_bounds(api: tuple[TestClient, FakeHost]) -> None:
    client, _ = api
    schema = client.get("/openapi.json").json()
    props = schema["components"]["schemas"]["StepRequest"]["properties"]
    quality = next(x for x in props["observation_quality"]["anyOf"] if x.get("type") == "integer")
    assert (quality["minimum"], quality["maximum"]) == (1, 100)
    assert props["observation_format"]["enum"] == ["png", "jpeg", "webp"]
    assert "observation_quality" in schema["components"]["schemas"]["ResetRequest"]["properties"]
    params = {p["name"]: p for p in schema["paths"]["/v1/replicas/{rid}/observation"]["get"]["parameters"]}
    assert params["format"]["schema"]["enum"] == ["png", "jpeg", "webp"] and "quality" in params


def _schema_strategy(path: str, method: str) -> st.SearchStrategy[Any]:
    app = create_app(AgentConfig(token=TOKEN), lambda: FakeHost(Path("/nonexistent")))
    return schemathesis.openapi.from_dict(app.openapi())[path][method].as_strategy()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=_schema_strategy("/v1/replicas/{rid}/step", "POST"))
def test_every_schema_valid_step_body_is_taken_as_json(case: Any) -> None:
    req = StepRequest.model_validate_json(json.dumps(case.body))
    assert req.observation_quality is None or 1 <= req.observation_quality <= 100


# --- osfleet bench step ---------------------------------------------------------------------------------------
def test_step_body_stays_plain_for_png_so_older_agents_take_it() -> None:
    body = bench_step.step_body("l", 3, "png", None)
    assert "observation_format" not in body and body["actions"][0]["type"] == "click"
    assert bench_step.step_body("l", 3, "webp", 60)["observation_quality"] == 60


def test_summarize_takes_p50_per_stage_and_the_http_remainder() -> None:
    rounds = [
        {"seconds": 0.100, "bytes": 10, "stages": {"act": 0.02, "capture": 0.03, "encode": 0.01, "total": 0.07}},
        {"seconds": 0.120, "bytes": 30, "stages": {"act": 0.04, "capture": 0.05, "encode": 0.01, "total": 0.11}},
        {"seconds": 0.200, "bytes": 20, "stages": {"act": 0.03, "capture": 0.04, "encode": 0.03, "total": 0.15}},
    ]
    s = bench_step.summarize(rounds)
    assert s["n"] == 3 and s["p50"] == pytest.approx(0.12) and s["bytes_p50"] == 20
    assert s["stages_p50_seconds"] == pytest.approx(
        {"act": 0.03, "capture": 0.04, "encode": 0.01, "http": 0.03}  # http: 0.03, 0.01, 0.05
    )
    assert "stages_p50_seconds" not in bench_step.summarize([{"seconds": 0.5, "bytes": 1, "stages": {}}])


def test_bench_step_runs_through_a_real_http_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_step, "SETTLE_SECONDS", 0.0)  # this machine may be busy: one short CPU sample
    monkeypatch.setattr(bench_step, "SETTLE_SAMPLE_SECONDS", 0.1)
    host = FakeHost(tmp_path / "home", ready=2)
    port = free_port()
    app = create_app(AgentConfig(token=TOKEN), lambda: host)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        result = bench_step.run(
            tmp_path / "run",
            4,
            ["png", "webp"],
            50,
            url=f"http://127.0.0.1:{port}",
            token=TOKEN,
            say=lambda _: None,
            clients=2,
        )
    finally:
        server.should_exit = True
        thread.join(10)
    assert set(result["formats"]) == {"png", "webp"} and result["formats"]["webp"]["n"] == 2 * 4
    assert {"persist", "encode", "http"} <= set(result["formats"]["webp"]["stages_p50_seconds"])
    assert result["p50_seconds"] == result["formats"][result["best_format"]]["p50"]
    assert isinstance(result["goal_met"], bool) and 0 <= result["host_cpu_busy_share_before"] <= 1
    assert len(host.applied) == 2 * 2 * (4 + bench_step.WARMUP_ROUNDS) and host.shots[-1] == ("webp", 50)
    assert {rid for rid, _ in host.applied} == {r.id for r in host.replicas()}  # one replica per client
    assert all(r.lease is None for r in host.replicas())  # released at the end
    assert "p50" in bench_step.table(result)
