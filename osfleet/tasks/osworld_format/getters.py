"""OSWorld's getters, run from the host: each turns a ``result``/``expected`` spec into a value for a metric,
as OSWorld's own getter of that name does (``desktop_env/evaluators/getters``), without its network access.

- Files (``vm_file``, single or ``multi`` with ``gives``; ``cloud_file``; ``cache_file``; the ones OSWorld saves
  as ``dest``: config files, VLC's status, the wallpaper, a slide's media) come as a local ``Path`` named like
  the task names it, ``None`` when the guest has no such file (the agent did not make it: scores 0, as in OSWorld);
  several files come as a list. They are read as the desktop user, as OSWorld's in-guest server (which runs as
  that user) reads them (``osfleet.tasks.guest_reads``); only ``cache_file`` reads osfleet's root-owned cache.
- Commands (``vm_command_line``/``vm_command_error``) run as the desktop user in its home folder, as OSWorld's
  server runs them, and give their standard output/error.
- The running desktop (Chrome's tabs and pages through its DevTools protocol, its profile files, the
  accessibility tree, VLC's HTTP interface) is asked by osfleet's query script in the guest (``guest_query``).
- ``rule``/``constant``/``time_diff_range`` give their own value; ``rule_relativeTime`` fills in its dates.

A guest that cannot be reached raises (an infrastructure failure, never a score). A value the guest cannot
give (a file over the read cap, a query that fails, a command the guest's own timeout killed because the desktop
did not answer in the getter's time) raises ``GetterValueError``: the metric scores 0 with that reason, as
OSWorld's getters return nothing there. (An untouched desktop that a slow getter made time out was answered
503 before: OSWorld-Verified's ``default_video_player`` asked ``xdg-mime`` 43 times, over 30 s under TCG.)
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from osfleet.errors import GuestCommandKilledError, OsfleetError
from osfleet.protocol.actions import MAX_READ_BYTES
from osfleet.tasks import guest_reads
from osfleet.tasks.assets import AssetStore
from osfleet.tasks.guest_reads import GuestAccess
from osfleet.tasks.osworld_format import guest_query
from osfleet.tasks.osworld_format.guest_paths import GUEST_HOME, shell_command
from osfleet.tasks.osworld_format.guest_writes import CACHE_DIR

CHROME_PROFILE = f"{GUEST_HOME}/.config/google-chrome"
VLC_CONFIG = f"{GUEST_HOME}/.config/vlc/vlcrc"
GIMP_CONFIG = f"{GUEST_HOME}/.config/GIMP/2.10"
# The video types OSWorld asks xdg-mime about for default_video_player, in its order: each twice but x-ogm+ogg
# (which can break a tie between two players).
_VIDEO = [
    "3gp", "3gpp", "3gpp2", "avi", "divx", "dv", "fli", "flv", "mp2t", "mp4", "mp4v-es", "mpeg", "mpeg-system",
    "msvideo", "ogg", "quicktime", "vnd.divx", "vnd.mpegurl", "vnd.rn-realvideo", "webm", "x-anim", "x-avi", "x-flc",
    "x-fli", "x-flv", "x-m4v", "x-matroska", "x-mpeg", "x-mpeg-system", "x-mpeg2", "x-ms-asf", "x-ms-asf-plugin",
    "x-ms-asx", "x-ms-wm", "x-ms-wmv", "x-ms-wmx", "x-ms-wvx", "x-msvideo", "x-nsv", "x-ogm",
]  # fmt: skip
VIDEO_TYPES = (*(t for ext in _VIDEO for t in (ext, ext)), "x-ogm+ogg", "x-theora", "x-theora", *("x-theora+ogg",) * 2)


class GetterValueError(OsfleetError):
    """The guest cannot give this value (a file over the read cap, a query that failed): the metric scores 0
    with this reason instead of running."""


@dataclass
class Context:
    host: GuestAccess
    rid: str
    workdir: Path
    store: AssetStore
    timeout: float

    def sh(self, command: str, as_root: bool = False) -> dict[str, Any]:
        try:
            return self.host.shell(self.rid, command, self.timeout, as_root)
        except GuestCommandKilledError as exc:
            raise GetterValueError(f"the guest did not answer in time: {exc}") from None

    def ask(self, op: str, **args: Any) -> Any:
        try:
            return guest_query.ask(self.host, self.rid, op, args, self.timeout)
        except guest_query.GuestQueryError as exc:
            raise GetterValueError(str(exc)) from None
        except GuestCommandKilledError as exc:
            raise GetterValueError(f"guest query {op}: the guest did not answer in time: {exc}") from None

    def local(self, name: str) -> Path:
        """A new file in the evaluation's folder, called ``name`` (metrics and their libraries go by names)."""
        base = PurePosixPath(name).name or "file"
        folder = self.workdir / str(len(list(self.workdir.iterdir())))
        folder.mkdir()
        return folder / base


def _sizes(ctx: Context, paths: list[str], as_root: bool = False) -> list[int | None]:
    """Each guest file's size, None where there is no regular file the desktop user may read (asked as that user,
    or as root for osfleet's own task cache): a probe before a guest query opens the file itself."""
    script = 'for p in "$@"; do if [ -f "$p" ] && [ -r "$p" ]; then stat -c %s -L -- "$p"; else echo -; fi; done'
    out = ctx.sh(f"sh -c {shlex.quote(script)} sh {' '.join(shlex.quote(p) for p in paths)}", as_root=as_root)
    words = out["stdout"].split()
    if len(words) != len(paths):
        raise GetterValueError(f"cannot tell whether {', '.join(paths)} exist: {out['stderr'].strip()[-200:]}")
    return [int(w) if w.isdigit() else None for w in words]


def fetch(ctx: Context, path: str, name: str) -> Path | None:
    """The guest file ``path`` as a local file called ``name``, read as the desktop user (``guest_reads``): None
    when the user has no regular file there it may read. A path the agent chose (a wallpaper's URI, a slide's
    linked file, a link it made in its home) so never reads what the user cannot (``/etc/shadow``, root's files),
    and a link swapped in after a look cannot win a race: the user's own open is the only one."""
    try:  # (a file over the cap raises GuestFileTooLargeError: the runner scores it 0, naming it)
        data = guest_reads.read_as_user(ctx.host, ctx.rid, path, MAX_READ_BYTES, ctx.timeout)
    except guest_reads.GuestReadRefused:
        return None
    except GuestCommandKilledError as exc:
        raise GetterValueError(f"the guest did not answer in time: {exc}") from None
    if data is None:
        return None
    local = ctx.local(name)
    local.write_bytes(data)
    return local


def _given(values: list[Any], gives: list[int]) -> Any:
    """OSWorld's ``gives``: the files at those positions, one as itself, several as a list."""
    picked = [values[i] for i in dict.fromkeys(gives) if i < len(values)]
    return picked[0] if len(picked) == 1 else picked


def _names(spec: dict[str, Any], paths: list[str]) -> list[str]:
    dest = spec.get("dest")
    names = dest if isinstance(dest, list) else [dest] * len(paths)
    return [str(n) if n else PurePosixPath(p.split("?")[0]).name for n, p in zip(names, paths, strict=False)]


def vm_file(ctx: Context, spec: dict[str, Any]) -> Any:
    paths = spec["path"] if spec.get("multi") else [spec["path"]]
    names = _names(spec, paths)
    if spec.get("time_suffix") and not spec.get("multi"):
        stem, dot, ext = names[0].rpartition(".")
        stamp = dt.datetime.now().strftime(str(spec.get("time_format") or "%Y%m%d_%H%M%S"))
        names = [f"{stem}_{stamp}.{ext}" if dot else f"{names[0]}_{stamp}"]
    files = [fetch(ctx, p, n) for p, n in zip(paths, names, strict=True)]
    return _given(files, spec.get("gives") or [0])


def cloud_file(ctx: Context, spec: dict[str, Any]) -> Any:
    urls = spec["path"] if spec.get("multi") else [spec["path"]]
    files = []
    for url, name in zip(urls, _names(spec, urls), strict=True):
        link = ctx.local(name)
        link.symlink_to(ctx.store.path(url))
        files.append(link)
    return _given(files, spec.get("gives") or [0])


def cache_file(ctx: Context, spec: dict[str, Any]) -> Path | None:
    """A file of osfleet's task cache, which root writes and the desktop user may not even list (the agent must
    not rewrite, or read, what set-up kept there): the one getter that reads as root, so the name must stay inside
    the cache, where only root writes (the task's own set-up output; nothing the agent can link elsewhere)."""
    name = str(spec["path"])
    parts = PurePosixPath(name).parts
    if not parts or PurePosixPath(name).is_absolute() or ".." in parts:
        raise GetterValueError(f"cache_file {name!r}: a name inside the task cache is expected")
    path = f"{CACHE_DIR}/{name}"
    size = _sizes(ctx, [path], as_root=True)[0]
    if size is None:
        return None
    if size > MAX_READ_BYTES:
        raise GetterValueError(f"{path} is {size} bytes, over the {MAX_READ_BYTES} bytes a getter reads")
    local = ctx.local(name)
    local.write_bytes(ctx.host.read_file(ctx.rid, path, MAX_READ_BYTES))
    return local


def _command_output(stream: str) -> Callable[[Context, dict[str, Any]], Any]:
    def get(ctx: Context, spec: dict[str, Any]) -> Any:
        return ctx.sh(shell_command(spec["command"], spec.get("shell", False)))[stream]

    return get


def window_size(ctx: Context, spec: dict[str, Any]) -> dict[str, int] | None:
    cls = shlex.quote(str(spec["app_class_name"]))
    out = ctx.sh(
        f"w=$(xdotool search --onlyvisible --class {cls} 2>/dev/null | head -n 1); "
        '[ -n "$w" ] && xdotool getwindowgeometry --shell "$w"'
    )
    size = dict(re.findall(r"^(WIDTH|HEIGHT)=(\d+)$", out["stdout"], re.MULTILINE))
    if "WIDTH" not in size or "HEIGHT" not in size:
        return None
    return {"width": int(size["WIDTH"]), "height": int(size["HEIGHT"])}


SCREEN_COMMAND = "xdotool getdisplaygeometry"


def _geometry(out: dict[str, Any]) -> tuple[int, int] | None:
    words = out["stdout"].split()
    if len(words) != 2 or not all(w.isdigit() and len(w) <= 5 for w in words):
        return None
    return int(words[0]), int(words[1])


def guest_screen(host: GuestAccess, rid: str, timeout: float) -> tuple[int, int] | None:
    """The guest's X screen as (width, height), as the desktop itself reports it; None when it cannot say."""
    return _geometry(host.shell(rid, SCREEN_COMMAND, timeout))


def screen_size(ctx: Context, spec: dict[str, Any]) -> dict[str, int] | None:
    size = _geometry(ctx.sh(SCREEN_COMMAND))
    return {"width": size[0], "height": size[1]} if size else None


def wallpaper(ctx: Context, spec: dict[str, Any]) -> Path:
    """The wallpaper's picture file (GNOME's picture-uri, as OSWorld reads it); an empty file when there is none."""
    uri = ctx.sh("gsettings get org.gnome.desktop.background picture-uri 2>/dev/null")["stdout"]
    path = unquote(uri.strip().replace("file://", "").replace("'", ""))
    found = fetch(ctx, path, str(spec.get("dest") or "wallpaper")) if path.startswith("/") else None
    if found is None:
        found = ctx.local(str(spec.get("dest") or "wallpaper"))
        found.write_bytes(b"")
    return found


def _guest_file(path: str) -> Callable[[Context, dict[str, Any]], Any]:
    def get(ctx: Context, spec: dict[str, Any]) -> Path | None:
        return fetch(ctx, path, str(spec.get("dest") or PurePosixPath(path).name))

    return get


def gimp_config(ctx: Context, spec: dict[str, Any]) -> Path | None:
    return fetch(ctx, f"{GIMP_CONFIG}/{spec['file_name']}", str(spec.get("dest") or spec["file_name"]))


def vscode_config(ctx: Context, spec: dict[str, Any]) -> Path | None:
    """Run a command of VS Code's command palette (keys typed by pyautogui in the guest, as OSWorld does), then
    read the file it writes."""
    keys = (
        "import pyautogui, time; pyautogui.hotkey('ctrl', 'shift', 'p'); "
        f"pyautogui.typewrite({spec['vscode_extension_command']!r}); pyautogui.press('enter'); time.sleep(1)"
    )
    ctx.sh(shlex.join(["python3", "-c", keys]))
    return fetch(ctx, spec["path"], str(spec.get("dest") or PurePosixPath(spec["path"]).name))


def slide_media(ctx: Context, spec: dict[str, Any]) -> Path | None:
    if _sizes(ctx, [spec["ppt_file_path"]])[0] is None:
        return None
    found = ctx.ask("slide_media", path=spec["ppt_file_path"], slide_index=spec["slide_index"], kind=spec["type"])
    if found is None:
        return None
    path = found["linked"] if isinstance(found, dict) else str(found)
    return fetch(ctx, path, str(spec.get("dest") or PurePosixPath(path).name))


def vlc_playing_info(ctx: Context, spec: dict[str, Any]) -> Path | None:
    status = ctx.ask("vlc_status")
    if status is None:
        return None
    local = ctx.local(str(spec.get("dest") or "status.xml"))
    local.write_text(str(status))
    return local


def content_from_vm_file(ctx: Context, spec: dict[str, Any]) -> Any:
    if _sizes(ctx, [spec["path"]])[0] is None:
        return None
    return ctx.ask("xlsx_last_row", path=spec["path"])


# --- Chrome ---------------------------------------------------------------------------------------------------
def omnibox_text(url: str) -> str:
    """The URL as Chrome's address bar shows it, which is what OSWorld reads from the accessibility tree (its
    tasks put the elided ``https://www.`` back with ``goto_prefix``): no http(s) scheme, no leading ``www.``,
    no lone trailing slash."""
    text = re.sub(r"^https?://", "", url)
    if text != url:
        text = re.sub(r"^www\.", "", text)
        host, slash, rest = text.partition("/")
        text = host if slash and not rest else text
    return text


def active_url(ctx: Context, spec: dict[str, Any]) -> str | None:
    url = ctx.ask("chrome_active_url")
    if not url:
        return None
    return f"{spec.get('goto_prefix', 'https://')}{omnibox_text(str(url))}"


def active_tab_info(ctx: Context, spec: dict[str, Any]) -> Any:
    url = active_url(ctx, spec)
    return ctx.ask("chrome_page", url=url) if url else None


def active_tab_url_parse(ctx: Context, spec: dict[str, Any]) -> dict[str, Any] | None:
    url = active_url(ctx, spec)
    if url is None:
        return None
    query = parse_qs(urlparse(url).query)
    params: dict[str, Any] = {key: query.get(key, [""])[0] for key in spec["parse_keys"]}
    for old, new in (spec.get("replace") or {}).items():
        params[new] = params.pop(old)
    if spec.get("split_list"):
        params = {k: str(v).split(",") for k, v in params.items()}
    return params


def url_path_parse(ctx: Context, spec: dict[str, Any]) -> dict[str, Any] | None:
    """OSWorld's url_path_parse (macys_product_url_parse): facets written in the path of a Macy's URL."""
    url = active_url(ctx, spec)
    if url is None:
        return None
    path = unquote(urlparse(url).path)
    parts = path.strip("/").split("/")
    facets: dict[str, Any] = {}
    shirts, short_sleeve = "shirts" in path, "short-sleeve" in path
    for a, b in zip(parts, parts[1:], strict=False):
        if "," in a and "," in b:
            for k, v in zip((x.strip() for x in a.split(",")), (x.strip() for x in b.split(",")), strict=False):
                if k == "Price_discount_range":
                    facets[k] = [i.strip() for i in v.split("|")] if v else None
                else:
                    facets[k] = v or None
                shirts |= k == "Product_department" and v in ("shirts", "Shirts", "Shirt")
                short_sleeve |= k == "Sleeve_length" and v in ("short-sleeve", "Short Sleeve")
            break
    result: dict[str, Any] = {
        "mens_clothing": True if "mens-clothing" in path else None,
        "shirts": True if shirts else None,
        "short_sleeve": True if short_sleeve else None,
    }
    for key in spec["parse_keys"]:
        if key == "Price_discount_range" and key in facets:
            got = facets[key] or []
            fifty = "50_PERCENT_ off & more"
            only_50 = fifty in got and not any(p in got for p in ("30_PERCENT_ off & more", "20_PERCENT_ off & more"))
            result[key] = fifty if only_50 else "not_50_PERCENT_ off & more"
        elif key in facets:
            result[key] = facets[key]
        elif key in ("Men_regular_size_t", "Price_discount_range"):
            result[key] = None
    return result


def url_dash_part(ctx: Context, spec: dict[str, Any]) -> Any:
    url = active_url(ctx, spec)
    if url is None:
        return None
    try:
        index = int(spec["partIndex"])
    except (TypeError, ValueError):
        return None
    parts = url.split("/")
    if index >= len(parts):
        return None
    part = parts[index].split("?")[0] if spec.get("needDeleteId") else parts[index]
    return part if spec["returnType"] == "string" else {spec.get("key", ""): part}


def html_parse(ctx: Context, spec: dict[str, Any]) -> Any:
    url = active_url(ctx, spec)
    if url is None:
        return None
    return ctx.ask("chrome_html_parse", url=url, spec=spec, js=guest_query.html_parse_js())


def info_from_website(ctx: Context, spec: dict[str, Any]) -> Any:
    """The page's values, or the task's ``backups`` when they cannot be read (OSWorld's own fallback)."""
    try:
        return ctx.ask("chrome_info_from_website", url=spec["url"], infos=spec.get("infos", []))
    except GetterValueError:
        return spec.get("backups")


def _ask(op: str, **fixed: Any) -> Callable[[Context, dict[str, Any]], Any]:
    def get(ctx: Context, spec: dict[str, Any]) -> Any:
        return ctx.ask(op, **fixed)

    return get


def _pref(ctx: Context, spec: dict[str, Any]) -> Any:
    return ctx.ask("chrome_pref", getter=spec["type"])


# --- rules ----------------------------------------------------------------------------------------------------
def _timezone(ctx: Context, rules: dict[str, Any]) -> dt.tzinfo:
    """The rule's timezone, else the guest's (what its clock shows the agent; OSWorld guesses one from the
    evaluating machine's IP address and falls back to UTC)."""
    name = rules.get("timezone") or ctx.sh("cat /etc/timezone 2>/dev/null")["stdout"].strip() or "UTC"
    try:
        return ZoneInfo(str(name))
    except (ZoneInfoNotFoundError, ValueError):
        return dt.UTC


def _next_month(now: dt.datetime, day: int) -> dt.datetime:
    year, month = (now.year + 1, 1) if now.month == 12 else (now.year, now.month + 1)
    return dt.datetime(year, month, day, tzinfo=now.tzinfo)


def _months_later_monday(now: dt.datetime, months: int) -> dt.datetime:
    """The first Monday ``months`` months on (OSWorld's modulo gives month 0 for December; December is meant)."""
    month = (now.month + months - 1) % 12 + 1
    first = dt.datetime(now.year + (1 if now.month + months > 12 else 0), month, 1, tzinfo=now.tzinfo)
    return first + dt.timedelta(days=(7 - first.weekday()) % 7)


def _relative_day(name: str, now: dt.datetime, start: tuple[str, dt.datetime] | None = None) -> dt.datetime:
    """One of OSWorld's relative dates (``rule_relativeTime``), with its own rules for each phrase."""
    wd = now.weekday()
    days: dict[str, int] = {
        "tomorrow": 1,
        "this Saturday": 5 - wd,
        "this Sunday": 6 - wd,
        "next Monday": 7 - wd,
        "next Monday split": 7 - wd,
        "next week Friday": 7 - wd + 4,
        "next week Saturday": 7 - wd + 5,
        "next week Sunday": 7 - wd + 6,
        "next Friday": (4 - wd) if wd < 4 else (7 if wd == 4 else 7 - wd + 4),
        "next Saturday": (5 - wd) if wd < 5 else (7 if wd == 5 else 6),
        "next Sunday": 6 - wd if wd < 6 else 7,
    }
    first, day = start if start is not None else ("", now)
    if name in ("next Friday", "next Friday split") and first in ("next Monday", "next Monday split"):
        return day + dt.timedelta(days=4)  # the Friday of the week that starts on the "from" Monday
    same_weekend = {
        "next Sunday": ("next Friday", "next Saturday"),
        "next week Sunday": ("next week Friday", "next week Saturday"),
    }
    if first in same_weekend.get(name, ()):
        return day + dt.timedelta(days=6 - day.weekday())  # the Sunday of the same weekend
    if name == "next Friday split":
        return now + dt.timedelta(days=4 - wd if wd < 4 else 6 - wd + 5)
    if name == "this month":
        return now
    if name in ("5th next month", "10th next month", "11th next month"):
        return _next_month(now, int(name.split("th")[0]))
    if name == "first monday four months later":
        return _months_later_monday(now, 4)
    if name == "first monday eight months later":
        return _months_later_monday(now, 8)
    if name in days:
        return now + dt.timedelta(days=days[name])
    raise GetterValueError(f"rule_relativeTime: OSWorld has no relative time {name!r}")


def time_format(fmt: str, day: dt.datetime) -> str:
    """OSWorld's placeholders for a date in an expected text (each replaced once, in its order)."""
    for key, value in (
        ("{DoW}", calendar.day_abbr[day.weekday()]),
        ("{Month}", calendar.month_abbr[day.month]),
        ("{DayD}", str(day.day)),
        ("{Year}", str(day.year)),
        ("{Month0D}", f"{day.month:02d}"),
        ("{month}", calendar.month_name[day.month].lower()),
        ("{MonthFull}", calendar.month_name[day.month]),
        ("{Day0D}", f"{day.day:02d}"),
        ("{MonthD}", str(day.month)),
    ):
        fmt = fmt.replace(key, value, 1)
    return fmt


def rule_relative_time(ctx: Context, spec: dict[str, Any]) -> dict[str, Any]:
    rules = dict(spec["rules"])
    expected = dict(rules.get("expected") or {})
    when = rules["relativeTime"]
    now = dt.datetime.now(_timezone(ctx, rules))
    start = _relative_day(when["from"], now)
    if not when.get("to"):
        expected["time"] = time_format(str(expected.get("time", "")), start)
    else:
        end = _relative_day(when["to"], now, (when["from"], start))
        if when["from"] == "next Monday split":
            for k in ("puDay", "puMonth", "puYear"):
                expected[k] = time_format(str(expected.get(k, "")), start)
        else:
            expected["from"] = time_format(str(expected.get("from", "")), start)
        if when["to"] == "next Friday split":
            for k in ("doDay", "doMonth", "doYear"):
                expected[k] = time_format(str(expected.get(k, "")), end)
        else:
            expected["to"] = time_format(str(expected.get("to", "")), end)
    rules["expected"] = expected
    return rules


GETTERS: dict[str, Callable[[Context, dict[str, Any]], Any]] = {
    "vm_file": vm_file,
    "cloud_file": cloud_file,
    "cache_file": cache_file,
    "vm_command_line": _command_output("stdout"),
    "vm_command_error": _command_output("stderr"),
    "vm_terminal_output": _ask("terminal_output"),
    "rule": lambda ctx, spec: spec.get("rules"),
    "rule_relativeTime": rule_relative_time,
    "constant": lambda ctx, spec: spec.get("value"),
    "time_diff_range": lambda ctx, spec: spec.get("diff_range_in_minutes"),
    "accessibility_tree": _ask("accessibility_tree"),
    "vm_screen_size": screen_size,
    "vm_window_size": window_size,
    "vm_wallpaper": wallpaper,
    "list_directory": lambda ctx, spec: ctx.ask("list_directory", path=spec["path"]),
    "shortcuts_on_desktop": _ask("shortcuts_on_desktop"),
    "default_video_player": _ask("default_video_player", types=VIDEO_TYPES),
    "vlc_config": _guest_file(VLC_CONFIG),
    "vlc_playing_info": vlc_playing_info,
    "gimp_config_file": gimp_config,
    "vscode_config": vscode_config,
    "audio_in_slide": slide_media,
    "background_image_in_slide": slide_media,
    "content_from_vm_file": content_from_vm_file,
    "open_tabs_info": _ask("chrome_tabs"),
    "chrome_appearance_mode_ui": _ask("chrome_appearance_mode"),
    "bookmarks": _ask("chrome_bookmarks"),
    "history": _ask("chrome_history"),
    "cookie_data": _ask("chrome_cookies"),
    "active_url_from_accessTree": active_url,
    "active_tab_info": active_tab_info,
    "active_tab_url_parse": active_tab_url_parse,
    "url_path_parse": url_path_parse,
    "macys_product_url_parse": url_path_parse,
    "url_dashPart": url_dash_part,
    "active_tab_html_parse": html_parse,
    "page_info": lambda ctx, spec: ctx.ask("chrome_page", url=spec["url"]),
    "info_from_website": info_from_website,
    **{
        name: _pref
        for name in (
            "profile_name",
            "default_search_engine",
            "chrome_font_size",
            "chrome_language",
            "enabled_experiments",
            "enable_do_not_track",
            "enable_enhanced_safety_browsing",
            "enable_safe_browsing",
            "new_startup_page",
            "data_delete_automacally",
            "find_unpacked_extension_path",
            "find_installed_extension_name",
        )
    },
}


def get(host: GuestAccess, rid: str, spec: dict[str, Any], workdir: Path, store: AssetStore, timeout: float) -> Any:
    """The value of one getter ``spec`` (an OSWorld result/expected object as the converter left it)."""
    kind = spec.get("type")
    getter = GETTERS.get(str(kind))
    if getter is None:
        raise OsfleetError(f"unsupported OSWorld getter {kind!r}")
    return getter(Context(host, rid, workdir, store, timeout), spec)
