"""E2B's control plane (the REST API behind ``E2B_API_URL``) over the fleet: sandboxes created, listed, told about,
timed, paused, resumed, forked and killed.

Requests and answers are parsed and written with the ``e2b`` wheel's own generated models (``NewSandboxV2``,
``Sandbox``, ``SandboxDetail``, ``ListedSandbox``, ...), so the JSON is what E2B's SDKs send and read. The key is
``X-API-KEY`` (a client token of the fleet, ``SandboxBook.check_key``); every refusal is E2B's error body
``{"code", "message"}`` with its status: 400 for what this server cannot do as asked (internet access, volumes, an
MCP gateway: desktops have no network unless their operator opts in), 401, 404, 409, 429, 503.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Awaitable, Callable
from typing import Any

from e2b.api.client.models import (
    ConnectSandboxV2,
    ListedSandbox,
    NewSandboxV2,
    ResumedSandbox,
    SandboxDetail,
    SandboxForkRequest,
    SandboxForkResult,
    SandboxState,
    SandboxTimeoutRequest,
)
from e2b.api.client.models import Sandbox as SandboxModel
from e2b.api.client.types import Unset
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from osfleet.e2b.envd import ENVD_VERSION, error_response
from osfleet.e2b.errors import E2BError
from osfleet.e2b.sandboxes import Sandbox, SandboxBook

CLIENT_ID = "osfleet"
MAX_BODY = 1 * 2**20  # bytes of a control-plane request body
MAX_LIST = 1000  # sandboxes one list page holds at most
MAX_FORKS = 8  # children one fork call may ask for (the fleet bounds them too)
Handler = Callable[[SandboxBook, Request], Awaitable[Response]]


def _when(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)


def created(sandbox: Sandbox) -> dict[str, Any]:
    """What creating (or connecting to, or forking into) a sandbox answers: its id and its daemon's token."""
    model = SandboxModel(
        template_id=sandbox.template,
        sandbox_id=sandbox.id,
        client_id=CLIENT_ID,
        envd_version=ENVD_VERSION,
        envd_access_token=sandbox.access_token,
    )
    return model.to_dict()


def _described(sandbox: Sandbox) -> dict[str, Any]:
    """What ``GET /sandboxes/{id}`` and a list say of a sandbox alike: cpu, memory and disk are 0, which this server
    does not know of a replica."""
    return {
        "template_id": sandbox.template,
        "sandbox_id": sandbox.id,
        "client_id": CLIENT_ID,
        "started_at": _when(sandbox.started_at),
        "end_at": _when(sandbox.end_at),
        "envd_version": ENVD_VERSION,
        "cpu_count": 0,
        "memory_mb": 0,
        "disk_size_mb": 0,
        "state": SandboxState.PAUSED if sandbox.paused else SandboxState.RUNNING,
        "metadata": sandbox.metadata,
    }


def detail(sandbox: Sandbox) -> dict[str, Any]:
    return SandboxDetail(**_described(sandbox), envd_access_token=sandbox.access_token).to_dict()


def listed(sandbox: Sandbox) -> dict[str, Any]:
    return ListedSandbox(**_described(sandbox)).to_dict()


async def body_of(request: Request) -> dict[str, Any]:
    """The request's JSON object (``{}`` for an empty body); 400 for anything else, 413 past ``MAX_BODY``."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_BODY:
        raise E2BError(413, f"a request body is at most {MAX_BODY} bytes")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise E2BError(413, f"a request body is at most {MAX_BODY} bytes")
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise E2BError(400, "the body is not JSON") from None
    if not isinstance(value, dict):
        raise E2BError(400, "the body is not a JSON object")
    return value


def _parsed(model: Any, body: dict[str, Any]) -> Any:
    try:
        return model.from_dict(body)
    except (KeyError, TypeError, ValueError) as exc:
        raise E2BError(400, f"the body is not E2B's {model.__name__}: {exc!r}"[:300]) from None


def _int(value: object, what: str) -> int | None:
    if isinstance(value, Unset) or value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise E2BError(400, f"{what} is a whole number of seconds")
    return value


def _strings(value: object, what: str) -> dict[str, str]:
    if isinstance(value, Unset) or value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise E2BError(400, f"{what} maps names to strings")
    return dict(value)


def _unsupported(new: NewSandboxV2, body: dict[str, Any]) -> str | None:
    """What of a creation this server cannot do, named (None: all of it)."""
    if new.allow_internet_access is True:
        return "internet access (allow_internet_access): osfleet desktops have no network unless their operator opts in"
    network = body.get("network")
    if isinstance(network, dict) and any(network.get(k) for k in ("allowOut", "rules", "egressProxy", "dnsServers")):
        return "network rules that let traffic out: osfleet desktops have no network unless their operator opts in"
    for field, what in (("mcp", "an MCP gateway"), ("volumeMounts", "volumes"), ("iam", "workload identity")):
        if body.get(field):
            return what
    return None


async def create(book: SandboxBook, request: Request) -> Response:
    body = await body_of(request)
    new: NewSandboxV2 = _parsed(NewSandboxV2, body)
    missing = _unsupported(new, body)
    if missing is not None:
        raise E2BError(400, f"{missing} is not served by osfleet e2b serve")
    if not isinstance(new.template_id, str) or not new.template_id:
        raise E2BError(400, "templateID is a template's name")
    auto_pause = new.auto_pause is True
    sandbox = await book.create(
        request.headers.get("x-api-key"),
        new.template_id,
        _int(new.timeout, "timeout"),
        _strings(new.metadata, "metadata"),
        _strings(new.env_vars, "envVars"),
        auto_pause,
    )
    return JSONResponse(created(sandbox), status_code=201)


async def get_one(book: SandboxBook, request: Request) -> Response:
    sandbox = await book.get(request.headers.get("x-api-key"), request.path_params["sandbox_id"])
    return JSONResponse(detail(sandbox))


async def list_all(book: SandboxBook, request: Request) -> Response:
    """``GET /v2/sandboxes`` (and v1's ``/sandboxes``): the key's sandboxes, filtered by ``state`` and ``metadata``
    (``key=value&...``, URL-encoded), newest first, ``limit`` a page (``x-next-token`` names the next)."""
    owner = await book.check_key(request.headers.get("x-api-key"))
    query = request.query_params
    states = {s for s in query.get("state", "").split(",") if s}
    if states - {"running", "paused"}:
        raise E2BError(400, f"state is running and/or paused, not {','.join(sorted(states))}")
    wanted = {}
    if query.get("metadata"):
        from urllib.parse import parse_qsl

        wanted = dict(parse_qsl(query["metadata"], keep_blank_values=True))
    limit = query.get("limit", str(MAX_LIST))
    if not limit.isdigit() or not 1 <= int(limit) <= MAX_LIST:
        raise E2BError(400, f"limit is 1 to {MAX_LIST}")
    found = sorted(book.owned(owner), key=lambda s: (-s.started_at, s.id))
    found = [
        s
        for s in found
        if (not states or ("paused" if s.paused else "running") in states)
        and all(s.metadata.get(k) == v for k, v in wanted.items())
    ]
    after = query.get("nextToken")
    if after:
        ids = [s.id for s in found]
        found = found[ids.index(after) :] if after in ids else []
    page, rest = found[: int(limit)], found[int(limit) :]
    headers = {"x-next-token": rest[0].id} if rest else {}
    return JSONResponse([listed(s) for s in page], headers=headers)


async def kill(book: SandboxBook, request: Request) -> Response:
    sandbox = await book.get(request.headers.get("x-api-key"), request.path_params["sandbox_id"])
    await book.kill(sandbox)
    return Response(status_code=204)


async def set_timeout(book: SandboxBook, request: Request) -> Response:
    sandbox = await book.get(request.headers.get("x-api-key"), request.path_params["sandbox_id"])
    asked: SandboxTimeoutRequest = _parsed(SandboxTimeoutRequest, await body_of(request))
    timeout = _int(asked.timeout, "timeout")
    if timeout is None:
        raise E2BError(400, "timeout is needed")
    await book.set_timeout(sandbox, timeout)
    return Response(status_code=204)


async def pause(book: SandboxBook, request: Request) -> Response:
    sandbox = await book.get(request.headers.get("x-api-key"), request.path_params["sandbox_id"])
    await body_of(request)
    if not await book.pause(sandbox):
        raise E2BError(409, f"sandbox {sandbox.id} is paused already")
    return Response(status_code=204)


async def resume(book: SandboxBook, request: Request) -> Response:
    sandbox = await book.get(request.headers.get("x-api-key"), request.path_params["sandbox_id"])
    asked: ResumedSandbox = _parsed(ResumedSandbox, await body_of(request))
    if not sandbox.paused:
        raise E2BError(409, f"sandbox {sandbox.id} is running already")
    await book.resume(sandbox, _int(asked.timeout, "timeout"))
    return JSONResponse(created(sandbox), status_code=201)


async def connect(book: SandboxBook, request: Request) -> Response:
    """``POST /v2/sandboxes/{id}/connect``: 200 for a running sandbox (its timeout moved later, never earlier),
    201 for a paused one resumed."""
    sandbox = await book.get(request.headers.get("x-api-key"), request.path_params["sandbox_id"])
    asked: ConnectSandboxV2 = _parsed(ConnectSandboxV2, await body_of(request))
    resumed = await book.resume(sandbox, _int(asked.timeout, "timeout"))
    return JSONResponse(created(sandbox), status_code=201 if resumed else 200)


async def fork(book: SandboxBook, request: Request) -> Response:
    sandbox = await book.get(request.headers.get("x-api-key"), request.path_params["sandbox_id"])
    asked: SandboxForkRequest = _parsed(SandboxForkRequest, await body_of(request))
    count = _int(asked.count, "count") or 1
    if not 1 <= count <= MAX_FORKS:
        raise E2BError(400, f"count is 1 to {MAX_FORKS}")
    children = await book.fork(sandbox, count, _int(asked.timeout, "timeout"))
    results = [SandboxForkResult(sandbox=SandboxModel.from_dict(created(c))).to_dict() for c in children]
    return JSONResponse(results, status_code=201)


def _route(path: str, handler: Handler, method: str) -> Route:
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request.app.state.book, request)
        except E2BError as exc:
            return error_response(exc)

    return Route(path, endpoint, methods=[method])


def routes() -> list[Route]:
    return [
        _route("/v2/sandboxes", create, "POST"),
        _route("/sandboxes", create, "POST"),
        _route("/v2/sandboxes", list_all, "GET"),
        _route("/sandboxes", list_all, "GET"),
        _route("/sandboxes/{sandbox_id}", get_one, "GET"),
        _route("/sandboxes/{sandbox_id}", kill, "DELETE"),
        _route("/sandboxes/{sandbox_id}/timeout", set_timeout, "POST"),
        _route("/sandboxes/{sandbox_id}/pause", pause, "POST"),
        _route("/sandboxes/{sandbox_id}/resume", resume, "POST"),
        _route("/v2/sandboxes/{sandbox_id}/connect", connect, "POST"),
        _route("/sandboxes/{sandbox_id}/connect", connect, "POST"),
        _route("/sandboxes/{sandbox_id}/fork", fork, "POST"),
    ]
