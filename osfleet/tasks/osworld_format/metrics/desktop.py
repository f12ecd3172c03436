"""Metrics on the desktop's state: GNOME settings, the time zone, folders, the accessibility tree.

- ``check_gnome_favorite_apps``: gsettings' list of favourite apps (``['a.desktop', 'b.desktop']``) holds
  exactly ``rules.expected``, in any order. OSWorld ``eval``s the guest's output; osfleet reads it as a
  Python literal only (``ast.literal_eval``), so output that is code, not a literal, scores 0 here.
- ``is_utc_0``: the fourth line of ``timedatectl status`` ends with ``+0000)``.
- ``check_text_enlarged``: the text scaling factor is above 1.
- ``check_moved_jpgs``: the folder listing (``{"children": [{"name"}...]}``) holds exactly
  ``rules.expected``, in any order.
- ``check_accessibility_tree``: every rule of the list (``xpath``, or CSS ``selectors`` joined with
  commas, in the AT-SPI namespaces of option ``osname``, ``ubuntu`` by default) selects some element; with
  ``text``, the best of those elements' texts equals it (``exact``) or its fuzzy ratio counts; the score is
  the product. The XML is parsed without resolving entities (hostile input), which OSWorld's parser does.
(GIMP's ``check_config_status`` lives with the other configuration-file metrics, in ``office_config``.)
"""

from __future__ import annotations

import ast
from typing import Any

from osfleet.tasks.osworld_format.metrics.common import Metric, Score, scored, short


@scored()
def check_gnome_favorite_apps(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    apps = ast.literal_eval(result)
    want = expected["expected"]
    ok = len(apps) == len(want) and set(apps) == set(want)
    return float(ok), f"favourites {short(apps)}, expected {short(want)}"


@scored()
def is_utc_0(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    line = result.split("\n")[3]
    ok = line.endswith("+0000)")
    return float(ok), f"time zone line {short(line)}"


@scored()
def check_text_enlarged(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    factor = float(result)
    return float(factor > 1.0), f"text scaling factor {factor}"


@scored()
def check_moved_jpgs(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    want = expected["expected"]
    names = [node["name"] for node in result["children"]]
    ok = len(names) == len(want) and set(names) == set(want)
    return float(ok), f"folder holds {short(names)}, expected {short(want)}"


_AT_SPI = "https://accessibility.{}.example.org/ns/"
_NAMESPACES = {
    "ubuntu": ("st", "attr", "cp", "doc", "docattr", "txt", "val", "act"),
    "windows": ("st", "attr", "cp", "doc", "docattr", "txt", "val", "act", "class"),
    "macos": ("st", "attr", "cp", "doc", "txt", "val", "act", "role"),
}
_PATHS = {"st": "state", "attr": "attributes", "cp": "component", "doc": "document", "docattr": "document/attributes"}
_PATHS |= {"txt": "text", "val": "value", "act": "action", "class": "class", "role": "role"}


def _namespaces(osname: str) -> dict[str, str]:
    return {prefix: _AT_SPI.format(osname) + _PATHS[prefix] for prefix in _NAMESPACES[osname]}


@scored("osname")
def check_accessibility_tree(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    import lxml.etree
    from lxml.cssselect import CSSSelector
    from rapidfuzz import fuzz

    namespaces = _namespaces(options.get("osname", "ubuntu"))
    parser = lxml.etree.XMLParser(resolve_entities=False, no_network=True)
    root = lxml.etree.fromstring(result, parser)
    total = 1.0
    for rule in expected:
        if "xpath" in rule:
            elements = root.xpath(rule["xpath"], namespaces=namespaces)
        elif "selectors" in rule:
            elements = CSSSelector(", ".join(rule["selectors"]), namespaces=namespaces)(root)
        else:
            return 0.0, "a rule has neither xpath nor selectors"
        if len(elements) == 0:
            return 0.0, f"nothing matches {short(rule.get('xpath', rule.get('selectors')))}"
        if "text" in rule:
            exact, text = rule["exact"], rule["text"]
            best: float = 0
            for element in elements:
                got = element.text or None
                best = max(best, (text == got) if exact else fuzz.ratio(text, got) / 100.0)  # type: ignore[arg-type]
            total *= best
    return total, f"accessibility tree score {total}"


METRICS: dict[str, Metric] = {
    "check_gnome_favorite_apps": check_gnome_favorite_apps,
    "is_utc_0": is_utc_0,
    "check_text_enlarged": check_text_enlarged,
    "check_moved_jpgs": check_moved_jpgs,
    "check_accessibility_tree": check_accessibility_tree,
}
NEEDS: dict[str, tuple[str, ...]] = {"check_accessibility_tree": ("lxml", "cssselect", "rapidfuzz")}
