"""What every tool of the MCP server shares: its session's desktop, errors as tool errors, answers as content."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from mcp.server.fastmcp import Context
from mcp.server.fastmcp.exceptions import ToolError
from mcp.types import ContentBlock, ImageContent, TextContent

from osfleet.client import FleetError, InfrastructureError
from osfleet.client.types import Screen
from osfleet.mcp.desk import Desk

STDIO_SESSION = "stdio"  # the one session of a server over standard input/output
SESSION_HEADER = "mcp-session-id"

DeskContext = Context[Any, Desk, Any]
"""A tool's context: its lifespan value is the session's ``Desk``."""


def desk_of(ctx: DeskContext) -> Desk:
    return ctx.request_context.lifespan_context


def session_id(ctx: DeskContext) -> str:
    """The MCP session a call belongs to: its ``Mcp-Session-Id`` over HTTP (what the client that opened it was
    given), ``stdio`` over standard input/output."""
    request = ctx.request_context.request
    headers = getattr(request, "headers", None)
    sid = headers.get(SESSION_HEADER) if headers is not None else None
    return str(sid) if sid else STDIO_SESSION


async def guarded(work: Awaitable[list[ContentBlock]]) -> list[ContentBlock]:
    """A fleet's refusal or failure as a tool error (its reason in one line), never a crash of the session."""
    try:
        return await work
    except InfrastructureError as exc:
        raise ToolError(f"infrastructure: {exc} (not the agent's doing; try again)") from None
    except FleetError as exc:
        raise ToolError(str(exc)) from None


def say(words: str) -> TextContent:
    return TextContent(type="text", text=words)


def image(screen: Screen) -> ImageContent:
    return ImageContent(type="image", data=screen.base64(), mimeType=screen.media_type)


def screen_parts(screen: Screen | None) -> list[ContentBlock]:
    if screen is None:
        return []
    return [image(screen), say(f"screen {screen.width}x{screen.height} ({screen.format})")]
