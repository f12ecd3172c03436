"""Application settings read from their configuration files: LibreOffice's ``registrymodifications.xcu``
(Writer's default font, Impress' presenter console, the autosave interval) and GIMP's ``gimprc``-style files.

Semantics, as OSWorld's:
- ``find_default_font``: the last ``Standard`` value under ``/org.openoffice.Office.Writer/DefaultFont`` is
  ``rules.font_name`` (a file that does not parse has no font);
- ``check_presenter_console_disable``: the first ``EnablePresenterScreen`` under
  ``/org.openoffice.Office.Impress/Misc/Start`` is ``false``;
- ``check_auto_saving_time``: the ``AutoSaveTimeIntervall`` under ``/org.openoffice.Office.Common/Save/Document``
  (the last such item's) is ``rules.minutes``; a file that does not parse scores 0;
- ``check_config_status``: some line of the GIMP file, outside comments, reads ``(key ... value)`` with
  ``rules.key`` first (or ``rules.key``'s two words first) and ``rules.value`` last; a blank line that is not
  empty, or a one-word line when two words are wanted, cannot be read and scores 0.
"""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from typing import Any

from osfleet.tasks.osworld_format.metrics.common import NotScored, Score, file_arg, guarded

OOR = "http://openoffice.org/2001/registry"


def _rules(expected: Any) -> dict[str, Any]:
    if not isinstance(expected, dict):
        raise NotScored(f"needs rules (a dict), got {type(expected).__name__}")
    return expected


def _items(root: Any, path: str) -> list[Any]:
    return [item for item in root.iter("item") if item.get(f"{{{OOR}}}path") == path and item is not root]


@guarded("find_default_font")
def find_default_font(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    wanted = _rules(expected)["font_name"]
    path = file_arg(result)
    if not path:
        return 0.0, "no configuration file"
    font = None
    try:
        root = ET.parse(path).getroot()
        for item in _items(root, "/org.openoffice.Office.Writer/DefaultFont"):
            for prop in item.iter("prop"):
                if prop is not item and prop.get(f"{{{OOR}}}name") == "Standard":
                    for value in prop.findall("value"):
                        font = value.text
    except Exception:  # noqa: BLE001  (OSWorld: a file it cannot read has no default font)
        font = None
    if font == wanted:
        return 1.0, f"Writer's default font is {wanted!r}"
    return 0.0, f"Writer's default font is {font!r}, not {wanted!r}"


@guarded("check_presenter_console_disable")
def check_presenter_console_disable(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    try:
        root = ET.parse(file_arg(result)).getroot()  # type: ignore[arg-type]
        for item in root.findall(f".//item[@{{{OOR}}}path='/org.openoffice.Office.Impress/Misc/Start']"):
            for prop in item.findall(f"prop[@{{{OOR}}}name='EnablePresenterScreen']"):
                value = prop.find("value").text  # type: ignore[union-attr]
                if value.lower() == "false":  # type: ignore[union-attr]
                    return 1.0, "the presenter console is disabled"
                return 0.0, f"EnablePresenterScreen is {value!r}"
    except Exception as exc:  # noqa: BLE001  (OSWorld: a file it cannot read scores 0)
        return 0.0, f"cannot read the configuration ({type(exc).__name__})"
    return 0.0, "EnablePresenterScreen is not set"


@guarded("check_auto_saving_time")
def check_auto_saving_time(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    minutes = _rules(expected)["minutes"]
    path = file_arg(result)
    if path is None:
        raise NotScored("no configuration file")
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, FileNotFoundError) as exc:
        raise NotScored(f"cannot read the configuration ({type(exc).__name__})") from None
    interval = None
    for item in root.findall(".//item"):
        if item.get(f"{{{OOR}}}path") == "/org.openoffice.Office.Common/Save/Document":
            for prop in item.findall(".//prop"):
                if prop.get(f"{{{OOR}}}name") == "AutoSaveTimeIntervall":
                    interval = prop.find(".//value").text  # type: ignore[union-attr]
                    break
    if interval is None:
        return 0.0, "no autosave interval set"
    if int(interval) == minutes:
        return 1.0, f"autosave every {minutes} minutes"
    return 0.0, f"autosave every {interval} minutes, not {minutes}"


@guarded("check_config_status")
def check_config_status(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    path = file_arg(result)
    if path is None:
        return 0.0, "no configuration file"
    rule = _rules(expected)
    key, wanted = rule["key"], rule["value"]
    with open(path, "rb") as f:
        lines = io.TextIOWrapper(io.BytesIO(f.read()), encoding="utf-8").readlines()  # as open(path) reads it
    for line in lines:
        if line.startswith("#") or line == "\n":
            continue
        words = line.strip().lstrip("(").rstrip(")\n").split()
        if isinstance(key, str):
            if words[0] == key and words[-1] == wanted:
                return 1.0, f"{key} is {wanted}"
        elif (
            isinstance(key, list)
            and len(key) == 2
            and words[0] == key[0]
            and words[1] == key[1]
            and words[-1] == wanted
        ):
            return 1.0, f"{' '.join(key)} is {wanted}"
    return 0.0, f"no line sets {key} to {wanted}"


METRICS = {
    "find_default_font": find_default_font,
    "check_presenter_console_disable": check_presenter_console_disable,
    "check_auto_saving_time": check_auto_saving_time,
    "check_config_status": check_config_status,
}
