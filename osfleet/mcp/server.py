"""An osfleet desktop as Model Context Protocol tools, on the official ``mcp`` SDK (FastMCP).

One tool per verb, each with an input schema that states units and bounds (pixels from the screen's top-left
corner, seconds, wheel clicks, bytes). Each MCP session gets its own desktop (``desk.Desk``): leased on the first
tool that needs one, released when the session ends (the SDK runs the server's lifespan once per session, over
stdio and over streamable HTTP alike). Whatever goes wrong in a call (a bad argument, an action the desktop
refuses, a lease that ran out, the fleet unreachable) is a tool error with one readable line, never the end of
the session. A server is built for one role (``roles``): the agent's, whose ``reset`` and ``evaluate`` neither
swap its task nor tell it its score, or the grader's.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import BlobResourceContents, ContentBlock, EmbeddedResource, ToolAnnotations
from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from osfleet import __version__
from osfleet.client import AsyncFleet, FleetError
from osfleet.mcp.content import DeskContext, desk_of, guarded, image, say, screen_parts
from osfleet.mcp.desk import Desk, DeskOptions
from osfleet.mcp.roles import ROLE_TOOLS, Board, Role, install
from osfleet.protocol.actions import MAX_READ_BYTES

MAX_COORDINATE = 16383  # beyond any screen; the desktop refuses a point off its own screen (the size in screenshot)
MAX_COMMAND_SECONDS = 600
MAX_WRITE_BYTES = 65536  # what one write_file carries until the files endpoint is used (a guest command's bound)

X = Annotated[int, Field(ge=0, le=MAX_COORDINATE, description="pixels from the screen's left edge (0 to width-1)")]
Y = Annotated[int, Field(ge=0, le=MAX_COORDINATE, description="pixels from the screen's top edge (0 to height-1)")]
# Optional points: the schema shows an integer with its bounds (no null), as X and Y do; omitted is the pointer
AtX = (
    Annotated[int, Field(ge=0, le=MAX_COORDINATE, description="pixels from the left edge; omit x and y: the pointer")]
    | SkipJsonSchema[None]
)
AtY = (
    Annotated[int, Field(ge=0, le=MAX_COORDINATE, description="pixels from the top edge; omit x and y: the pointer")]
    | SkipJsonSchema[None]
)
Button = Annotated[Literal["left", "right", "middle", "back", "forward"], Field(description="mouse button")]
Held = Annotated[
    list[str],
    Field(max_length=6, description='keys held down during the action, e.g. ["ctrl"] or ["ctrl", "shift"]'),
]
KeyName = Annotated[
    str, Field(min_length=1, max_length=40, description="a key: ctrl, shift, alt, super, enter, esc, f5, a, Page_Down")
]
GuestPath = Annotated[str, Field(pattern=r"^/[^\x00]*$", max_length=4096, description="absolute path in the desktop")]
Observe = Annotated[bool, Field(description="also return a screenshot taken after the action")]

INSTRUCTIONS: dict[Role, str] = {
    "agent": (
        "A Linux desktop (X11 with a plain window manager, twm or openbox: no panel, dock or start menu; start "
        "programs from a terminal) leased from an osfleet fleet for this session, released when the session ends. "
        "Call reset first: it starts the desktop at your task and answers its instruction. Call screenshot to see "
        "the desktop and learn its size; coordinates are screen pixels from the top-left corner. Call evaluate "
        "when the task is done: it is scored for your grader. run_command runs sh as the desktop user, never root."
    ),
    "grader": (
        "A Linux desktop (X11 with a plain window manager, twm or openbox: no panel, dock or start menu; start "
        "programs from a terminal) leased from an osfleet fleet for this session, released when the session ends. "
        "reset puts it back to its initial state (optionally a task's start, whose instruction it returns) and "
        "evaluate scores that task. Over HTTP, sessions, assign_task and evaluate_session reach the agent sessions "
        "of the same server. run_command runs sh as the desktop user, never root."
    ),
}


def build(
    url: str,
    token: str,
    *,
    role: Role = "agent",
    board: Board | None = None,
    sessions: bool = False,
    options: DeskOptions | None = None,
    host: str = "127.0.0.1",
    port: int = 8765,
    path: str = "/mcp",
    allowed_hosts: list[str] | None = None,
    allowed_origins: list[str] | None = None,
    verify: bool | str = True,
) -> FastMCP[Desk]:
    """The MCP server of one role (``roles``): ``url``/``token`` reach the fleet (a host agent or a gateway);
    ``board``: what it shares with the other role's server of the same process; ``sessions``: a grader reaches the
    agent sessions on ``board`` (HTTP). ``host``/``port``/``path``, the allowed ``Host`` and ``Origin`` headers
    matter to the HTTP transport only."""
    opts = options or DeskOptions()
    shared = board if board is not None else Board()

    @asynccontextmanager
    async def one_desk_per_session(_: FastMCP[Desk]) -> AsyncIterator[Desk]:
        desk = Desk(AsyncFleet(url, token, verify=verify), opts)
        try:
            yield desk
        finally:
            shared.ended(desk)
            await desk.close()

    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=allowed_hosts or [f"{h}:{port}" for h in ("127.0.0.1", "localhost", "[::1]")],
        allowed_origins=allowed_origins or [f"http://{h}:{port}" for h in ("127.0.0.1", "localhost", "[::1]")],
    )
    server: FastMCP[Desk] = FastMCP(
        "osfleet" if role == "agent" else "osfleet-grader",
        instructions=INSTRUCTIONS[role],
        lifespan=one_desk_per_session,
        host=host,
        port=port,
        streamable_http_path=path,
        transport_security=security,
        log_level="WARNING",
    )
    server._mcp_server.version = __version__
    _tools(server)
    install(server, role, shared, sessions)
    return server


def _tools(server: FastMCP[Desk]) -> None:
    def tool(title: str, *, read_only: bool = False) -> Callable[[Any], Any]:
        return server.tool(
            title=title, annotations=ToolAnnotations(title=title, readOnlyHint=read_only), structured_output=False
        )

    async def act(ctx: DeskContext, action: dict[str, Any], done: str, observe: bool = False) -> list[ContentBlock]:
        async def work() -> list[ContentBlock]:
            result = await desk_of(ctx).step([action], observe=observe)
            return [say(done), *screen_parts(result.screen)]

        return await guarded(work())

    def at(x: int | None, y: int | None) -> dict[str, int]:
        """A point, or none (where the pointer is); one coordinate alone is refused by the action's own model."""
        return {k: v for k, v in (("x", x), ("y", y)) if v is not None}

    def where(x: int | None, y: int | None) -> str:
        return "where the pointer is" if x is None and y is None else f"at ({x}, {y})"

    @tool("Screenshot", read_only=True)
    async def screenshot(
        ctx: DeskContext,
        format: Annotated[Literal["png", "jpeg", "webp"], Field(description="image format")] = "png",
        quality: Annotated[int, Field(ge=1, le=100, description="JPEG/WebP quality (ignored for png)")] = 85,
    ) -> list[ContentBlock]:
        """The desktop's screen now, as an image, with its size in pixels."""

        async def work() -> list[ContentBlock]:
            screen = await desk_of(ctx).call(lambda s: s.observe(format=format, quality=quality))
            return screen_parts(screen)

        return await guarded(work())

    @tool("Click")
    async def click(
        ctx: DeskContext,
        x: AtX = None,
        y: AtY = None,
        button: Button = "left",
        count: Annotated[int, Field(ge=1, le=3, description="1 click, 2 (double) or 3 (triple: a line)")] = 1,
        keys: Held = [],  # noqa: B006  (FastMCP builds the schema from the default; it is never mutated)
        observe: Observe = False,
    ) -> list[ContentBlock]:
        """Click a mouse button at (x, y), or where the pointer is, ``count`` times, with ``keys`` held down."""
        action = {"type": "click", "button": button, "count": count, "keys": keys, **at(x, y)}
        return await act(ctx, action, f"clicked {button} x{count} {where(x, y)}", observe)

    @tool("Double-click")
    async def double_click(ctx: DeskContext, x: X, y: Y, observe: Observe = False) -> list[ContentBlock]:
        """Double-click the left button at (x, y)."""
        return await act(ctx, {"type": "double_click", "x": x, "y": y}, f"double-clicked at ({x}, {y})", observe)

    @tool("Move the mouse")
    async def move_mouse(ctx: DeskContext, x: X, y: Y, observe: Observe = False) -> list[ContentBlock]:
        """Move the pointer to (x, y) without clicking."""
        return await act(ctx, {"type": "move", "x": x, "y": y}, f"pointer at ({x}, {y})", observe)

    @tool("Drag")
    async def drag(
        ctx: DeskContext,
        x1: X,
        y1: Y,
        x2: X,
        y2: Y,
        seconds: Annotated[float, Field(ge=0, le=30, description="how long the movement takes (0: quickly)")] = 0,
        keys: Held = [],  # noqa: B006
        observe: Observe = False,
    ) -> list[ContentBlock]:
        """Press the left button at (x1, y1), move to (x2, y2) and release it there, with ``keys`` held down."""
        action = {"type": "drag", "x1": x1, "y1": y1, "x2": x2, "y2": y2, "seconds": seconds, "keys": keys}
        return await act(ctx, action, f"dragged from ({x1}, {y1}) to ({x2}, {y2})", observe)

    @tool("Press a mouse button")
    async def mouse_down(
        ctx: DeskContext, button: Button = "left", x: AtX = None, y: AtY = None, observe: Observe = False
    ) -> list[ContentBlock]:
        """Press a mouse button and keep it down (at (x, y), or where the pointer is) until mouse_up."""
        return await act(ctx, {"type": "mouse_down", "button": button, **at(x, y)}, f"{button} down", observe)

    @tool("Release a mouse button")
    async def mouse_up(
        ctx: DeskContext, button: Button = "left", x: AtX = None, y: AtY = None, observe: Observe = False
    ) -> list[ContentBlock]:
        """Release a mouse button (at (x, y), or where the pointer is)."""
        return await act(ctx, {"type": "mouse_up", "button": button, **at(x, y)}, f"{button} up", observe)

    @tool("Where the pointer is", read_only=True)
    async def cursor_position(ctx: DeskContext) -> list[ContentBlock]:
        """The mouse pointer's position, in screen pixels."""

        async def work() -> list[ContentBlock]:
            (out,) = (await desk_of(ctx).step([{"type": "cursor_position"}])).results
            return [say(f"pointer at ({out.x}, {out.y})")]

        return await guarded(work())

    @tool("Scroll")
    async def scroll(
        ctx: DeskContext,
        x: AtX = None,
        y: AtY = None,
        clicks: Annotated[int, Field(ge=-50, le=50, description="wheel clicks: positive down, negative up")] = 0,
        clicks_x: Annotated[int, Field(ge=-50, le=50, description="sideways: positive right, negative left")] = 0,
        keys: Held = [],  # noqa: B006
        observe: Observe = False,
    ) -> list[ContentBlock]:
        """Turn the mouse wheel at (x, y), or where the pointer is: up or down, left or right."""
        action = {"type": "scroll", "clicks": clicks, "clicks_x": clicks_x, "keys": keys, **at(x, y)}
        return await act(ctx, action, f"scrolled {clicks} down, {clicks_x} right {where(x, y)}", observe)

    @tool("Zoom in", read_only=True)
    async def zoom(
        ctx: DeskContext,
        x0: X,
        y0: Y,
        x1: Annotated[int, Field(ge=1, le=MAX_COORDINATE + 1, description="right edge, exclusive (x0 < x1)")],
        y1: Annotated[int, Field(ge=1, le=MAX_COORDINATE + 1, description="bottom edge, exclusive (y0 < y1)")],
        width: Annotated[int, Field(ge=1, le=4096, description="the image's width")] | SkipJsonSchema[None] = None,
    ) -> list[ContentBlock]:
        """A region of the screen as an image (cropped and scaled to ``width`` by the host): the pixels
        x0 <= x < x1, y0 <= y < y1."""

        async def work() -> list[ContentBlock]:
            shot = await desk_of(ctx).call(lambda s: s.screenshot(region=(x0, y0, x1, y1), width=width))
            return [image(shot), say(f"region [{x0}, {y0}, {x1}, {y1}] as {shot.width}x{shot.height}")]

        return await guarded(work())

    @tool("Type text")
    async def type_text(
        ctx: DeskContext,
        text: Annotated[str, Field(min_length=1, max_length=10000, description="any Unicode text; \\n is Enter")],
        observe: Observe = False,
    ) -> list[ContentBlock]:
        """Type text into the focused window, key by key ("\\n" presses Enter; é, €, 日本 are typed too)."""
        return await act(ctx, {"type": "type", "text": text}, f"typed {len(text)} characters", observe)

    @tool("Press keys")
    async def press_keys(
        ctx: DeskContext,
        keys: Annotated[
            list[str],
            Field(min_length=1, max_length=6, description='held together, in order, e.g. ["ctrl", "s"] or ["enter"]'),
        ],
        observe: Observe = False,
    ) -> list[ContentBlock]:
        """Press a key or a combination (ctrl, alt, shift, super, enter, esc, tab, f1-f12, a letter, ...)."""
        return await act(ctx, {"type": "hotkey", "keys": keys}, "pressed " + "+".join(keys), observe)

    @tool("Hold keys")
    async def hold_keys(
        ctx: DeskContext,
        keys: Annotated[list[KeyName], Field(min_length=1, max_length=6, description="held together, in order")],
        seconds: Annotated[float, Field(ge=0, le=60, description="how long they are held")],
        observe: Observe = False,
    ) -> list[ContentBlock]:
        """Hold keys down for a while, then release them."""
        action = {"type": "hold_key", "keys": keys, "seconds": seconds}
        return await act(ctx, action, f"held {'+'.join(keys)} for {seconds:g} s", observe)

    @tool("Press a key down")
    async def key_down(ctx: DeskContext, key: KeyName, observe: Observe = False) -> list[ContentBlock]:
        """Press a key and keep it down until key_up (e.g. shift while clicking several things)."""
        return await act(ctx, {"type": "key_down", "key": key}, f"{key} down", observe)

    @tool("Release a key")
    async def key_up(ctx: DeskContext, key: KeyName, observe: Observe = False) -> list[ContentBlock]:
        """Release a key pressed with key_down."""
        return await act(ctx, {"type": "key_up", "key": key}, f"{key} up", observe)

    @tool("Wait", read_only=True)
    async def wait(
        ctx: DeskContext,
        seconds: Annotated[float, Field(ge=0, le=60, description="seconds to wait")] = 1.0,
        observe: Observe = False,
    ) -> list[ContentBlock]:
        """Let the desktop get on for a while (an application starting, a page loading)."""
        return await act(ctx, {"type": "wait", "seconds": seconds}, f"waited {seconds:g} s", observe)

    @tool("Run a command")
    async def run_command(
        ctx: DeskContext,
        command: Annotated[str, Field(min_length=1, max_length=100000, description="run with sh -c")],
        timeout: Annotated[
            float, Field(gt=0, le=MAX_COMMAND_SECONDS, description="seconds before it is killed")
        ] = 30.0,
    ) -> list[ContentBlock]:
        """Run a shell command as the desktop user (never root) on the desktop's display, in its home folder;
        answers its exit code, standard output and standard error."""

        async def work() -> list[ContentBlock]:
            action = {"type": "shell", "command": command, "timeout": timeout}
            (out,) = (await desk_of(ctx).step([action])).results
            return [say(f"exit code {out.exit_code}\n--- stdout\n{out.stdout or ''}\n--- stderr\n{out.stderr or ''}")]

        return await guarded(work())

    @tool("Read a file", read_only=True)
    async def read_file(
        ctx: DeskContext,
        path: Annotated[
            str, Field(pattern=r"^/[^\x00]*$", max_length=4096, description="absolute path in the desktop")
        ],
        max_bytes: Annotated[int, Field(gt=0, le=MAX_READ_BYTES, description="read at most this many bytes")] = 1 << 20,
    ) -> list[ContentBlock]:
        """A file of the desktop, as text (UTF-8) or, when it is not text, as a base64 blob."""

        async def work() -> list[ContentBlock]:
            action = {"type": "read_file", "path": path, "max_bytes": max_bytes}
            (out,) = (await desk_of(ctx).step([action])).results
            data = base64.b64decode(out.content_base64 or "")
            try:
                return [say(data.decode())]
            except UnicodeDecodeError:
                blob = BlobResourceContents(
                    uri=Path(path).as_uri(),  # type: ignore[arg-type]  # pydantic parses the URL
                    mimeType="application/octet-stream",
                    blob=out.content_base64 or "",
                )
                return [EmbeddedResource(type="resource", resource=blob)]

        return await guarded(work())

    @tool("Write a file")
    async def write_file(
        ctx: DeskContext,
        path: Annotated[
            str, Field(pattern=r"^/[^\x00]*$", max_length=4096, description="absolute path in the desktop")
        ],
        text: Annotated[str | None, Field(description="the file's content as text (UTF-8)")] = None,
        content_base64: Annotated[str | None, Field(description="or its bytes, base64")] = None,
    ) -> list[ContentBlock]:
        """Write a file as the desktop user (its folder is made): give ``text`` or ``content_base64``."""
        if (text is None) == (content_base64 is None):
            raise ToolError("give text or content_base64 (one of them)")
        try:
            data = text.encode() if text is not None else base64.b64decode(content_base64 or "", validate=True)
        except ValueError:
            raise ToolError("content_base64 is not base64") from None
        if len(data) > MAX_WRITE_BYTES:
            raise ToolError(f"{len(data)} bytes: write_file takes at most {MAX_WRITE_BYTES}")

        async def work() -> list[ContentBlock]:
            encoded = base64.b64encode(data).decode()
            q = shlex.quote(path)
            command = f'mkdir -p "$(dirname {q})" && printf %s {encoded} | base64 -d > {q}'
            (out,) = (await desk_of(ctx).step([{"type": "shell", "command": command, "timeout": 60}])).results
            if out.exit_code != 0:
                raise FleetError(f"writing {path}: {(out.stderr or '').strip()[:300] or f'exit code {out.exit_code}'}")
            return [say(f"wrote {len(data)} bytes to {path}")]

        return await guarded(work())

    @tool("Accessibility tree", read_only=True)
    async def accessibility_tree(ctx: DeskContext) -> list[ContentBlock]:
        """The desktop's accessibility tree (AT-SPI) as OSWorld's XML: every window's widgets with their names,
        roles, states and on-screen positions."""

        async def work() -> list[ContentBlock]:
            screen = await desk_of(ctx).call(lambda s: s.observe(format="jpeg", include=["accessibility_tree"]))
            if not screen.accessibility_tree:
                raise FleetError("the accessibility tree could not be read from the desktop")
            return [say(screen.accessibility_tree)]

        return await guarded(work())


TOOLS = (
    "screenshot",
    "click",
    "double_click",
    "move_mouse",
    "drag",
    "mouse_down",
    "mouse_up",
    "cursor_position",
    "scroll",
    "zoom",
    "type_text",
    "press_keys",
    "hold_keys",
    "key_down",
    "key_up",
    "wait",
    "run_command",
    "read_file",
    "write_file",
    "accessibility_tree",
    *ROLE_TOOLS,
)
