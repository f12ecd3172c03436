"""A guest as osfleet's input code sees it, scripted: QEMU's monitor records the input events (its keyboard is read
as soon as it is written) and the guest's commands are recorded and answered from a table; and a fake host whose
steps run through osfleet's real action runner into such a guest. For tests of the input primitives and what is
built on them (the computer-use drivers, the MCP tools) without a VM (tests/test_computer_use_apis_vm.py has the
real desktop)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from osfleet.protocol.actions import Action, ActionResult
from osfleet.replicas import keyboard_flow
from osfleet.replicas.actions import run_actions
from osfleet.replicas.leases import Claim
from osfleet.replicas.records import ReplicaRecord
from osfleet.vm.screen import encode
from tests.fakes import FakeHost, FakeImage

SIZE = (1000, 800)
SCREEN = (1920, 1080)  # a DesktopHost's: OSWorld's size, over Anthropic's image limit (so its toolset scales)


class ScriptedGuest:
    """QEMU's monitor (input events recorded; a keyboard read as soon as it is written) and the guest's commands
    (recorded; ``answers`` maps a pattern of the command to its result)."""

    def __init__(self, answers: dict[str, dict[str, Any]] | None = None, size: tuple[int, int] = SIZE) -> None:
        self.size = size
        self.events: list[dict[str, Any]] = []
        self.read = 0
        self.commands: list[str] = []
        self.log: list[str | dict[str, Any]] = []  # commands and events, in the order they reached the guest
        self.answers = answers or {}

    def qmp(self, domain: str, command: str, arguments: dict[str, Any] | None = None) -> Any:
        if command == "human-monitor-command":
            return f"IRQ statistics for ioapic:\n 1: {self.read}\n"
        assert command == "input-send-event" and arguments is not None
        self.read += keyboard_flow.scancode_bytes(arguments["events"])
        self.events.extend(arguments["events"])
        self.log.extend(arguments["events"])
        return {}

    def guest_exec(self, domain: str, argv: list[str], timeout: float) -> tuple[int, str, str]:
        command = argv[-1]
        self.commands.append(command)
        self.log.append(command)
        for pattern, out in self.answers.items():
            if re.search(pattern, command):
                return out.get("exit_code", 0), out.get("stdout", ""), out.get("stderr", "")
        return 0, "", ""

    def timeline(self) -> list[str]:
        """Every event as one word: ``+ctrl``/``-ctrl`` keys, ``B+left``/``B-left`` buttons, ``@x,y`` moves."""
        out, xy = [], {}
        for e in self.events:
            d = e["data"]
            if e["type"] == "key":
                out.append(("+" if d["down"] else "-") + d["key"]["data"])
            elif e["type"] == "btn":
                out.append(("B+" if d["down"] else "B-") + d["button"])
            else:
                xy[d["axis"]] = d["value"]
                if d["axis"] == "y":
                    w, h = self.size
                    out.append(f"@{round(xy['x'] * (w - 1) / 32767)},{round(xy['y'] * (h - 1) / 32767)}")
        return out


def frame() -> Image.Image:
    """The desktop: dark blue, with its top left quarter red."""
    image = Image.new("RGB", SCREEN, (0, 0, 128))
    image.paste((255, 0, 0), (0, 0, SCREEN[0] // 2, SCREEN[1] // 2))
    return image


@dataclass
class DesktopHost(FakeHost):
    """A fake host whose steps run through osfleet's action runner (``run_actions``) into a scripted guest."""

    image: FakeImage = field(default_factory=lambda: FakeImage(screen=SCREEN))
    guest: ScriptedGuest = field(default_factory=lambda: ScriptedGuest({}, SCREEN))

    def act(self, rid: str, actions: list[Action], claim: Claim | None = None) -> list[ActionResult]:
        with self._touching(rid, claim):
            return run_actions(self.guest, f"osfleet-apis-{rid}", SCREEN, actions, capture=frame)  # type: ignore[arg-type]

    def screen_of(self, rec: ReplicaRecord, fmt: Any, quality: int | None) -> bytes:
        return encode(frame(), fmt, quality)
