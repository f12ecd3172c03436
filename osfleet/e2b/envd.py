"""E2B's in-sandbox daemon ("envd") answered for every sandbox: Connect RPC ``process.Process`` and
``filesystem.Filesystem``, and the HTTP routes ``GET /health``, ``GET /files`` and ``POST /files``.

The RPC services are the ``e2b`` wheel's own server stubs (``process_connect.ProcessASGIApplication`` and its
filesystem twin on ``connectrpc``), so the wire (envelopes, the JSON codec, errors) is the library's, not written
here. Each request names its sandbox (``E2b-Sandbox-Id``) and proves it with the sandbox's access token
(``X-Access-Token``): ``SandboxBook.for_envd``. The user a call runs as (HTTP Basic ``user:``) may be the desktop
user or none (which means it); root or anyone else is refused, so nothing an E2B client sends runs as root.

Commands: e2b-desktop's lines are answered with the fleet (``desktop_lines``), all others run in the guest
(``processes``). Files: contents through the fleet's files endpoint (as the desktop user, in its home or ``/tmp``,
at most what a host reads from a guest), e2b-desktop's screenshots from where ``scrot`` kept them; the other
filesystem calls as the desktop user's commands (``guest_files``). Stdin, PTYs and directory watches are not
served: they answer ``UNIMPLEMENTED`` with the reason, which the SDK raises.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import shlex
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Literal, TypeVar

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.api.client.models import Error as ErrorModel
from e2b.envd.filesystem import filesystem_connect, filesystem_pb
from e2b.envd.process import process_connect, process_pb
from protobuf import Oneof
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from osfleet.client import FleetError, NotFoundError
from osfleet.client.fleet import AsyncSession
from osfleet.e2b import desktop_lines, guest_files, processes
from osfleet.e2b.errors import E2BError, from_fleet
from osfleet.e2b.guest_files import GuestFileError
from osfleet.e2b.processes import Event, ProcessError
from osfleet.e2b.sandboxes import Sandbox, SandboxBook
from osfleet.protocol.osworld_paths import GUEST_USER

ENVD_VERSION = "0.6.1"  # the daemon's version this answers as: file metadata (0.6.2) and watches are not served
MAX_UPLOAD = 64 * 2**20  # bytes of one POST /files request
CODES = {
    400: Code.INVALID_ARGUMENT,
    401: Code.UNAUTHENTICATED,
    403: Code.PERMISSION_DENIED,
    404: Code.NOT_FOUND,
    409: Code.ALREADY_EXISTS,
    413: Code.RESOURCE_EXHAUSTED,
    429: Code.RESOURCE_EXHAUSTED,
    502: Code.UNAVAILABLE,
    503: Code.UNAVAILABLE,
    507: Code.RESOURCE_EXHAUSTED,
}
NOT_SERVED = "is not served by osfleet e2b serve (commands run detached; their stdin is /dev/null)"
T = TypeVar("T")


def user_of(authorization: str | None) -> str | None:
    """The user an envd call names (HTTP Basic ``user:``), or None."""
    if not authorization or not authorization.lower().startswith("basic "):
        return None
    try:
        name, _, _ = base64.b64decode(authorization[6:].strip(), validate=True).decode().partition(":")
    except (binascii.Error, ValueError):
        raise E2BError(400, "the Authorization header is not HTTP Basic") from None
    return name or None


def check_user(user: str | None) -> None:
    if user not in (None, GUEST_USER):
        raise E2BError(403, f"{user!r}: everything runs as the desktop user {GUEST_USER!r}, never as root or another")


def lease_gone(sandbox: Sandbox, exc: FleetError) -> E2BError:
    """A fleet failure under a sandbox: its lease ended (the sandbox is gone) or the fleet's own status."""
    if exc.status in (404, 409) and exc.kind in ("lease", "not_found", None):
        return E2BError(502, f"sandbox {sandbox.id} was not found: its desktop's lease ended ({exc})")
    return from_fleet(exc)


def connect_error(exc: E2BError) -> ConnectError:
    return ConnectError(CODES.get(exc.status, Code.UNKNOWN), exc.message)


async def guarded(sandbox: Sandbox | None, call: Awaitable[T]) -> T:
    """Await ``call``, every refusal or failure as the Connect error of its status."""
    try:
        return await call
    except E2BError as exc:
        raise connect_error(exc) from None
    except GuestFileError as exc:
        raise connect_error(E2BError(exc.status, str(exc))) from None
    except ProcessError as exc:
        if sandbox is not None and sandbox.session is None:  # killed or paused under the command
            raise connect_error(_gone(sandbox)) from None
        raise ConnectError(Code.FAILED_PRECONDITION, str(exc)) from None
    except FleetError as exc:
        if sandbox is not None and sandbox.session is None:  # killed or paused while the call was in flight
            raise connect_error(_gone(sandbox)) from None
        raise connect_error(lease_gone(sandbox, exc) if sandbox else from_fleet(exc)) from None


def _gone(sandbox: Sandbox) -> E2BError:
    """Why a sandbox without a desktop answers no more (E2B's proxy's words: "not found" means killed)."""
    if sandbox.killed:
        return E2BError(502, f"sandbox {sandbox.id} was not found: it was killed")
    return E2BError(502, f"sandbox {sandbox.id} is paused: connect to it to resume it")


def _session(sandbox: Sandbox) -> AsyncSession:
    if sandbox.session is None:
        raise _gone(sandbox)
    return sandbox.session


class _Door:
    """Finds the sandbox a call is for (its id and access token) and checks the user it names."""

    def __init__(self, book: SandboxBook) -> None:
        self.book = book

    def sandbox(self, ctx: RequestContext[Any, Any]) -> Sandbox:
        headers = ctx.request_headers
        try:
            found = self.book.for_envd(headers.get("e2b-sandbox-id"), headers.get("x-access-token"))
            check_user(user_of(headers.get("authorization")))
        except E2BError as exc:
            raise connect_error(exc) from None
        return found


def _event(event: Event) -> process_pb.ProcessEvent:
    E = process_pb.ProcessEvent
    if event.kind == "start":
        start: Oneof[Literal["start"], process_pb.ProcessEvent.StartEvent] = Oneof("start", E.StartEvent(pid=event.pid))
        return E(event=start)
    if event.kind in ("stdout", "stderr"):
        out: Oneof[Literal["stdout"], bytes] | Oneof[Literal["stderr"], bytes]
        if event.kind == "stdout":
            out = Oneof[Literal["stdout"], bytes]("stdout", event.data)
        else:
            out = Oneof[Literal["stderr"], bytes]("stderr", event.data)
        data: Oneof[Literal["data"], process_pb.ProcessEvent.DataEvent] = Oneof("data", E.DataEvent(output=out))
        return E(event=data)
    if event.kind == "end":
        ended = E.EndEvent(exit_code=event.exit_code, exited=True, status=f"exit status {event.exit_code}")
        end: Oneof[Literal["end"], process_pb.ProcessEvent.EndEvent] = Oneof("end", ended)
        return E(event=end)
    alive: Oneof[Literal["keepalive"], process_pb.ProcessEvent.KeepAlive] = Oneof("keepalive", E.KeepAlive())
    return E(event=alive)


def command_of(config: process_pb.ProcessConfig | None) -> str:
    """The shell line a process config asks for: E2B's ``/bin/bash -l -c LINE`` is LINE; anything else quoted."""
    if config is None or not config.cmd:
        raise E2BError(400, "a process needs a command")
    args = list(config.args)
    if config.cmd in ("/bin/bash", "bash", "/bin/sh", "sh") and len(args) >= 2 and args[-2] == "-c":
        return args[-1]
    return shlex.join([config.cmd, *args])


class ProcessService(process_connect.Process):
    """``process.Process``: start (streamed), connect, list, signals."""

    def __init__(self, book: SandboxBook) -> None:
        self.door = _Door(book)

    async def start(
        self, request: process_pb.StartRequest, ctx: RequestContext[Any, Any], /
    ) -> AsyncIterator[process_pb.StartResponse]:
        sandbox = self.door.sandbox(ctx)
        if request.pty is not None:
            raise ConnectError(Code.UNIMPLEMENTED, f"a PTY {NOT_SERVED}")
        if request.stdin:
            raise ConnectError(Code.UNIMPLEMENTED, f"stdin {NOT_SERVED}")
        try:
            command = command_of(request.process)
        except E2BError as exc:
            raise connect_error(exc) from None
        tag = request.tag or None
        async for event in self._events(sandbox, request.process, command, tag):
            yield process_pb.StartResponse(event=_event(event))

    async def _events(
        self, sandbox: Sandbox, config: process_pb.ProcessConfig | None, command: str, tag: str | None
    ) -> AsyncIterator[Event]:
        session = await guarded(sandbox, _ready(sandbox))
        line = desktop_lines.recognise(command)
        if line is not None:
            outcome = await guarded(sandbox, desktop_lines.answer(line, session, sandbox.desktop))
            if outcome.running:
                process = processes.start_answered(sandbox.processes, command, tag, outcome.lasts)
                async for event in processes.follow_answered(process):
                    yield event
                return
            yield Event("start", pid=sandbox.processes.virtual_pid())
            for kind, data in (("stdout", outcome.stdout), ("stderr", outcome.stderr)):
                if data:
                    yield Event(kind, data=data)  # type: ignore[arg-type]
            yield Event("end", exit_code=outcome.exit_code)
            return
        envs = {**sandbox.envs, **(dict(config.envs) if config is not None else {})}
        cwd = config.cwd if config is not None and config.has_field("cwd") and config.cwd else None
        if cwd is not None:
            cwd = await guarded(sandbox, _resolved(cwd))
        async for event in _relayed(
            sandbox, processes.start_guest(session, sandbox.processes, command, envs, cwd, tag)
        ):
            yield event

    async def connect(
        self, request: process_pb.ConnectRequest, ctx: RequestContext[Any, Any], /
    ) -> AsyncIterator[process_pb.ConnectResponse]:
        sandbox = self.door.sandbox(ctx)
        process = _selected(sandbox, request.process)
        session = await guarded(sandbox, _ready(sandbox))
        async for event in _relayed(sandbox, processes.connect(session, sandbox.processes, process)):
            yield process_pb.ConnectResponse(event=_event(event))

    async def list(self, request: process_pb.ListRequest, ctx: RequestContext[Any, Any], /) -> process_pb.ListResponse:
        sandbox = self.door.sandbox(ctx)
        infos = [
            process_pb.ProcessInfo(
                config=process_pb.ProcessConfig(cmd="/bin/bash", args=["-l", "-c", p.command], envs=p.envs, cwd=p.cwd),
                pid=p.pid,
                tag=p.tag,
            )
            for p in sandbox.processes.running()
        ]
        return process_pb.ListResponse(processes=infos)

    async def send_signal(
        self, request: process_pb.SendSignalRequest, ctx: RequestContext[Any, Any], /
    ) -> process_pb.SendSignalResponse:
        sandbox = self.door.sandbox(ctx)
        process = _selected(sandbox, request.process)
        names = {process_pb.Signal.SIGKILL: "KILL", process_pb.Signal.SIGTERM: "TERM"}
        if request.signal not in names:
            raise ConnectError(Code.INVALID_ARGUMENT, f"signal {request.signal}: only SIGTERM and SIGKILL are sent")
        session = await guarded(sandbox, _ready(sandbox))
        try:
            await guarded(sandbox, processes.signal(session, sandbox.processes, process, names[request.signal]))
        except ConnectError as exc:
            if exc.code == Code.FAILED_PRECONDITION:  # it ended meanwhile
                raise ConnectError(Code.NOT_FOUND, exc.message) from None
            raise
        return process_pb.SendSignalResponse()

    async def send_input(
        self, request: process_pb.SendInputRequest, ctx: RequestContext[Any, Any], /
    ) -> process_pb.SendInputResponse:
        self.door.sandbox(ctx)
        raise ConnectError(Code.UNIMPLEMENTED, f"stdin {NOT_SERVED}")

    async def close_stdin(
        self, request: process_pb.CloseStdinRequest, ctx: RequestContext[Any, Any], /
    ) -> process_pb.CloseStdinResponse:
        self.door.sandbox(ctx)
        raise ConnectError(Code.UNIMPLEMENTED, f"stdin {NOT_SERVED}")

    async def update(
        self, request: process_pb.UpdateRequest, ctx: RequestContext[Any, Any], /
    ) -> process_pb.UpdateResponse:
        self.door.sandbox(ctx)
        raise ConnectError(Code.UNIMPLEMENTED, f"a PTY {NOT_SERVED}")


async def _relayed(sandbox: Sandbox, stream: AsyncGenerator[Event, None]) -> AsyncIterator[Event]:
    """``stream``'s events, its failures as Connect errors; closed with the relay (a client gone mid-stream ends the
    following there and then, not when the collector finds it)."""
    try:
        while True:
            try:
                event = await guarded(sandbox, anext(stream))
            except StopAsyncIteration:
                return
            yield event
    finally:
        await stream.aclose()


async def _ready(sandbox: Sandbox) -> AsyncSession:
    return _session(sandbox)


async def _resolved(path: str) -> str:
    return guest_files.resolve(path)


def _selected(sandbox: Sandbox, selector: process_pb.ProcessSelector | None) -> processes.Process:
    chosen = selector.selector if selector is not None else None
    match chosen:
        case Oneof(field="pid", value=pid):
            found = sandbox.processes.find(pid=int(pid))
        case Oneof(field="tag", value=tag):
            found = sandbox.processes.find(tag=str(tag))
        case _:
            raise ConnectError(Code.INVALID_ARGUMENT, "select a process by pid or tag")
    if found is None:
        raise ConnectError(Code.NOT_FOUND, "no such running process")
    return found


def _entry(e: guest_files.Entry) -> filesystem_pb.EntryInfo:
    types = {"file": filesystem_pb.FileType.FILE, "dir": filesystem_pb.FileType.DIRECTORY}
    types["symlink"] = filesystem_pb.FileType.SYMLINK
    seconds = int(e.mtime)
    return filesystem_pb.EntryInfo(
        name=e.name,
        type=types.get(e.type, filesystem_pb.FileType.UNSPECIFIED),
        path=e.path,
        size=e.size,
        mode=e.mode,
        permissions=_permissions(e.mode),
        owner=e.owner,
        group=e.group,
        modified_time=Timestamp(seconds=seconds, nanos=int((e.mtime - seconds) * 1e9)),
        symlink_target=e.symlink_target,
        is_symlink=e.type == "symlink",
    )


def _permissions(mode: int) -> str:
    return "".join(c if mode & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))


def _shot_entry(path: str, data: bytes) -> filesystem_pb.EntryInfo:
    return filesystem_pb.EntryInfo(
        name=posixpath.basename(path),
        type=filesystem_pb.FileType.FILE,
        path=path,
        size=len(data),
        mode=0o600,
        permissions=_permissions(0o600),
        owner=GUEST_USER,
        group=GUEST_USER,
    )


class FilesystemService(filesystem_connect.Filesystem):
    """``filesystem.Filesystem``: stat, list, make, move, remove (no watches)."""

    def __init__(self, book: SandboxBook) -> None:
        self.door = _Door(book)

    async def _call(self, ctx: RequestContext[Any, Any], do: Callable[[Sandbox, AsyncSession], Awaitable[T]]) -> T:
        sandbox = self.door.sandbox(ctx)
        session = await guarded(sandbox, _ready(sandbox))
        return await guarded(sandbox, do(sandbox, session))

    async def stat(
        self, request: filesystem_pb.StatRequest, ctx: RequestContext[Any, Any], /
    ) -> filesystem_pb.StatResponse:
        async def do(sandbox: Sandbox, session: AsyncSession) -> filesystem_pb.StatResponse:
            path = guest_files.resolve(request.path)
            if path in sandbox.desktop.files:
                return filesystem_pb.StatResponse(entry=_shot_entry(path, sandbox.desktop.files[path]))
            return filesystem_pb.StatResponse(entry=_entry(await guest_files.stat(session, path)))

        return await self._call(ctx, do)

    async def list_dir(
        self, request: filesystem_pb.ListDirRequest, ctx: RequestContext[Any, Any], /
    ) -> filesystem_pb.ListDirResponse:
        async def do(sandbox: Sandbox, session: AsyncSession) -> filesystem_pb.ListDirResponse:
            found = await guest_files.list_dir(session, request.path, request.depth or 1)
            return filesystem_pb.ListDirResponse(entries=[_entry(e) for e in found])

        return await self._call(ctx, do)

    async def make_dir(
        self, request: filesystem_pb.MakeDirRequest, ctx: RequestContext[Any, Any], /
    ) -> filesystem_pb.MakeDirResponse:
        async def do(sandbox: Sandbox, session: AsyncSession) -> filesystem_pb.MakeDirResponse:
            return filesystem_pb.MakeDirResponse(entry=_entry(await guest_files.make_dir(session, request.path)))

        return await self._call(ctx, do)

    async def move(
        self, request: filesystem_pb.MoveRequest, ctx: RequestContext[Any, Any], /
    ) -> filesystem_pb.MoveResponse:
        async def do(sandbox: Sandbox, session: AsyncSession) -> filesystem_pb.MoveResponse:
            entry = await guest_files.move(session, request.source, request.destination)
            return filesystem_pb.MoveResponse(entry=_entry(entry))

        return await self._call(ctx, do)

    async def remove(
        self, request: filesystem_pb.RemoveRequest, ctx: RequestContext[Any, Any], /
    ) -> filesystem_pb.RemoveResponse:
        async def do(sandbox: Sandbox, session: AsyncSession) -> filesystem_pb.RemoveResponse:
            path = guest_files.resolve(request.path)
            if sandbox.desktop.files.pop(path, None) is None:
                await guest_files.remove(session, path)
            return filesystem_pb.RemoveResponse()

        return await self._call(ctx, do)

    async def watch_dir(
        self, request: filesystem_pb.WatchDirRequest, ctx: RequestContext[Any, Any], /
    ) -> AsyncIterator[filesystem_pb.WatchDirResponse]:
        self.door.sandbox(ctx)
        raise ConnectError(Code.UNIMPLEMENTED, "watching a folder is not served by osfleet e2b serve")
        yield filesystem_pb.WatchDirResponse()  # pragma: no cover  (an async generator, as the stub's type says)

    async def create_watcher(
        self, request: filesystem_pb.CreateWatcherRequest, ctx: RequestContext[Any, Any], /
    ) -> filesystem_pb.CreateWatcherResponse:
        self.door.sandbox(ctx)
        raise ConnectError(Code.UNIMPLEMENTED, "watching a folder is not served by osfleet e2b serve")


# --- the daemon's HTTP routes ------------------------------------------------------------------------------------
def error_response(exc: E2BError) -> JSONResponse:
    """E2B's error body (its API's ``Error`` model: code and message) with the status."""
    return JSONResponse(ErrorModel(code=exc.status, message=exc.message).to_dict(), status_code=exc.status)


def _http_sandbox(book: SandboxBook, request: Request) -> Sandbox:
    sandbox = book.for_envd(request.headers.get("e2b-sandbox-id"), request.headers.get("x-access-token"))
    check_user(request.query_params.get("username") or user_of(request.headers.get("authorization")))
    return sandbox


async def health(book: SandboxBook, request: Request) -> Response:
    """204 while the sandbox runs; 502 "not found" once it was killed (the SDK's ``is_running``)."""
    try:
        sandbox = _http_sandbox(book, request)
        _session(sandbox)
    except E2BError as exc:
        return error_response(exc)
    return Response(status_code=204)


async def read_file(book: SandboxBook, request: Request) -> Response:
    try:
        sandbox = _http_sandbox(book, request)
        path = guest_files.resolve(request.query_params.get("path", ""))
        if path in sandbox.desktop.files:
            return Response(sandbox.desktop.files[path], media_type="application/octet-stream")
        session = _session(sandbox)
        try:
            data = await session.download(path)
        except NotFoundError:
            raise E2BError(404, f"{path} does not exist (or is not the desktop user's to read)") from None
        except FleetError as exc:
            raise lease_gone(sandbox, exc) from None
    except GuestFileError as exc:
        return error_response(E2BError(exc.status, str(exc)))
    except E2BError as exc:
        return error_response(exc)
    return Response(data, media_type="application/octet-stream")


async def _body(request: Request) -> bytes:
    """The request's body, refused past ``MAX_UPLOAD`` bytes before more is read."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_UPLOAD:
        raise E2BError(413, f"an upload is at most {MAX_UPLOAD} bytes")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > MAX_UPLOAD:
            raise E2BError(413, f"an upload is at most {MAX_UPLOAD} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def write_file(book: SandboxBook, request: Request) -> Response:
    """``POST /files``: octet-stream (one file, ``path`` in the query) or multipart (``file`` parts, each named
    by its filename or by ``path``)."""
    try:
        sandbox = _http_sandbox(book, request)
        session = _session(sandbox)
        if request.headers.get("content-encoding", "identity") != "identity":
            raise E2BError(400, "compressed uploads are not served: send the file as it is")
        body = await _body(request)
        files = await _parts(request, body)
        written = []
        for path, data in files:
            target = guest_files.resolve(path)
            try:
                await session.upload(target, data)
            except FleetError as exc:
                if exc.status in (403, 413, 422):
                    raise E2BError(400 if exc.status == 422 else exc.status, str(exc)) from None
                raise lease_gone(sandbox, exc) from None
            written.append({"name": posixpath.basename(target), "type": "file", "path": target})
    except GuestFileError as exc:
        return error_response(E2BError(exc.status, str(exc)))
    except E2BError as exc:
        return error_response(exc)
    return JSONResponse(written)


async def _parts(request: Request, body: bytes) -> list[tuple[str, bytes]]:
    query_path = request.query_params.get("path")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "multipart/form-data":
        if not query_path:
            raise E2BError(400, "an upload names its file with ?path=")
        return [(query_path, body)]
    from python_multipart.multipart import parse_options_header

    _, params = parse_options_header(request.headers["content-type"])
    boundary = params.get(b"boundary")
    if not boundary:
        raise E2BError(400, "a multipart upload without its boundary")
    return _multipart(body, boundary, query_path)


def _multipart(body: bytes, boundary: bytes, query_path: str | None) -> list[tuple[str, bytes]]:
    """The ``file`` parts of a multipart body (python-multipart's parser), each with the path it is written to."""
    from python_multipart.exceptions import FormParserError
    from python_multipart.multipart import MultipartParser, parse_options_header

    parts: list[tuple[str, bytes]] = []
    state: dict[str, Any] = {"headers": {}, "name": b"", "data": []}

    def on_header_field(data: bytes, start: int, end: int) -> None:
        state["name"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        state["headers"][state["name"].lower()] = state["headers"].get(state["name"].lower(), b"") + data[start:end]

    def on_header_end() -> None:
        state["name"] = b""

    def on_part_data(data: bytes, start: int, end: int) -> None:
        state["data"].append(data[start:end])

    def on_part_end() -> None:
        _, params = parse_options_header(state["headers"].get(b"content-disposition", b""))
        filename = params.get(b"filename", b"").decode(errors="replace")
        if params.get(b"name") == b"file":
            parts.append((filename, b"".join(state["data"])))
        state["headers"], state["data"] = {}, []

    parser = MultipartParser(
        boundary,
        {
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        },
    )
    try:
        parser.write(body)
        parser.finalize()
    except FormParserError as exc:
        raise E2BError(400, f"the multipart body could not be read: {exc}") from None
    if len(parts) == 1 and query_path:  # one file: the query names it (the part's filename may be shortened)
        parts = [(query_path, parts[0][1])]
    if not parts or any(not path for path, _ in parts):
        raise E2BError(400, "a multipart upload holds 'file' parts, each named by its path")
    return parts
