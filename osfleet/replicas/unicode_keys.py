"""Typing characters the guest's US keyboard has no key for (é, ß, €, Ω, 日本, emoji).

A key event carries a key, not a character: X turns a key into a character (a keysym) by its keyboard map. So a
character with no key of its own is typed by giving one a meaning for the while: a spare key of the PC keyboard
that the desktop never uses (the Japanese and Brazilian keys, the keypad's comma and equals, a few of the extra
keys of multimedia keyboards) is mapped to the character's keysym (``U20AC`` for €) with ``xmodmap``, run in the
guest as the desktop user, and then pressed through QEMU like any other key. The keys still come through the
hypervisor (what the agent typed arrives as key events, in order with its other keys and clicks); only the map
changes inside the guest, and xmodmap comes with every osfleet image (x11-xserver-utils). xdotool types Unicode
the same way, with its own scratch key; it is not used, so that the keys are QEMU's.

One ``xmodmap`` call (a guest command: 0.24 s on an idle replica, measured) maps every character a text needs at
once, as long as it needs at most ``len(SPARE_KEYS)`` distinct ones; a text with more is typed in parts, remapped
between them. The host remembers what each spare key of a domain carries (``keyboard_flow.KeyboardFlow.spare``), so a
character typed again costs no remapping. A new domain (a reset, a fork's child) starts with nothing known.

Why a pause before a spare key is given a new meaning (``SETTLE_SECONDS``): the application turns the key into a
character with the map it holds when it reads the key's event, and Xlib refreshes that map as soon as it reads
the change, possibly before the key events queued in front of it; a key remapped right after it was pressed
could reach the window with its new meaning. The pause is a heuristic (the application's queue is not visible
from here), and spare keys are reused as late as possible, so one text rarely waits.

What an application makes of the character is its own: GTK, Qt and Chromium take any; an xterm started in the C
locale (the default desktop's) cannot hold one beyond Latin-1.
"""

from __future__ import annotations

import shlex
import unicodedata
from dataclasses import dataclass, field

from osfleet.protocol.keys import PLAIN, SHIFTED

# The spare keys, best first: (QEMU qcode, the X keycode the guest sees: Linux's key code + 8). Each was measured
# on a replica (the guest's keyboard read its bytes, and X typed the character mapped to it; tests/
# test_computer_use_apis_vm.py types through all of them): the Japanese keys and the keypad's comma and equals
# first (nothing in osfleet's images binds them), then extra keys of multimedia keyboards that nothing binds either
# (Cancel, Mail, Calculator, My Computer, Media); not the browser's or the player's keys, which Chromium and VLC
# use. Keys QEMU's PS/2 keyboard sends no scancode for (Help, Again, Props, Undo, Copy, Paste, Find, Cut, LF,
# Hangul, Hanja) cannot serve.
SPARE_KEYS: tuple[tuple[str, int], ...] = (
    ("ro", 97),  # KEY_RO 89; no keysym in the default map
    ("yen", 132),  # KEY_YEN 124; none
    ("henkan", 100),  # KEY_HENKAN 92; Henkan_Mode
    ("katakanahiragana", 101),  # KEY_KATAKANAHIRAGANA 93; Hiragana_Katakana
    ("muhenkan", 102),  # KEY_MUHENKAN 94; Muhenkan
    ("hiragana", 99),  # KEY_HIRAGANA 91; Hiragana
    ("kp_equals", 125),  # KEY_KPEQUAL 117; KP_Equal
    ("kp_comma", 129),  # KEY_KPCOMMA 121; KP_Decimal (pyautogui's "separator")
    ("stop", 136),  # KEY_STOP 128; Cancel
    ("mail", 163),  # KEY_MAIL 155; XF86Mail
    ("calculator", 148),  # KEY_CALC 140; XF86Calculator
    ("computer", 165),  # KEY_COMPUTER 157; XF86MyComputer
    ("mediaselect", 234),  # KEY_MEDIA 226; XF86AudioMedia
)
KEYCODES = dict(SPARE_KEYS)
REMAP_SECONDS = 20.0  # one xmodmap in the guest (a guest command under TCG)
SETTLE_SECONDS = 0.5  # a spare key pressed this recently is not given a new meaning yet (see the docstring)
ALLOWED_CONTROLS = frozenset("\n\t")  # typed as Enter and Tab


def on_keyboard(ch: str) -> bool:
    """The guest's US keyboard has a key for ``ch`` (with or without shift)."""
    return ch.isascii() and (ch.isalnum() or ch in PLAIN or ch in SHIFTED)


def untypable(text: str) -> str | None:
    """Why ``text`` cannot be typed (None: it can): a control character (but newline and tab) or a lone surrogate
    has no key, whatever the map."""
    for i, ch in enumerate(text):
        if on_keyboard(ch):
            continue
        category = unicodedata.category(ch)
        if (category == "Cc" and ch not in ALLOWED_CONTROLS) or category == "Cs":
            return f"cannot type {ch!r} (character {i} of the text): a control character has no key"
    return None


def keysym(ch: str) -> str:
    """X's name for the keysym of a character (``xmodmap`` and XStringToKeysym take ``U<hex>``)."""
    return f"U{ord(ch):04X}"


def remap_command(remap: dict[str, str]) -> str:
    """The guest shell command that maps each spare key (qcode) to its character, on both shift levels."""
    lines = [f"keycode {KEYCODES[code]} = {keysym(ch)} {keysym(ch)}" for code, ch in remap.items()]
    return "exec xmodmap " + " ".join(f"-e {shlex.quote(line)}" for line in lines)


@dataclass
class Part:
    """A piece of a text typed after its spare keys are mapped (``remap``: qcode -> character)."""

    remap: dict[str, str]
    text: str


@dataclass
class Plan:
    parts: list[Part] = field(default_factory=list)

    @property
    def remaps(self) -> int:
        return sum(1 for p in self.parts if p.remap)

    @property
    def first_unicode(self) -> str | None:
        return next((ch for p in self.parts for ch in p.text if not on_keyboard(ch)), None)


def plan(text: str, mapped: dict[str, str]) -> Plan:
    """How to type ``text`` given what the spare keys carry now (``mapped``: qcode -> character): its parts, each
    with the keys to map before it. A key keeps its character while the part being planned uses it; a new one
    goes to an unmapped key first, then to one whose character the rest of the text does not need."""
    now = dict(mapped)
    out = Plan()
    part = Part({}, "")
    used: set[str] = set()  # keys whose characters this part types
    for i, ch in enumerate(text):
        if not on_keyboard(ch) and ch not in ALLOWED_CONTROLS:
            code = next((c for c, held in now.items() if held == ch), None)
            if code is None:
                free = [c for c, _ in SPARE_KEYS if c not in used]
                if not free:  # every spare key holds a character of this part: the next part starts here
                    out.parts.append(part)
                    part, used = Part({}, ""), set()
                    free = [c for c, _ in SPARE_KEYS]
                rest = text[i + 1 :]
                code = min(free, key=lambda c: (c in now, c in now and now[c] in rest))
                now[code] = ch
                part.remap[code] = ch
            used.add(code)
        part.text += ch
    out.parts.append(part)
    return out
