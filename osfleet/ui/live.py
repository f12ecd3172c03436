"""The live view's socket: frames of one replica's screen out, a person's take-over and input in.

Two tasks share the socket: ``frames`` sends the screen when it changed (every ``FRAME_SECONDS``), and the
receiving loop turns each JSON message into one operation: ``take``, ``give`` or ``act`` (only while holding
the replica). Whatever ends the socket (closed tab, error) hands a replica it holds back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from osfleet.api.auth import Principal
from osfleet.api.errors import Conflict
from osfleet.errors import OsfleetError
from osfleet.ui.backend import Backend

FRAME_SECONDS = 0.5  # the live view's refresh period (a frame is sent only when the screen changed)


class LiveView:
    """One socket's view of replica ``rid`` for ``who``."""

    def __init__(self, ws: WebSocket, backend: Backend, rid: str, who: Principal) -> None:
        self.ws, self.b, self.rid, self.who = ws, backend, rid, who
        self.holding = False
        self.ops: dict[str, Callable[[dict[str, Any]], Awaitable[None]]] = {
            "take": self.take,
            "give": self.give,
            "act": self.act,
        }

    async def run(self) -> None:
        sender = asyncio.create_task(self.frames())
        try:
            await self.receive()
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender
            if self.holding:  # a closed tab hands the replica back
                with contextlib.suppress(OsfleetError):
                    await self.b.hand_back(self.rid, self.who)

    async def say(self, **body: Any) -> None:
        await self.ws.send_text(json.dumps(body))

    async def frames(self) -> None:
        last = b""
        while True:
            try:
                frame = await self.b.screen(self.rid, None, self.who)
            except OsfleetError as exc:
                await self.say(type="error", error=str(exc))
                frame = b""
            digest = hashlib.sha1(frame).digest()
            if frame and digest != last:
                await self.ws.send_bytes(frame)
                last = digest
            await asyncio.sleep(FRAME_SECONDS)

    async def receive(self) -> None:
        try:
            while True:
                msg = json.loads(await self.ws.receive_text())
                op = msg.get("op") if isinstance(msg, dict) else None
                handler = self.ops.get(op) if isinstance(op, str) else None
                if handler is None:
                    await self.say(type="error", error=f"unknown op {op!r}")
                    continue
                try:
                    await handler(msg)
                except (OsfleetError, ValidationError, ValueError) as exc:
                    await self.say(type="error", error=str(exc).splitlines()[0])
        except (WebSocketDisconnect, json.JSONDecodeError, KeyError):  # gone, or not JSON text
            pass

    async def take(self, msg: dict[str, Any]) -> None:
        await self.b.take_over(self.rid, self.who)
        self.holding = True
        await self.say(type="status", taken_over=True)

    async def give(self, msg: dict[str, Any]) -> None:
        await self.b.hand_back(self.rid, self.who)
        self.holding = False
        await self.say(type="status", taken_over=False)

    async def act(self, msg: dict[str, Any]) -> None:
        if not self.holding:
            raise Conflict("take over before sending input")
        results = await self.b.act(self.rid, msg.get("actions") or [], self.who)
        await self.say(type="acted", results=results)
