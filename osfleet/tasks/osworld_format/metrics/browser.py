"""Metrics on Chrome's state (tabs, URLs, bookmarks, cookies, history, settings) and on web pages.

URLs compare as OSWorld's ``compare_urls`` does: a missing scheme reads as ``http://``, the host loses
``www.`` when that is its only subdomain and loses its public suffix (``airbnb.com`` and ``airbnb.com.sg``
are the same site; the suffix list is the one tldextract ships, never fetched), a path ``/`` counts as
none, and the query and fragment count.

- ``is_expected_active_tab``: the active tab's URL (a string, or a getter's ``{"url"}``) is ``rules.url``.
- ``is_expected_url_pattern_match``: every regular expression of ``rules.expected`` is found in the URL.
- ``is_expected_search_query``: ``rules.expect.pattern`` is found in the active tab's URL.
- ``is_expected_tabs``: as many open tabs as ``rules.urls`` and each of those URLs is one of theirs.
- ``is_expected_bookmarks``: the bookmark bar's folder names (``bookmark_bar_folders_names``) or site URLs
  (``bookmark_bar_websites_urls``) are, as a set, the rule's; ``liked_authors_websites_urls``: the
  "Liked Authors" folder holds one URL of each of the rule's alternatives, and nothing else.
- ``is_expected_installed_extensions``: every name of ``rules.expected`` is installed.
- ``is_cookie_deleted``: no cookie's host is one of ``rules.domains``; ``check_history_deleted``: no
  visited URL contains one of ``rules.keywords``.
- ``check_enabled_experiments``: the enabled experiments (``name@n``) are ``rules.names``, in order;
  ``check_font_size``: the default font size equals ``rules.value`` or lies strictly between ``rules.min``
  and ``rules.max``.
- ``is_shortcut_on_desktop``: a desktop file has the line ``Name=<rules.name>`` (or ``Exec=<rules.exec>``).
- ``is_added_to_steam_cart``: the page text holds every one of ``rules.items``.
- ``compare_htmls``: two HTML files have the same elements (names, texts, attributes; option
  ``ignore_sdnum``) as far as the shorter goes; ``check_html_background_image``: a ``<style>`` of the page
  sets ``background-image: url('<rules.value>')``.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from typing import Any
from urllib.parse import ParseResult, urlparse, urlunparse

from osfleet.tasks.osworld_format.metrics.common import CannotScore, Metric, Score, read_text, scored, short

MAX_COMBINATIONS = 1_000_000  # liked_authors_websites_urls tries every combination of the alternatives


@functools.cache
def _suffixes() -> Any:
    import tldextract

    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


def _normal_url(url: str, full: bool) -> str:
    if not re.match(r"^[a-zA-Z][a-zA-Z0-9+\-.]*://", url):
        url = f"http://{url}"
    parsed = urlparse(url)
    host = _suffixes()(parsed.netloc.lower())
    subdomain = "" if host.subdomain == "www" else host.subdomain
    netloc = f"{subdomain}.{host.domain}" if subdomain else host.domain
    return urlunparse(
        ParseResult(
            scheme=parsed.scheme.lower(),
            netloc=netloc,
            path=parsed.path if parsed.path != "/" else "",
            params=parsed.params if full else "",
            query=parsed.query if full else "",
            fragment=parsed.fragment if full else "",
        )
    )


def same_url(a: Any, b: Any, full: bool = True) -> bool:
    """OSWorld's ``compare_urls`` (see the module's docstring)."""
    if a is None or b is None:
        return bool(a == b)
    return _normal_url(a, full) == _normal_url(b, full)


@scored()
def is_expected_active_tab(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result:
        return 0.0, "no active tab"
    if expected["type"] != "url":
        return 0.0, f"unknown rule type {short(expected['type'])}"
    url = result.get("url", None) if isinstance(result, dict) else result
    ok = same_url(expected["url"], url)
    return float(ok), f"active tab {short(url)}, expected {short(expected['url'])}"


def _without_query(url: Any) -> str:
    from urllib.parse import urlparse, urlunparse

    return urlunparse(urlparse(url)._replace(query=""))


@scored()
def is_expected_active_tab_approximate(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result:
        return 0.0, "no active tab"
    if expected["type"] != "url":
        return 0.0, f"unknown rule type {short(expected['type'])}"
    url = result.get("url", None) if isinstance(result, dict) else result
    ok = _without_query(expected["url"]) == _without_query(url)
    return float(ok), f"active tab {short(url)}, expected {short(expected['url'])} (queries ignored)"


@scored()
def is_expected_url_pattern_match(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result:
        return 0.0, "no URL"
    if isinstance(result, str):
        url = result
    elif isinstance(result, dict) and "url" in result:
        url = result["url"]
    else:
        return 0.0, f"no URL in {short(result)}"
    missing = []
    for pattern in expected["expected"]:
        if not re.search(pattern, url):
            missing.append(pattern)
            break
    return float(not missing), f"{short(url)} does not match {short(missing[0])}" if missing else "every pattern found"


@scored()
def is_expected_search_query(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result:
        return 0.0, "no active tab"
    pattern = expected["expect"]["pattern"]
    ok = re.search(pattern, result["url"]) is not None
    return float(ok), f"{short(result['url'])} {'matches' if ok else 'does not match'} {short(pattern)}"


@scored()
def is_expected_installed_extensions(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result:
        return 0.0, "no extensions"
    missing = set(expected["expected"]) - set(result)
    return float(not missing), f"not installed: {short(sorted(missing, key=str))}" if missing else "all installed"


def _every_url_matched(want: list[Any], got: list[Any]) -> bool:
    return len(want) == len(got) and all(any(same_url(w, g) for g in got) for w in want)


@scored()
def is_expected_tabs(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result:
        return 0.0, "no open tabs"
    if expected["type"] != "url":
        return 0.0, f"unknown rule type {short(expected['type'])}"
    got = [tab["url"] for tab in result]
    ok = _every_url_matched(expected["urls"], got)
    return float(ok), f"open tabs {short(got)}, expected {short(expected['urls'])}"


def _bar(bookmarks: Any, kind: str) -> list[Any]:
    return [b for b in bookmarks["bookmark_bar"]["children"] if b["type"] == kind]


@scored()
def is_expected_bookmarks(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result:
        return 0.0, "no bookmarks"
    kind = expected["type"]
    if kind == "bookmark_bar_folders_names":
        names = [b["name"] for b in _bar(result, "folder")]
        ok = set(names) == set(expected["names"])
        return float(ok), f"bookmark bar folders {short(names)}"
    if kind == "bookmark_bar_websites_urls":
        urls = [b["url"] for b in _bar(result, "url")]
        ok = set(urls) == set(expected["urls"])
        return float(ok), f"bookmark bar sites {short(urls)}"
    if kind == "liked_authors_websites_urls":
        folder = next((b for b in _bar(result, "folder") if b["name"] == "Liked Authors"), None)
        if folder is None:
            return 0.0, "no 'Liked Authors' folder on the bookmark bar"
        liked = {b["url"] for b in folder["children"] if b["type"] == "url"}
        alternatives = [[u] if isinstance(u, str) else u for u in expected["urls"]]
        if math.prod(len(a) for a in alternatives) > MAX_COMBINATIONS:
            raise CannotScore(f"more than {MAX_COMBINATIONS} combinations of liked authors' URLs")
        ok = any(set(choice) == liked for choice in itertools.product(*alternatives))
        return float(ok), f"'Liked Authors' holds {short(sorted(liked))}"
    raise CannotScore(f"is_expected_bookmarks has no type {short(kind)}")


@scored()
def is_cookie_deleted(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if expected["type"] != "domains":
        raise CannotScore(f"is_cookie_deleted has no type {short(expected['type'])}")
    hosts = [cookie[1] for cookie in result]
    for domain in expected["domains"]:
        for host in hosts:
            if same_url(domain, host):
                return 0.0, f"a cookie of {short(host)} is left"
    return 1.0, "no cookie of those domains"


@scored()
def check_history_deleted(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if expected["type"] != "keywords":
        raise CannotScore(f"check_history_deleted has no type {short(expected['type'])}")
    urls = [entry[0] for entry in result]
    for keyword in expected["keywords"]:
        for url in urls:
            if keyword in url:
                return 0.0, f"{short(url)} is still in the history"
    return 1.0, "no visit with those keywords"


@scored()
def check_enabled_experiments(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    names = [experiment.split("@")[0] for experiment in result]
    if expected["type"] != "names":
        raise CannotScore(f"check_enabled_experiments has no type {short(expected['type'])}")
    ok = names == expected["names"]
    return float(ok), f"enabled experiments {short(names)}"


@scored()
def check_font_size(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    size = result["default_font_size"]
    kind = expected["type"]
    if kind == "value":
        ok = size == expected["value"]
    elif kind == "range":
        ok = expected["min"] < size < expected["max"]
    else:
        raise CannotScore(f"check_font_size has no type {short(kind)}")
    return float(ok), f"default font size {short(size)}"


@scored()
def is_shortcut_on_desktop(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    kind = expected["type"]
    if kind not in ("name", "exec"):
        raise CannotScore(f"is_shortcut_on_desktop has no type {short(kind)}")
    line = ("Name=" if kind == "name" else "Exec=") + expected[kind] + "\n"
    for path, content in result.items():
        if line in content:
            return 1.0, f"{short(path)} has {short(line)}"
    return 0.0, f"no desktop file has {short(line)}"


@scored()
def is_added_to_steam_cart(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    items = expected["items"]
    content = result["content"]
    missing = [item for item in items if item not in content]
    return float(not missing), f"not in the cart: {short(missing)}" if missing else "every item in the cart"


def _same_element(a: Any, b: Any, ignore_sdnum: Any) -> bool:
    from bs4 import Tag

    if not (isinstance(a, Tag) and isinstance(b, Tag)):
        return bool(a == b)
    if a.name != b.name or a.text.strip() != b.text.strip():
        return False
    if a.attrs != b.attrs:
        if ignore_sdnum:
            return {k: v for k, v in a.attrs.items() if k != "sdnum"} == {
                k: v for k, v in b.attrs.items() if k != "sdnum"
            }
        return False
    return True


@scored(any_options=True)
def compare_htmls(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    from bs4 import BeautifulSoup

    a = BeautifulSoup(read_text(result), "lxml")
    b = BeautifulSoup(read_text(expected), "lxml")
    ignore_sdnum = options.get("ignore_sdnum")
    for x, y in zip(a.descendants, b.descendants, strict=False):
        if not _same_element(x, y, ignore_sdnum):
            return 0.0, f"the pages differ at {short(getattr(x, 'name', None) or str(x)[:60])}"
    return 1.0, "the pages are the same"


@scored("rule")
def check_html_background_image(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if not result:
        return 0.0, "no page"
    from bs4 import BeautifulSoup

    if "rule" in options and expected is not None:
        raise CannotScore("the rule is given twice (as the expected value and as an option)")
    rule = options.get("rule", expected)
    for style in BeautifulSoup(read_text(result), "html.parser").find_all("style"):
        if f"background-image: url('{rule['value']}')" in style.text:
            return 1.0, f"a style sets {short(rule['value'])} as the background image"
    return 0.0, "no style sets that background image"


METRICS: dict[str, Metric] = {
    "is_expected_active_tab_approximate": is_expected_active_tab_approximate,
    "is_expected_active_tab": is_expected_active_tab,
    "is_expected_url_pattern_match": is_expected_url_pattern_match,
    "is_expected_search_query": is_expected_search_query,
    "is_expected_installed_extensions": is_expected_installed_extensions,
    "is_expected_tabs": is_expected_tabs,
    "is_expected_bookmarks": is_expected_bookmarks,
    "is_cookie_deleted": is_cookie_deleted,
    "check_history_deleted": check_history_deleted,
    "check_enabled_experiments": check_enabled_experiments,
    "check_font_size": check_font_size,
    "is_shortcut_on_desktop": is_shortcut_on_desktop,
    "is_added_to_steam_cart": is_added_to_steam_cart,
    "compare_htmls": compare_htmls,
    "check_html_background_image": check_html_background_image,
}
_URLS = ("tldextract",)
NEEDS: dict[str, tuple[str, ...]] = {
    "is_expected_active_tab": _URLS,
    "is_expected_tabs": _URLS,
    "is_cookie_deleted": _URLS,
    "compare_htmls": ("bs4", "lxml"),
    "check_html_background_image": ("bs4",),
}
