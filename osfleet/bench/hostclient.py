"""``osfleet bench hostclient``: the gateway's own HTTP/1.1 client against aiohttp (C parser) on the same calls.

Why this exists: ``osfleet/fleet/hostclient.py`` is hand-written protocol parsing, kept only while it is
measurably cheaper than a well-kept library. This bench is the measurement (and ``tests/test_hostclient.py``
runs a short one as a guard).

Method, as ``osfleet bench chaos``'s gateway overhead: a stand-in host agent (uvicorn, in a process of its own,
answering a step like a host does and a ~300 KB observation) is called by both clients over kept-alive
connections, one call of each per round, the order swapped every round, the first rounds (new connections, TLS
handshakes, first-use costs) not counted. For each call the client's own CPU (``time.thread_time`` of the event
loop's thread: the server runs elsewhere, so nothing else is counted) and its wall time are recorded; the
figures are p50s and the p50 of per-round differences (aiohttp minus ours), which a slow spell of the busy
machine weighs on both clients of a round instead of on one. Run over plain HTTP and over TLS 1.3.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from osfleet.errors import OsfleetError
from osfleet.measure.stats import percentile

ROUNDS = 300
WARMUP = 20
OBSERVATION_BYTES = 300_000  # a base64 PNG of a 1280x800 desktop is a few hundred kilobytes
STEP = {"lease_id": "l-1", "action_id": "a-1", "actions": [{"type": "wait", "seconds": 0}], "observe": False}
START_SECONDS = 30.0

Call = Callable[[str, str, Any], Awaitable[tuple[int, bytes]]]


def stub_app() -> FastAPI:
    """The stand-in host: a step answered as a host agent answers it, and an observation-sized body."""
    app = FastAPI()
    observation = json.dumps({"screenshot": "A" * OBSERVATION_BYTES, "format": "png"}).encode()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/replicas/{rid}/step")
    async def step(rid: str, request: Request) -> JSONResponse:
        body = await request.json()
        answer = {"action_id": body["action_id"], "replayed": False, "done": False, "results": [], "observation": None}
        return JSONResponse(answer)

    @app.get("/v1/replicas/{rid}/observation")
    def observe(rid: str) -> Response:
        return Response(observation, media_type="application/json")

    return app


def serve_stub(port: int, cert: str | None = None, key: str | None = None) -> None:
    """Run the stand-in host until killed (the child process of ``stub_host``)."""
    import uvicorn

    from osfleet.tls import Listener

    listener = Listener(Path(cert), Path(key)) if cert and key else Listener()
    uvicorn.run(stub_app(), host="127.0.0.1", port=port, log_level="error", **listener.uvicorn_options())


@contextmanager
def stub_host(tls: bool) -> Iterator[tuple[str, Path | None]]:
    """(URL, its CA file or None) of a stand-in host in a child process (over TLS with a certificate made for
    it); stopped afterwards."""
    from osfleet.tls import client_context, issue, make_ca

    with tempfile.TemporaryDirectory(prefix="osfleet-bench-hostclient-") as tmp:
        args = []
        ctx = None
        if tls:
            ca = make_ca("osfleet bench CA")
            leaf = issue(ca, ["127.0.0.1"])
            for name, text in (("ca.pem", ca.cert_pem), ("cert.pem", leaf.cert_pem), ("key.pem", leaf.key_pem)):
                Path(tmp, name).write_text(text)
            args = [f"{tmp}/cert.pem", f"{tmp}/key.pem"]
            ctx = client_context(Path(tmp, "ca.pem"))
        port = _free_port()
        code = f"from osfleet.bench.hostclient import serve_stub; serve_stub({port}, *{args!r})"
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        try:
            _wait(url, ctx, proc)
            yield url, Path(tmp, "ca.pem") if tls else None
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr:
                proc.stderr.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, ctx: ssl.SSLContext | None, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-300:] if proc.stderr else ""
            raise OsfleetError(f"the stand-in host exited with {proc.returncode}: {err}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2, context=ctx):
                return
        except OSError:
            time.sleep(0.1)
    raise OsfleetError(f"the stand-in host did not answer within {START_SECONDS:.0f} s")


def _aiohttp() -> Any:
    try:
        import aiohttp
    except ImportError:
        raise OsfleetError("the bench compares with aiohttp, not installed here: pip install 'osfleet[dev]'") from None
    return aiohttp


async def _compare(url: str, ca_file: Path | None, rounds: int, warmup: int) -> dict[str, Any]:
    from osfleet.fleet.hostclient import HostClient
    from osfleet.tls import client_context

    aiohttp = _aiohttp()
    ours = HostClient()
    ours.verify_with(url, ca_file)
    ctx = client_context(ca_file) if ca_file else None
    connector = aiohttp.TCPConnector(limit_per_host=256, keepalive_timeout=4, ssl=ctx if ctx is not None else True)
    session = aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
        timeout=aiohttp.ClientTimeout(total=30),
    )

    async def via_ours(method: str, path: str, body: Any) -> tuple[int, bytes]:
        r = await ours.request(method, url + path, json=body, headers={"Authorization": "Bearer t"}, timeout=30)
        return r.status_code, r.content

    async def via_aiohttp(method: str, path: str, body: Any) -> tuple[int, bytes]:
        headers = {"Authorization": "Bearer t"}
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        async with session.request(method, url + path, data=data, headers=headers) as r:
            return r.status, await r.read()

    out: dict[str, Any] = {}
    try:
        for name, method, path, body in (
            ("step", "POST", "/v1/replicas/r-1/step", STEP),
            ("observation", "GET", "/v1/replicas/r-1/observation", None),
        ):
            ways: list[tuple[str, Call]] = [("ours", via_ours), ("aiohttp", via_aiohttp)]
            out[name] = await _rounds(ways, method, path, body, rounds, warmup)
    finally:
        await ours.aclose()
        await session.close()
    return out


async def _rounds(
    ways: list[tuple[str, Call]], method: str, path: str, body: Any, rounds: int, warmup: int
) -> dict[str, Any]:
    wall: dict[str, list[float]] = {k: [] for k, _ in ways}
    cpu: dict[str, list[float]] = {k: [] for k, _ in ways}
    sizes = set()
    for i in range(warmup + rounds):
        for key, call in ways if i % 2 == 0 else ways[::-1]:
            t, c = time.perf_counter(), time.thread_time()
            status, content = await call(method, path, body)
            dc, dt = time.thread_time() - c, time.perf_counter() - t
            if status != 200:
                raise OsfleetError(f"the stand-in host answered {status} to {key}'s {method} {path}")
            sizes.add(len(content))
            if i >= warmup:
                wall[key].append(dt)
                cpu[key].append(dc)
    if len(sizes) != 1:
        raise OsfleetError(f"the two clients read different bodies for {method} {path}: {sorted(sizes)} bytes")
    ms = 1000.0
    result: dict[str, Any] = {"body_bytes": sizes.pop()}
    for key in wall:
        result[f"{key}_cpu_p50_ms"] = round(percentile(cpu[key], 50) * ms, 4)
        result[f"{key}_wall_p50_ms"] = round(percentile(wall[key], 50) * ms, 4)
    cpu_added = [a - o for o, a in zip(cpu["ours"], cpu["aiohttp"], strict=True)]
    wall_added = [a - o for o, a in zip(wall["ours"], wall["aiohttp"], strict=True)]
    result["aiohttp_minus_ours_cpu_p50_ms"] = round(percentile(cpu_added, 50) * ms, 4)
    result["aiohttp_minus_ours_wall_p50_ms"] = round(percentile(wall_added, 50) * ms, 4)
    result["aiohttp_minus_ours_wall_iqr_ms"] = round((percentile(wall_added, 75) - percentile(wall_added, 25)) * ms, 4)
    result["cpu_ratio"] = round(result["aiohttp_cpu_p50_ms"] / max(result["ours_cpu_p50_ms"], 1e-9), 2)
    return result


def run(rounds: int = ROUNDS, warmup: int = WARMUP, tls: tuple[bool, ...] = (False, True)) -> dict[str, Any]:
    """Both clients on the same calls, over plain HTTP and over TLS; see the module docstring."""
    from osfleet.measure.host_facts import describe

    _aiohttp()  # fail before starting anything when it is missing

    result: dict[str, Any] = {"rounds": rounds, "warmup_rounds": warmup, "machine": describe()}
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    for secure in tls:
        with stub_host(secure) as (url, ca_file):
            result["https" if secure else "http"] = asyncio.run(_compare(url, ca_file, rounds, warmup))
    return result


def summary(result: dict[str, Any]) -> str:
    lines = [f"{result['rounds']} rounds (+{result['warmup_rounds']} uncounted), load {result['load_average']}"]
    for scheme in ("http", "https"):
        for call, r in (result.get(scheme) or {}).items():
            lines.append(
                f"{scheme:>5} {call:<11} CPU p50 ours {r['ours_cpu_p50_ms']:.3f} ms, aiohttp "
                f"{r['aiohttp_cpu_p50_ms']:.3f} ms (x{r['cpu_ratio']}); wall p50 ours {r['ours_wall_p50_ms']:.3f} ms, "
                f"aiohttp {r['aiohttp_wall_p50_ms']:.3f} ms; per round aiohttp - ours: "
                f"{r['aiohttp_minus_ours_wall_p50_ms']:+.3f} ms"
            )
    return "\n".join(lines)
