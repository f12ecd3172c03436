"""OpenAI's computer-use actions, served by an osfleet desktop: an agent written for the ``computer`` tool runs
unchanged.

- ``AsyncComputer(session)`` is an ``agents.AsyncComputer`` (openai-agents' driver interface) over a leased
  ``AsyncSession``; ``Computer(session)`` its sync twin (``agents.Computer``) over a ``Session``. Hand either to
  ``agents.ComputerTool(computer=...)``.
- ``desktop_provider(fleet, task)`` is an ``agents.ComputerProvider``: each run of an agent leases a desktop (reset to
  ``task`` when given) and gives it back when the run ends, so concurrent runs never share a screen.
- ``computer_call_output(session, call)`` answers a GA ``computer_call`` item of the Responses API yourself: it runs
  the item's ``actions`` in order (one osfleet step) and returns the ``computer_call_output`` item, whose
  ``computer_screenshot`` shows the screen after them. ``computer_call_output_async`` is its twin.

Actions map one to one onto osfleet's (``osfleet.protocol.actions``): clicks with any button (``wheel`` is the
middle one, ``back`` and ``forward`` the side buttons) and the ``keys`` held during pointer actions, drags along
their path, scrolls both ways (``scroll_x``/``scroll_y`` are pixels: ``SCROLL_PIXELS_PER_CLICK`` a wheel click),
``keypress`` as keys pressed together (any case: "CTRL", "Enter", "ArrowLeft"), Unicode ``type``, and ``wait``
(``WAIT_SECONDS``). A point off the screen or an unknown key raises ``InvalidActionError`` with the reason.

OpenAI's SDK is an extra: ``pip install 'osfleet[openai]'`` (openai-agents, which brings ``openai``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Literal, TypeVar

try:
    import agents
except ImportError as exc:  # pragma: no cover - depends on the install
    # ModuleNotFoundError naming the module, like Python's own: a tool that walks the package sees an extra missing.
    raise ModuleNotFoundError(
        f"osfleet.client.openai needs OpenAI's SDK: pip install 'osfleet[openai]' ({exc})", name=exc.name
    ) from None

from osfleet.client.computer_use import OPENAI_WAIT_SECONDS, View, openai_actions, run, screen_size
from osfleet.client.errors import FleetError, InvalidActionError
from osfleet.client.fleet import AsyncFleet, AsyncSession
from osfleet.client.sync import Session
from osfleet.client.types import TaskLike

WAIT_SECONDS = OPENAI_WAIT_SECONDS
"""What a ``wait`` action waits, in seconds: the GA action has no duration."""
T = TypeVar("T")
ENVIRONMENT: Literal["ubuntu"] = "ubuntu"  # an osfleet desktop is Linux (the preview tool's ``environment``)


def _bad(message: str) -> InvalidActionError:
    return InvalidActionError(message, status=422, kind="invalid_action")


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


class AsyncComputer(agents.AsyncComputer):
    """openai-agents' ``AsyncComputer`` on a leased osfleet desktop: an ``AsyncSession``, or a blocking ``Session``
    (its calls then run on the session's own event loop, awaited from the caller's). Screenshots are the desktop's
    own size unless ``max_long_side``/``max_pixels`` ask for smaller (coordinates are then mapped back);
    ``dimensions`` is known once ``prepare()`` or the first action has run."""

    def __init__(
        self, session: AsyncSession | Session, *, max_long_side: int | None = None, max_pixels: int | None = None
    ) -> None:
        self.session: AsyncSession = session.inner if isinstance(session, Session) else session
        self._loop = session._loop.loop if isinstance(session, Session) else None
        self.limits = (max_long_side, max_pixels)
        self._view: View | None = None

    async def _on_session_loop(self, work: Coroutine[Any, Any, T]) -> T:
        """``work`` awaited on the event loop its session's connections belong to."""
        if self._loop is None or self._loop is asyncio.get_running_loop():
            return await work
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))

    async def prepare(self) -> AsyncComputer:
        """Learn the desktop's size (one small observation); returns self."""
        await self.view()
        return self

    async def view(self) -> View:
        """The desktop and the screenshot's size (asked once)."""
        if self._view is None:
            self._view = View.fit(await self._on_session_loop(screen_size(self.session)), *self.limits)
        return self._view

    @property
    def environment(self) -> Literal["ubuntu"]:
        """``ubuntu``: an osfleet desktop is Linux (the preview tool's payload states it)."""
        return ENVIRONMENT

    @property
    def dimensions(self) -> tuple[int, int] | None:
        """The screenshot's size in pixels, once known (``prepare``, or the first action)."""
        return None if self._view is None else self._view.shown

    async def _do(self, action: dict[str, Any]) -> None:
        await self._on_session_loop(run(self.session, openai_actions(await self.view(), action)))

    async def screenshot(self) -> str:
        """The screen as base64 PNG (scaled to the limits, if any)."""
        view = await self.view()
        if not view.scaled:
            shot = self.session.observe(format="png")
        else:
            shot = self.session.screenshot(width=view.shown[0], height=view.shown[1])
        return (await self._on_session_loop(shot)).base64()

    async def click(self, x: int, y: int, button: str = "left", *, keys: list[str] | None = None) -> None:
        """Click ``button`` (left, right, wheel, back, forward) at (x, y) with ``keys`` held."""
        await self._do({"type": "click", "x": x, "y": y, "button": button, "keys": keys})

    async def double_click(self, x: int, y: int, *, keys: list[str] | None = None) -> None:
        """Double-click the left button at (x, y) with ``keys`` held."""
        await self._do({"type": "double_click", "x": x, "y": y, "keys": keys})

    async def scroll(self, x: int, y: int, scroll_x: int, scroll_y: int, *, keys: list[str] | None = None) -> None:
        """Scroll at (x, y) by ``scroll_x``/``scroll_y`` pixels (as wheel clicks) with ``keys`` held."""
        await self._do({"type": "scroll", "x": x, "y": y, "scroll_x": scroll_x, "scroll_y": scroll_y, "keys": keys})

    async def type(self, text: str) -> None:
        """Type ``text`` (any Unicode) into the focused window."""
        await self._do({"type": "type", "text": text})

    async def wait(self) -> None:
        """Wait ``WAIT_SECONDS``."""
        await self._do({"type": "wait"})

    async def move(self, x: int, y: int, *, keys: list[str] | None = None) -> None:
        """Move the pointer to (x, y) with ``keys`` held."""
        await self._do({"type": "move", "x": x, "y": y, "keys": keys})

    async def keypress(self, keys: list[str]) -> None:
        """Press ``keys`` together and release them (any case: "CTRL", "Enter", "ArrowLeft")."""
        await self._do({"type": "keypress", "keys": keys})

    async def drag(self, path: list[tuple[int, int]], *, keys: list[str] | None = None) -> None:
        """Drag the left button along ``path`` with ``keys`` held."""
        await self._do({"type": "drag", "path": [{"x": x, "y": y} for x, y in path], "keys": keys})


class Computer(agents.Computer):
    """openai-agents' sync ``Computer`` on a leased osfleet desktop (a ``Session``): ``AsyncComputer``'s methods run
    on the session's own event loop."""

    def __init__(self, session: Session, *, max_long_side: int | None = None, max_pixels: int | None = None) -> None:
        self.session = session
        self.inner = AsyncComputer(session.inner, max_long_side=max_long_side, max_pixels=max_pixels)

    def _run(self, coro: Any) -> Any:
        return self.session._loop.run(coro)

    @property
    def environment(self) -> Literal["ubuntu"]:
        """``ubuntu`` (``AsyncComputer.environment``)."""
        return ENVIRONMENT

    @property
    def dimensions(self) -> tuple[int, int] | None:
        """The screenshot's size in pixels (asked of the desktop the first time)."""
        if self.inner.dimensions is None:
            self._run(self.inner.prepare())
        return self.inner.dimensions

    def screenshot(self) -> str:
        """The screen as base64 PNG (``AsyncComputer.screenshot``)."""
        result: str = self._run(self.inner.screenshot())
        return result

    def click(self, x: int, y: int, button: str = "left", *, keys: list[str] | None = None) -> None:
        """``AsyncComputer.click``."""
        self._run(self.inner.click(x, y, button, keys=keys))

    def double_click(self, x: int, y: int, *, keys: list[str] | None = None) -> None:
        """``AsyncComputer.double_click``."""
        self._run(self.inner.double_click(x, y, keys=keys))

    def scroll(self, x: int, y: int, scroll_x: int, scroll_y: int, *, keys: list[str] | None = None) -> None:
        """``AsyncComputer.scroll``."""
        self._run(self.inner.scroll(x, y, scroll_x, scroll_y, keys=keys))

    def type(self, text: str) -> None:
        """``AsyncComputer.type``."""
        self._run(self.inner.type(text))

    def wait(self) -> None:
        """``AsyncComputer.wait``."""
        self._run(self.inner.wait())

    def move(self, x: int, y: int, *, keys: list[str] | None = None) -> None:
        """``AsyncComputer.move``."""
        self._run(self.inner.move(x, y, keys=keys))

    def keypress(self, keys: list[str]) -> None:
        """``AsyncComputer.keypress``."""
        self._run(self.inner.keypress(keys))

    def drag(self, path: list[tuple[int, int]], *, keys: list[str] | None = None) -> None:
        """``AsyncComputer.drag``."""
        self._run(self.inner.drag(path, keys=keys))


def desktop_provider(
    fleet: AsyncFleet,
    task: TaskLike | None = None,
    *,
    holder: str = "openai-agents",
    ttl: float | None = None,
    before_release: Callable[[AsyncSession], Awaitable[object]] | None = None,
    max_long_side: int | None = None,
    max_pixels: int | None = None,
) -> agents.ComputerProvider[AsyncComputer]:
    """An ``agents.ComputerProvider`` that leases a desktop for each run (reset to ``task`` when given) and releases
    it when the run ends, however it ends (the lease's TTL covers a process that dies). ``before_release(session)``
    runs first, while the desktop is still the run's (e.g. ``session.evaluate()`` for the run's reward); its failure
    is raised after the desktop is released."""

    async def create(*, run_context: Any) -> AsyncComputer:
        session = await fleet.lease(holder, ttl=ttl)
        try:
            if task is not None:
                await session.reset(task, observe=False)
            return await AsyncComputer(session, max_long_side=max_long_side, max_pixels=max_pixels).prepare()
        except BaseException:
            await asyncio.shield(session.release())
            raise

    async def dispose(*, run_context: Any, computer: AsyncComputer) -> None:
        try:
            if before_release is not None:
                await before_release(computer.session)
        finally:
            await asyncio.shield(computer.session.release())

    return agents.ComputerProvider(create=create, dispose=dispose)


def _call_actions(call: Any) -> tuple[str, list[Any]]:
    """A ``computer_call`` item's ``call_id`` and its actions (GA ``actions``, or a preview item's one ``action``)."""
    if _field(call, "type") not in (None, "computer_call"):
        raise _bad(f"not a computer_call item: {_field(call, 'type')!r}")
    call_id = _field(call, "call_id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad("the computer_call item has no call_id")
    listed = _field(call, "actions")
    single = _field(call, "action")
    actions: Sequence[Any] = listed if listed else ([single] if single is not None else [])
    return call_id, list(actions)


async def computer_call_output_async(
    session: AsyncSession,
    call: Any,
    *,
    acknowledge_safety_checks: bool = False,
    max_long_side: int | None = None,
    max_pixels: int | None = None,
) -> dict[str, Any]:
    """Run a ``computer_call`` item's actions in order and answer it: the ``computer_call_output`` item (a dict to
    send back as an input item) with a ``computer_screenshot`` of the screen after them.

    ``call`` is the item as a dict or as ``openai``'s model. Pending safety checks are refused (``FleetError``) unless
    ``acknowledge_safety_checks`` says a person reviewed them; they are then acknowledged in the answer."""
    call_id, actions = _call_actions(call)
    pending = [
        dict(c) if isinstance(c, Mapping) else c.model_dump() for c in _field(call, "pending_safety_checks") or []
    ]
    if pending and not acknowledge_safety_checks:
        codes = ", ".join(str(c.get("code") or c.get("id")) for c in pending)
        raise FleetError(f"computer_call {call_id} has pending safety checks ({codes}): review them first")
    computer = AsyncComputer(session, max_long_side=max_long_side, max_pixels=max_pixels)
    view = await computer.view()
    await run(session, [a for action in actions for a in openai_actions(view, action)])
    image = await computer.screenshot()
    out: dict[str, Any] = {
        "type": "computer_call_output",
        "call_id": call_id,
        "output": {"type": "computer_screenshot", "image_url": f"data:image/png;base64,{image}"},
    }
    if pending:
        out["acknowledged_safety_checks"] = pending
    return out


def computer_call_output(
    session: Session,
    call: Any,
    *,
    acknowledge_safety_checks: bool = False,
    max_long_side: int | None = None,
    max_pixels: int | None = None,
) -> dict[str, Any]:
    """``computer_call_output_async`` for a sync ``Session``."""
    answer = computer_call_output_async(
        session.inner,
        call,
        acknowledge_safety_checks=acknowledge_safety_checks,
        max_long_side=max_long_side,
        max_pixels=max_pixels,
    )
    result: dict[str, Any] = session._loop.run(answer)
    return result


__all__ = [
    "WAIT_SECONDS",
    "AsyncComputer",
    "Computer",
    "computer_call_output",
    "computer_call_output_async",
    "desktop_provider",
]
