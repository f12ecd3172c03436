"""osfleet's query script, run inside the guest as the desktop user: ``/usr/bin/python3 -I -S -c <this> OP ARGS``.

Replicas have no network device, so what OSWorld's evaluator reaches over the network (Chrome's DevTools
port, VLC's HTTP interface, its in-VM server's accessibility endpoint) is asked from inside the guest by this
script, started through the guest agent; it prints one JSON document, ``{"value": ...}`` or ``{"error": ...}``,
and the host reads nothing else. Profile files (Chrome's History, Cookies, Preferences, Bookmarks) are read
here too, so the host never opens a database the agent could have written.

Only Python's standard library is imported at the top: DevTools needs ``websocket`` (Debian's
python3-websocket) and the accessibility tree needs ``pyatspi`` (python3-pyatspi), each imported by the
operations that use them. Every wait is bounded by ``deadline`` (seconds, given by the host in ARGS).
This file is shipped as package data and sent whole with each call: nothing is installed in the guest.
"""

import sys


def _system_packages():
    """Debian's package folders, root-owned: the host runs this script with ``python3 -I -S`` (no ``site``, so
    nothing of the desktop user's: no user site-packages, no ``.pth``, no working folder), which leaves out the
    system's own packages too (python3-websocket, python3-pyatspi, the image's pip packages): added here, and
    only these. The process is made non-dumpable as well: another process of the desktop user (the agent's) can
    then neither trace it nor write its memory (``/proc/PID/mem``)."""
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for folder in (f"/usr/local/lib/python{minor}/dist-packages", "/usr/lib/python3/dist-packages"):
        if folder not in sys.path:
            sys.path.append(folder)
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    except (OSError, AttributeError):
        pass


_system_packages()

import base64  # noqa: E402 (after the package folders are fixed)
import collections  # noqa: E402
import contextlib  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import sqlite3  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import urllib.parse  # noqa: E402
import urllib.request  # noqa: E402
import zipfile  # noqa: E402
from xml.etree import ElementTree  # noqa: E402

DEVTOOLS = "http://127.0.0.1:" + os.environ.get("OSFLEET_DEVTOOLS_PORT", "1337")  # the office image's port
HOME = os.path.expanduser("~")
PROFILE = os.path.join(HOME, ".config", "google-chrome")
DEFAULT = os.path.join(PROFILE, "Default")
CHROME_EPOCH_OFFSET_US = 11644473600 * 1000000  # 1601-01-01 to 1970-01-01, Chrome's time base
MAX_TREE_NODES = 20000


class Deadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + max(float(seconds), 1.0)

    def left(self):
        return max(self.end - time.monotonic(), 0.0)

    def over(self):
        return self.left() <= 0


# --- Chrome DevTools ----------------------------------------------------------------------------------------
def _http(path, method="GET", timeout=5.0):
    req = urllib.request.Request(DEVTOOLS + path, method=method)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode("utf-8", "replace") or "null")


def _wait_devtools(deadline, launch=False):
    """The browser's /json/version, waiting (bounded) for Chrome to open its DevTools port. ``launch``: start
    Chrome when it does not answer within a few seconds, as OSWorld's getters do when they cannot connect."""
    import subprocess

    error, note, started, asked = "", "", False, time.monotonic()
    while True:
        try:
            return _http("/json/version", timeout=min(5.0, max(deadline.left(), 0.5)))
        except (OSError, ValueError) as exc:
            error = str(exc)
        if deadline.over():
            raise RuntimeError(f"Chrome's DevTools port did not answer: {error}{note}")
        if launch and not started and time.monotonic() - asked > 3:
            port = DEVTOOLS.rsplit(":", 1)[1]
            started = True
            try:
                subprocess.Popen(
                    ["google-chrome", f"--remote-debugging-port={port}"],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )  # fmt: skip
            except OSError as exc:
                note = f"; starting google-chrome: {exc}"
        time.sleep(min(1.0, deadline.left()))


class Session:
    """One DevTools websocket (the browser's or a page's): numbered commands, their answers."""

    def __init__(self, ws_url, deadline):
        import websocket  # Debian's python3-websocket (websocket-client)

        self.deadline = deadline
        self.ws = websocket.create_connection(ws_url, timeout=max(deadline.left(), 1.0), suppress_origin=True)
        self.next_id = 0

    def call(self, method, within=None, **params):
        """``within``: a Deadline shorter than the session's for this command (a page's share of the time)."""
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            left = self.deadline.left() if within is None else min(self.deadline.left(), within.left())
            self.ws.settimeout(max(left, 0.5))
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error'].get('message')}")
                return msg.get("result", {})

    def close(self):
        with contextlib.suppress(Exception):  # closing a socket the browser already dropped
            self.ws.close()


def _browser(deadline, launch=False):
    return Session(_wait_devtools(deadline, launch)["webSocketDebuggerUrl"], deadline)


def _pages(browser):
    """Page targets (tabs), in the order the browser lists them."""
    infos = browser.call("Target.getTargets").get("targetInfos", [])
    return [t for t in infos if t.get("type") == "page"]


def _page_session(target_id, deadline):
    """A session on one tab; a browser too busy to list its tabs (a window opening under emulation) is asked
    again until ``deadline``."""
    while True:
        try:
            listed = _http("/json/list", timeout=min(5.0, max(deadline.left(), 0.5)))
            break
        except OSError:
            if deadline.over():
                raise
            time.sleep(min(0.3, deadline.left()))  # a refused connection fails at once: no busy loop
    for t in listed:
        if t.get("id") == target_id and t.get("webSocketDebuggerUrl"):
            return Session(t["webSocketDebuggerUrl"], deadline)
    raise RuntimeError(f"tab {target_id} is gone")


def _evaluate(page, expression, within=None):
    out = page.call("Runtime.evaluate", within, expression=expression, returnByValue=True, awaitPromise=True)
    if out.get("exceptionDetails"):
        raise RuntimeError(out["exceptionDetails"].get("text", "script error"))
    return out.get("result", {}).get("value")


def _wait_loaded(page, deadline, settle=0.5):
    """Until the document has loaded (OSWorld waits for the load event / network idle), bounded."""
    while not deadline.over():
        try:
            if _evaluate(page, "document.readyState", deadline) == "complete":
                time.sleep(min(settle, deadline.left()))
                return True
        except Exception:  # noqa: BLE001 (the context is replaced while the page navigates)
            pass
        time.sleep(min(0.3, deadline.left()))
    return False


def _per_tab(deadline, share):
    return Deadline(min(deadline.left() / max(share, 1), 30.0))


CHROME_NAMES = {"chromium", "chrome", "google-chrome", "google-chrome-stable"}
LAUNCH_WINDOW_SECONDS = 20.0  # a handed-over command line becomes a window within this (TCG: ~5-10 s)


def _chrome_launchers():
    """Chromium processes on the profile (or ``google-chrome`` wrapper scripts) other than the running browser
    and its helpers: a ``google-chrome ...`` a set-up step just started, which hands its command line to the
    browser and exits."""
    found, profile = [], f"--user-data-dir={PROFILE}"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
            with open(f"/proc/{pid}/stat") as f:
                started = int(f.read().rsplit(")", 1)[1].split()[19])
        except (OSError, ValueError, IndexError):
            continue
        wrapper = len(argv) > 1 and os.path.basename(argv[1]) in CHROME_NAMES  # sh running google-chrome
        browser = bool(argv) and os.path.basename(argv[0]) in CHROME_NAMES and profile in argv
        if (wrapper or browser) and not any(a.startswith("--type=") for a in argv):
            found.append((started, int(pid)))
    return [pid for _, pid in sorted(found)[1:]]  # the oldest is the browser itself


def _pages_after_launches(browser, deadline):
    """The browser's tabs once a launch in flight has landed. OSWorld's tasks run ``google-chrome`` just before
    ``chrome_open_tabs``, and closing "the tab that was open before" needs that launch's tab to exist: under
    emulation the launcher takes seconds to hand over, and the window more to appear."""
    pages, launched = _pages(browser), False
    while _chrome_launchers() and not deadline.over():
        launched = True
        time.sleep(min(0.3, deadline.left()))
    if launched:
        window, known = Deadline(min(LAUNCH_WINDOW_SECONDS, deadline.left() / 3)), len(pages)
        while len(pages) <= known and not window.over():
            time.sleep(min(0.3, window.left()))
            pages = _pages(browser)
    return pages


def chrome_page_count(args, deadline):
    """How many tabs the running browser has (an error when none answers): what a launch must add to."""
    browser = _browser(deadline)
    try:
        return len(_pages(browser))
    finally:
        browser.close()


def chrome_launch_landed(args, deadline):
    """Wait until a ``google-chrome`` launch handed to the running browser has landed: no launcher left and more
    than ``known`` tabs (the launch's window), or ``LAUNCH_WINDOW_SECONDS`` gone. OSWorld's own set-up connects to
    the browser right after its launch step and closes the first tab it finds; on OSWorld's VMs the browser starts
    then, here it is already running and the launch's window lands seconds later, after that tab was chosen."""
    browser = _browser(deadline)
    try:
        known = int(args["known"])
        while _chrome_launchers() and not deadline.over():
            time.sleep(min(0.3, deadline.left()))
        window = Deadline(min(LAUNCH_WINDOW_SECONDS, deadline.left()))
        pages = _pages(browser)
        while len(pages) <= known and not window.over():
            time.sleep(min(0.3, window.left()))
            pages = _pages(browser)
        return len(pages)
    finally:
        browser.close()


def chrome_open_tabs(args, deadline):
    """OSWorld's chrome_open_tabs: each URL in a new tab of the running browser; after the first, the tab that
    was open before is closed."""
    browser = _browser(deadline)
    try:
        before = _pages_after_launches(browser, deadline)
        urls = args["urls"]
        for i, url in enumerate(urls):
            target = browser.call("Target.createTarget", url=url)["targetId"]
            try:
                share = _per_tab(deadline, len(urls) - i)
                page = _page_session(target, share)
                _wait_loaded(page, share)
                page.close()
            except Exception:  # noqa: BLE001 (a page that does not load in time is left loading, as OSWorld does)
                pass
            if i == 0:
                # A launch's window can land after the launcher has gone: once the first tab has loaded (OSWorld
                # closes its first page then too), a tab that is not ours is the one that was open before.
                earlier = before or [p for p in _pages(browser) if p["targetId"] != target]
                if earlier:
                    browser.call("Target.closeTarget", targetId=earlier[0]["targetId"])
        return len(urls)
    finally:
        browser.close()


def _netloc(host):
    labels = [x for x in host.lower().split(".") if x]
    if len(labels) >= 3 and labels[-2] in ("co", "com", "org", "net", "ac", "gov", "edu") and len(labels[-1]) == 2:
        labels = labels[:-2]  # a two-part public suffix like co.uk
    elif len(labels) >= 2:
        labels = labels[:-1]
    if len(labels) == 2 and labels[0] == "www":
        labels = labels[1:]
    return ".".join(labels)


def same_url(a, b):
    """OSWorld's compare_urls: scheme, host without its public suffix and a lone www, path without a lone
    slash, query and fragment (its public suffixes come from tldextract; here the common ones are known)."""
    if a is None or b is None:
        return a == b

    def norm(url):
        if "://" not in url.split("?")[0]:
            url = "http://" + url
        p = urllib.parse.urlparse(url)
        path = "" if p.path == "/" else p.path
        return (p.scheme.lower(), _netloc(p.netloc), path, p.params, p.query, p.fragment)

    return norm(a) == norm(b)


def chrome_close_tabs(args, deadline):
    browser = _browser(deadline)
    try:
        closed = 0
        for url in args["urls"]:
            for page in _pages(browser):
                if same_url(page.get("url"), url):
                    browser.call("Target.closeTarget", targetId=page["targetId"])
                    closed += 1
                    break
        return closed
    finally:
        browser.close()


def chrome_tabs(args, deadline):
    """OSWorld's open_tabs_info: title and URL of every tab, each after it has loaded (bounded)."""
    browser = _browser(deadline, launch=True)
    try:
        pages = _pages(browser)
        out = []
        for i, t in enumerate(pages):
            title = t.get("title", "")
            try:
                share = _per_tab(deadline, len(pages) - i)
                page = _page_session(t["targetId"], share)
                title = _evaluate(page, "document.title") if _wait_loaded(page, share) else "Load timeout"
                page.close()
            except Exception:  # noqa: BLE001 (as OSWorld: a tab it cannot read is reported, not fatal)
                title = "Error encountered"
            out.append({"title": title, "url": t.get("url", "")})
        return out
    finally:
        browser.close()


def chrome_active_url(args, deadline):
    """The URL of the tab the user looked at last: DevTools lists targets most recently active first. None when
    Chrome is not running (OSWorld then finds no address bar in the accessibility tree)."""
    try:
        _wait_devtools(Deadline(min(deadline.left(), 5.0)))
    except RuntimeError:
        return None
    pages = [t for t in _http("/json/list") if t.get("type") == "page"]
    return pages[0]["url"] if pages else None


def _with_new_tab(url, deadline, work, launch=True, settle=1.0):
    browser = _browser(deadline, launch=launch)
    target = None
    try:
        target = browser.call("Target.createTarget", url="about:blank")["targetId"]
        page = _page_session(target, deadline)
        try:
            page.call("Page.enable")
            page.call("Page.navigate", url=url)
            time.sleep(0.3)
            loaded = _wait_loaded(page, Deadline(min(deadline.left() - 1, 60)), settle=settle)
            return work(page, loaded)
        finally:
            page.close()
    finally:
        if target is not None:
            with contextlib.suppress(Exception):
                browser.call("Target.closeTarget", targetId=target)
        browser.close()


def chrome_page(args, deadline):
    """OSWorld's page_info / active_tab_info: open ``url`` in a new tab and read its title, URL and HTML."""

    def read(page, loaded):
        expr = "({title: document.title, url: location.href, content: document.documentElement.outerHTML})"
        info = _evaluate(page, expr)
        if not loaded:
            info["title"] = "Load timeout"
        return info

    return _with_new_tab(args["url"], deadline, read)


def chrome_html_parse(args, deadline):
    """OSWorld's active_tab_html_parse: texts from the open tab whose URL is the active one (``js``: the
    extraction, html_parse.js, which the host sends along)."""
    _wait_devtools(deadline, launch=True)

    def norm(url):
        return urllib.parse.unquote(url or "").rstrip("/")

    want = norm(args["url"])
    for t in _http("/json/list"):
        if t.get("type") == "page" and norm(t.get("url")) == want:
            page = Session(t["webSocketDebuggerUrl"], deadline)
            try:
                _wait_loaded(page, Deadline(min(deadline.left() - 1, 60)))
                return _evaluate(page, f"({args['js']})({json.dumps(args['spec'])})")
            finally:
                page.close()
    return {}


def chrome_info_from_website(args, deadline):
    """OSWorld's info_from_website: texts or attributes of elements of a page (after clicks); an error makes the
    host use the task's backups, as OSWorld does."""

    def read(page, loaded):
        infos = []
        for info in args.get("infos", []):
            action = info.get("action", "inner_text")
            selectors = info.get("selector")
            chain = selectors if isinstance(selectors, list) else [selectors]
            for sel in chain[:-1] if action.startswith("click_and_") else []:
                _evaluate(page, f"document.querySelector({json.dumps(sel)}).click()")
                time.sleep(0.5)
                _wait_loaded(page, Deadline(min(deadline.left() - 1, 20)))
            last = chain[-1]
            if action in ("inner_text", "click_and_inner_text"):
                expr = f"document.querySelector({json.dumps(last)}).innerText"
            elif action in ("attribute", "click_and_attribute"):
                expr = f"document.querySelector({json.dumps(last)}).getAttribute({json.dumps(info.get('attribute'))})"
            else:
                raise RuntimeError(f"action {action} is not supported")
            infos.append(_evaluate(page, expr))
        return infos

    return _with_new_tab(args["url"], deadline, read)


# --- Chrome profile files -----------------------------------------------------------------------------------
def _json_file(path):
    with open(path, "rb") as f:
        return json.loads(f.read().decode("utf-8", "replace"))


def _rows(db, query):
    """Rows of ``query`` on a copy of ``db`` (Chrome keeps its own open); bytes become hex text."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "db")
        shutil.copyfile(db, copy)
        conn = sqlite3.connect(copy)
        try:
            rows = conn.execute(query).fetchall()
        finally:
            conn.close()
    return [[v.hex() if isinstance(v, bytes) else v for v in row] for row in rows]


def chrome_history(args, deadline):
    try:
        return _rows(os.path.join(DEFAULT, "History"), "SELECT url, title, last_visit_time FROM urls")
    except (OSError, sqlite3.Error):
        return None


def chrome_cookies(args, deadline):
    try:
        return _rows(os.path.join(DEFAULT, "Cookies"), "SELECT * FROM cookies")
    except (OSError, sqlite3.Error):
        return None


def chrome_bookmarks(args, deadline):
    try:
        data = _json_file(os.path.join(DEFAULT, "Bookmarks"))
    except (OSError, ValueError):
        return []
    return data.get("roots", {}) if isinstance(data, dict) else []


def _prefs():
    data = _json_file(os.path.join(DEFAULT, "Preferences"))
    if not isinstance(data, dict):
        raise ValueError("Preferences is not a JSON object")
    return data


def _local_state():
    data = _json_file(os.path.join(PROFILE, "Local State"))
    if not isinstance(data, dict):
        raise ValueError("Local State is not a JSON object")
    return data


def chrome_pref(args, deadline):
    """The value of one of OSWorld's preference getters, with the value OSWorld returns when it cannot read."""
    kind = args["getter"]
    try:
        if kind == "default_search_engine":
            engine = _prefs().get("default_search_provider_data", {}).get("template_url_data", {})
            return engine.get("short_name", "Google")
        if kind == "profile_name":
            return _prefs().get("profile", {}).get("name", None)
        if kind == "chrome_font_size":
            default = {"default_fixed_font_size": 13, "default_font_size": 16, "minimum_font_size": 13}
            return _prefs().get("webkit", {}).get("webprefs", default)
        if kind == "enable_do_not_track":
            return "true" if _prefs().get("enable_do_not_track", {}) else "false"
        if kind == "enable_enhanced_safety_browsing":
            return "true" if _prefs().get("safebrowsing", {}).get("enhanced", {}) else "false"
        if kind == "enable_safe_browsing":
            sb = _prefs().get("safebrowsing", {})
            return "true" if bool(sb.get("enhanced", False)) or bool(sb.get("enabled", False)) else "false"
        if kind == "new_startup_page":
            data = _prefs()
            if "session" not in data:
                return "true"
            return "true" if data.get("session", {}).get("restore_on_startup", {}) == 5 else "false"
        if kind == "data_delete_automacally":
            state = _prefs()["profile"].get("default_content_setting_values", None)
            return "true" if state is not None else "false"
        if kind == "find_unpacked_extension_path":
            return [e["path"] for e in _prefs().get("extensions", {}).get("settings", {}).values()]
        if kind == "find_installed_extension_name":
            return [e["manifest"]["name"] for e in _prefs().get("extensions", {}).get("settings", {}).values()]
        if kind == "enabled_experiments":
            return _local_state().get("browser", {}).get("enabled_labs_experiments", [])
        if kind == "chrome_language":
            return _local_state().get("intl", {}).get("app_locale", "en-US")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {
            "profile_name": None,
            "chrome_font_size": {"default_fixed_font_size": 13, "default_font_size": 16},
            "enable_do_not_track": "false",
            "enable_safe_browsing": "false",
            "enabled_experiments": [],
            "chrome_language": "en-US",
        }.get(kind, "Google")
    raise RuntimeError(f"no preference getter {kind}")


# Which appearance the settings page shows: the page's own preference objects at these paths first, then the
# text of the selected or checked controls (through shadow roots); light before dark before system.
APPEARANCE_PROBE = r"""(() => {
  const low = (v) => String(v === undefined || v === null ? '' : v).toLowerCase();
  const paths = ['prefs.browser.theme.color_scheme', 'prefs.browser.theme.color_scheme2',
                 'prefs.extensions.theme.system_theme'];
  const found = [];
  const fromText = (t) => t.includes('light') ? 'light' : t.includes('dark') ? 'dark'
    : (t.includes('device') || t.includes('system') || t.includes('default')) ? 'system' : null;
  try {
    const ui = document.querySelector('settings-ui');
    const seen = new Set();
    const walk = (obj, path) => {
      if (!obj || typeof obj !== 'object' || seen.has(obj)) return;
      seen.add(obj);
      if ('value' in obj && paths.includes(low(path))) {
        const v = obj.value;
        if (low(path).endsWith('system_theme')) {
          if (v === 0 || v === '0' || v === false) found.push('light');
          if (v === 1 || v === '1' || v === true) found.push('dark');
        } else {
          if (v === 1 || low(v) === '1' || low(v) === 'light') found.push('light');
          if (v === 2 || low(v) === '2' || low(v) === 'dark') found.push('dark');
          if (v === 0 || ['0', 'system', 'default', 'device'].includes(low(v))) found.push('system');
        }
      }
      for (const key of Object.keys(obj)) walk(obj[key], path ? path + '.' + key : key);
    };
    walk(ui && ui.prefs ? ui.prefs : null, 'prefs');
  } catch (e) {}
  try {
    const roots = [document];
    for (let i = 0; i < roots.length; i++)
      for (const el of roots[i].querySelectorAll('*')) if (el.shadowRoot) roots.push(el.shadowRoot);
    for (const root of roots)
      for (const el of root.querySelectorAll('[selected],[checked],[aria-checked="true"],option:checked')) {
        const mode = fromText(low((el.innerText || el.textContent || '').trim()));
        if (mode) found.push(mode);
      }
  } catch (e) {}
  for (const mode of ['light', 'dark', 'system']) if (found.includes(mode)) return mode;
  return null;
})()"""
APPEARANCE_PAGE_SECONDS = 25.0  # the settings page's share; the Preferences files get the rest


def _scheme_in_preferences(data):
    """light, dark or system from a Preferences document (color_scheme2, else color_scheme: 0 system, 1 light,
    2 dark; a theme not following the system, extensions.theme.system_theme 0, is light)."""
    theme = data.get("browser", {}).get("theme", {})
    raw = theme.get("color_scheme2", theme.get("color_scheme"))
    mode = None
    if isinstance(raw, str):
        mode = {"system": "system", "default": "system", "0": "system", "light": "light", "1": "light"}.get(
            raw.strip().lower(), "dark" if raw.strip().lower() in ("dark", "2") else None
        )
    elif isinstance(raw, int | float):  # true counts as 1 (light), as in OSWorld
        mode = {0: "system", 1: "light", 2: "dark"}.get(int(raw))
    if data.get("extensions", {}).get("theme", {}).get("system_theme") in (0, "0", False):
        return "light"
    return mode or "system"


def _appearance_in_files(deadline):
    """The appearance the profiles' Preferences say, newest profile first, asked up to 5 times a second apart
    (Chrome writes the file a moment after the setting changes); system when none says."""
    found = []
    for pattern in ("Default", "Guest Profile", "Profile *"):
        for path in glob.glob(os.path.join(PROFILE, pattern, "Preferences")):
            with contextlib.suppress(OSError):
                found.append((os.path.getmtime(path), path))
    paths = [p for _, p in sorted(found, reverse=True)] or [os.path.join(DEFAULT, "Preferences")]
    final = "system"
    for attempt in range(5):
        best = None
        for path in paths:
            try:
                mode = _scheme_in_preferences(_json_file(path))
            except (OSError, ValueError, AttributeError):
                continue
            if mode in ("light", "dark"):
                best = mode
                break
            best = best or mode
        if best is not None:
            final = best
            if best == "light":
                return "light"
        if attempt < 4:
            if deadline.left() < 1.5:
                break
            time.sleep(1.0)
    return final


def chrome_appearance_mode(args, deadline):
    """OSWorld's chrome_appearance_mode_ui: what chrome://settings/appearance shows (a new tab of the running
    browser, never started for this), else what the Preferences files say."""
    page_deadline = Deadline(min(APPEARANCE_PAGE_SECONDS, deadline.left() / 2))
    try:
        _http("/json/version", timeout=min(5.0, page_deadline.left()))  # OSWorld gives up when it cannot connect
        mode = _with_new_tab(
            "chrome://settings/appearance",
            page_deadline,
            lambda page, loaded: _evaluate(page, APPEARANCE_PROBE),
            launch=False,
            settle=2.5,
        )
    except Exception:  # noqa: BLE001 (no browser, a page that did not load: the files decide, as in OSWorld)
        mode = None
    return mode if mode in ("light", "dark", "system") else _appearance_in_files(deadline)


def add_history(args, deadline):
    """OSWorld's update_browse_history: visits at times relative to now, in the (fresh) History database."""
    conn = sqlite3.connect(args["path"])
    try:
        now_us = int(time.time() * 1000000) + CHROME_EPOCH_OFFSET_US
        for item in args["items"]:
            stamp = now_us - int(float(item["visit_time_from_now_in_seconds"]) * 1000000)
            cur = conn.execute(
                "INSERT INTO urls (url, title, visit_count, typed_count, last_visit_time, hidden) "
                "VALUES (?, ?, 1, 0, ?, 0)",
                (item["url"], item["title"], stamp),
            )
            conn.execute(
                "INSERT INTO visits (url, visit_time, from_visit, transition, segment_id, visit_duration) "
                "VALUES (?, ?, 0, 805306368, 0, 0)",
                (cur.lastrowid, stamp),
            )
        conn.commit()
    finally:
        conn.close()
    return len(args["items"])


# --- the desktop --------------------------------------------------------------------------------------------
NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "docattr": "https://accessibility.ubuntu.example.org/ns/document/attributes",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}
MAX_DEPTH, MAX_WIDTH = 50, 1024


def _showing_cells(node, depth, budget, pyatspi, flag):
    """A spreadsheet's table as OSWorld's server reads it: only the cells on screen, found row by row from the
    first showing one (a sheet has a million rows of thousands of cells)."""
    columns = 16384  # LibreOffice 7.4 and later
    found, base, index = [], None, 0
    for row in range(1048576):
        column = base or 0
        for column in range(base or 0, columns):
            cell = node[index + column]
            if cell.getState().contains(pyatspi.STATE_SHOWING):
                if base is None:
                    base = column
                found.append(_a11y_node(cell, depth + 1, budget, pyatspi, flag))
            elif base is not None or column >= 500:
                break
        if (base is not None and column == base) or (base is None and row >= 500) or budget[0] <= 0:
            break
        index += columns
    return found


def _a11y_node(node, depth, budget, pyatspi, flag=None):
    """One AT-SPI node as OSWorld's server writes it: the role as the tag, ``name``, states, attributes,
    screen position and size of what is showing, text, value and actions, in its namespaces. The attributes
    keep OSWorld's order, and each part an application refuses is left out alone."""
    budget[0] -= 1
    attrs = {"name": node.name or ""}
    attrs.update(_a11y_states(node, pyatspi))
    attrs.update(_a11y_attributes(node))
    if attrs.get(f"{{{NS['st']}}}visible") == "true" and attrs.get(f"{{{NS['st']}}}showing") == "true":
        attrs.update(_a11y_extents(node, pyatspi))
    text = _a11y_text(node)
    attrs.update(_a11y_interfaces(node))
    attrs.update(_a11y_value(node))
    attrs.update(_a11y_actions(node))
    raw = (node.getRoleName() or "").strip()
    role = (raw or "unknown").replace(" ", "-")
    flag = flag or ("calc" if raw == "document spreadsheet" else None)
    element = ElementTree.Element(role, attrs)
    if text:
        element.text = text
    if depth < MAX_DEPTH:
        element.extend(_a11y_children(node, role, depth, budget, pyatspi, flag))
    return element


def _a11y_states(node, pyatspi):
    """The node's states as ``st:`` attributes, named as pyatspi names them without the prefix (STATE_SHOWING is
    showing). Not guarded: a node whose states cannot be read is not written at all."""
    out = {}
    for st in node.getState().getStates():
        name = pyatspi.StateType._enum_lookup.get(st, "")  # noqa: SLF001 (pyatspi's own table of names)
        name = name.split("_", 1)[1].lower() if "_" in name else ""
        if name:
            out[f"{{{NS['st']}}}{name}"] = "true"
    return out


def _a11y_attributes(node):
    """The node's object attributes as ``attr:``: a dict from newer pyatspi, ``key:value`` strings from older.
    The ones read before a refusal are kept (each part below alike)."""
    out = {}
    try:
        for key, value in (
            node.getAttributes().items()
            if hasattr(node.getAttributes(), "items")
            else (a.split(":", 1) for a in node.getAttributes())
        ):
            if key:
                out[f"{{{NS['attr']}}}{key}"] = value
    except Exception:  # noqa: BLE001 (an application may refuse a call)
        pass
    return out


def _a11y_extents(node, pyatspi):
    """Where a showing node is on the screen, as ``cp:screencoord`` and ``cp:size``."""
    out = {}
    try:
        box = node.queryComponent().getExtents(pyatspi.XY_SCREEN)
        out[f"{{{NS['cp']}}}screencoord"] = str((box.x, box.y))
        out[f"{{{NS['cp']}}}size"] = str((box.width, box.height))
    except Exception:  # noqa: BLE001 (NotImplementedError: no component)
        pass
    return out


def _a11y_text(node):
    """The node's text without the object replacement and replacement characters; empty without a text."""
    try:
        t = node.queryText()
        return t.getText(0, t.characterCount).replace("\ufffc", "").replace("\ufffd", "")
    except Exception:  # noqa: BLE001
        return ""


def _a11y_interfaces(node):
    """``image`` and ``selection``, "true" for a node that has that interface."""
    out = {}
    for what, key in (("queryImage", "image"), ("querySelection", "selection")):
        try:
            getattr(node, what)()
            out[key] = "true"
        except Exception:  # noqa: BLE001
            pass
    return out


def _a11y_value(node):
    """A value's current, minimum, maximum and step as ``val:``, each left out alone when it cannot be read."""
    out = {}
    try:
        v = node.queryValue()
        fields = [("value", "currentValue"), ("min", "minimumValue"), ("max", "maximumValue")]
        fields.append(("step", "minimumIncrement"))
        for key, get in fields:
            with contextlib.suppress(Exception):
                out[f"{{{NS['val']}}}{key}"] = str(getattr(v, get))
    except Exception:  # noqa: BLE001
        pass
    return out


def _a11y_actions(node):
    """Each action's description and key binding as ``act:<name>_desc`` and ``act:<name>_kb``."""
    out = {}
    try:
        action = node.queryAction()
        for i in range(action.nActions):
            name = action.getName(i).replace(" ", "-")
            out[f"{{{NS['act']}}}{name}_desc"] = action.getDescription(i)
            out[f"{{{NS['act']}}}{name}_kb"] = action.getKeyBinding(i)
    except Exception:  # noqa: BLE001
        pass
    return out


def _a11y_children(node, role, depth, budget, pyatspi, flag):
    """The node's children, up to MAX_WIDTH and while the budget lasts; a spreadsheet's table gives only its
    showing cells. The children read before an application went away are kept."""
    children = []
    try:
        if flag == "calc" and role == "table":
            return _showing_cells(node, depth, budget, pyatspi, flag)
        for i, child in enumerate(node):
            if i == MAX_WIDTH or budget[0] <= 0:
                break
            if child is not None:
                children.append(_a11y_node(child, depth + 1, budget, pyatspi, flag))
    except Exception:  # noqa: BLE001 (an application went away while it was read)
        pass
    return children


def _reachable_bus(address):
    """Whether a D-Bus address can name a live bus. Some processes carry one that cannot (``disabled:``, which
    tools set to keep a library from starting a bus of its own, or the socket of a session that ended); taking
    theirs would leave AT-SPI with no bus at all."""
    for entry in address.split(";"):
        transport, _, params = entry.partition(":")
        keys = dict(kv.split("=", 1) for kv in params.split(",") if "=" in kv)
        if transport in ("", "disabled"):
            continue
        if transport == "unix" and "path" in keys and not os.path.exists(keys["path"]):
            continue
        return True
    return False


def _session_bus():
    """The desktop session's D-Bus address, which AT-SPI is found through: a command started by the guest agent
    does not inherit it, so it is taken from a process of this user that has a reachable one (the session's
    own)."""
    if _reachable_bus(os.environ.get("DBUS_SESSION_BUS_ADDRESS", "")):
        return
    uid = os.getuid()
    for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        address = env.get(b"DBUS_SESSION_BUS_ADDRESS", b"").decode("utf-8", "replace")
        if _reachable_bus(address):
            os.environ["DBUS_SESSION_BUS_ADDRESS"] = address
            return
    bus = f"/run/user/{uid}/bus"
    if os.path.exists(bus):
        os.environ["DBUS_SESSION_BUS_ADDRESS"] = f"unix:path={bus}"


def _desktop_tree():
    _session_bus()
    import pyatspi  # Debian's python3-pyatspi

    for prefix, uri in NS.items():
        ElementTree.register_namespace(prefix, uri)
    root = ElementTree.Element("desktop-frame")
    budget = [MAX_TREE_NODES]
    desktop = pyatspi.Registry.getDesktop(0)
    for app in desktop:
        if app is not None and budget[0] > 0:
            root.append(_a11y_node(app, 1, budget, pyatspi))
    return root


def accessibility_tree(args, deadline):
    return ElementTree.tostring(_desktop_tree(), encoding="unicode")


def terminal_output(args, deadline):
    """OSWorld's vm_terminal_output: the text of the focused terminal in the active window, else None."""
    root = _desktop_tree()
    st = f"{{{NS['st']}}}"
    for frame in root.iter("frame"):
        if frame.get(st + "active") != "true":
            continue
        terms = [t for t in frame.iter("terminal") if t.get(st + "focused") == "true"]
        if len(terms) == 1:
            return (terms[0].text or "").rstrip()
    return None


def list_directory(args, deadline):
    """OSWorld's list_directory: the folder as a tree of {type, name, children}."""

    def walk(path, left):
        tree = {"type": "directory", "name": os.path.basename(path), "children": []}
        try:
            for entry in sorted(os.listdir(path)):
                full = os.path.join(path, entry)
                left[0] -= 1
                if left[0] < 0:
                    break
                if os.path.isdir(full) and not os.path.islink(full):
                    tree["children"].append(walk(full, left))
                else:
                    tree["children"].append({"type": "file", "name": entry})
        except OSError as exc:
            tree = {"error": str(exc)}
        return tree

    if not os.path.isdir(args["path"]):
        return None
    return walk(args["path"], [MAX_TREE_NODES])


def shortcuts_on_desktop(args, deadline):
    out = {}
    for path in sorted(glob.glob(os.path.join(HOME, "Desktop", "*.desktop"))):
        with open(path, "rb") as f:
            out[os.path.basename(path)] = f.read(1 << 20).decode("utf-8", "replace")
    return out


def slide_media(args, deadline):
    """OSWorld's audio_in_slide / background_image_in_slide: the slide's audio (or background picture) as a
    file: extracted from the presentation into a new folder, or the linked file's own path."""
    rel_ns = "{http://schemas.openxmlformats.org/package/2006/relationships}"
    index = int(args["slide_index"]) + 1
    with zipfile.ZipFile(args["path"]) as z:
        names = set(z.namelist())
        rels = f"ppt/slides/_rels/slide{index}.xml.rels"
        wanted_id = None
        if args["kind"] == "background_image_in_slide":
            slide = f"ppt/slides/slide{index}.xml"
            if slide not in names:
                return None
            root = ElementTree.fromstring(z.read(slide))
            p = "{http://schemas.openxmlformats.org/presentationml/2006/main}"
            a = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
            r = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
            for bg in root.iter(p + "bgPr"):
                for blip in bg.iter(a + "blip"):
                    wanted_id = blip.get(r + "embed")
                    break
                if wanted_id:
                    break
            if wanted_id is None:
                return None
        if rels not in names:
            return None
        for rel in ElementTree.fromstring(z.read(rels)).iter(rel_ns + "Relationship"):
            kind = rel.get("Type", "")
            if args["kind"] == "audio_in_slide" and "audio" not in kind:
                continue
            if wanted_id is not None and ("image" not in kind or rel.get("Id") != wanted_id):
                continue
            target = rel.get("Target", "")
            if target.startswith(".."):
                member = os.path.normpath(os.path.join("ppt/slides", target)).replace("\\", "/")
                folder = tempfile.mkdtemp(prefix="osfleet-media-")
                return z.extract(member, folder)
            if target.startswith("file://"):
                return {"linked": target[7:]}
            return None
    return None


def xlsx_last_row(args, deadline):
    """OSWorld's content_from_vm_file (xlsx, last_row): the first sheet's last row as text, as pandas shows it."""
    import openpyxl  # Debian's python3-openpyxl

    sheet = openpyxl.load_workbook(args["path"], read_only=True, data_only=True).worksheets[0]
    rows = [r for r in sheet.iter_rows(values_only=True) if any(v is not None for v in r)]
    if len(rows) < 2:
        return None
    width = len(rows[0])
    last = list(rows[-1]) + [None] * (width - len(rows[-1]))
    return ["nan" if v is None else str(v) for v in last[:width]]


def vlc_status(args, deadline):
    """VLC's status.xml from its HTTP interface (OSWorld's vlc_playing_info; password 'password')."""
    req = urllib.request.Request("http://127.0.0.1:8080/requests/status.xml")
    req.add_header("Authorization", "Basic " + base64.b64encode(b":password").decode())
    try:
        with urllib.request.urlopen(req, timeout=min(10.0, max(deadline.left(), 1.0))) as resp:
            return resp.read(4 << 20).decode("utf-8", "replace")
    except OSError:
        return None


def _xdg_split(value):
    """A colon-separated list as the shell splits it with IFS=: (no empty last field)."""
    parts = value.split(":")
    return parts[:-1] if parts and parts[-1] == "" else parts


def _bre(text):
    """``text`` as grep's basic regular expression matches it: a mime type's dots match any character."""
    return re.escape(text).replace("\\.", ".")


class XdgDefaults:
    """``xdg-mime query default TYPE`` on a desktop that is not KDE (xdg-utils 1.1.3's ``defapp_generic``, which
    Debian's xdg-mime runs here), read in this process: the script forks a few dozen tools per query, over a second
    each under emulation, and OSWorld's getter asks 85 times. Its quirks are kept: mimeapps.list entries must
    name a .desktop file whose program exists (and the file found for one entry is reused while looking for the
    next, as the script's unreset variable is), defaults.list and mimeinfo.cache lines match the type anywhere as
    a regular expression and need no such file, and the last resort is the .desktop file that lists the type with
    the highest InitialPreference. ``tests/test_osworld_runtime.py`` compares it with the real xdg-mime."""

    def __init__(self, env=None):
        env = os.environ if env is None else env
        home = env.get("HOME") or HOME
        self.config_home = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
        self.config_dirs = env.get("XDG_CONFIG_DIRS") or "/etc/xdg"
        self.data_home = env.get("XDG_DATA_HOME") or os.path.join(home, ".local/share")
        self.data_dirs = env.get("XDG_DATA_DIRS") or "/usr/local/share/:/usr/share/"
        self.binary_dirs = env.get("XDG_DATA_DIRS") or "/usr/local/share:/usr/share"
        self.desktops = _xdg_split(env.get("XDG_CURRENT_DESKTOP", "")) + [""]
        self.menu_prefix = env.get("XDG_MENU_PREFIX", "")
        self.path = env.get("PATH", os.defpath)
        self.file_path = ""

    def query(self, mime):
        self.file_path = ""
        for folder in _xdg_split(self.config_home) + _xdg_split(self.config_dirs):
            found = self._mimeapps(mime, folder)
            if found:
                return found
        for folder in _xdg_split(self.data_home) + _xdg_split(self.data_dirs):
            found = self._mimeapps(mime, folder + "/applications")
            if found:
                return found
        pattern = re.compile(_bre(mime) + "=")
        for folder in f"{self.data_home}:{self.data_dirs}".replace(":", " ").split():
            for prefix in (self.menu_prefix, ""):
                files = [f"{folder}/applications/{prefix}{name}" for name in ("defaults.list", "mimeinfo.cache")]
                found = self._first_listed(files, pattern)
                if found:
                    return found
        return self._fallback(mime)

    @staticmethod
    def _lines(path):
        try:
            with open(path, "rb") as f:
                return f.read(4 * 2**20).decode("utf-8", "replace").split("\n")
        except OSError:
            return None

    def _first_listed(self, paths, pattern):
        """The app (before any ';') of the first matching line of a defaults.list, else of a mimeinfo.cache
        (one grep over both files, its first line)."""
        for path in paths:
            for line in self._lines(path) or []:
                if pattern.search(line):
                    return " ".join(line.split("=")[1].split(";")[0].split())
        return None

    def _mimeapps(self, mime, folder):
        for desktop in self.desktops:
            prefix = f"{desktop}-".lower() if desktop else ""
            path = f"{folder}/{prefix}mimeapps.list"
            if not os.path.isfile(path):
                continue
            result, in_default = None, False
            for line in self._lines(path) or []:
                if line.startswith("[Default Applications]"):
                    in_default = True
                elif line.startswith("["):
                    in_default = False
                elif result is None and in_default and line.startswith(mime + "="):
                    result = line[len(mime) + 1 :]
            app = (result or "").split(";")[0].rstrip("\n")
            if app and self._binary(app):
                return app
        return None

    def _binary(self, app):
        """The program of the .desktop file ``app`` when it exists (xdg-mime's desktop_file_to_binary)."""
        desktop = os.path.basename(app)
        for folder in _xdg_split(f"{self.data_home}:{self.binary_dirs}"):
            if not ((folder and os.path.isdir(folder + "/applications")) or os.path.isdir(folder + "/applnk")):
                continue
            if "-" in desktop:
                vendor, rest = desktop.rsplit("-", 1)[0], desktop.split("-", 1)[1]
                for kind in ("applications", "applnk"):
                    if os.access(f"{folder}/{kind}/{vendor}/{rest}", os.R_OK):
                        self.file_path = f"{folder}/{kind}/{vendor}/{rest}"
                        break
            if not self.file_path:
                for kind in ("applications", "applnk"):
                    dirs = [f"{folder}/{kind}/"] + sorted(glob.glob(f"{glob.escape(folder)}/{kind}/*/"))
                    hit = next((d + "/" + desktop for d in dirs if os.access(d + "/" + desktop, os.R_OK)), None)
                    if hit:
                        self.file_path = hit
                        break
            if self.file_path and os.access(self.file_path, os.R_OK):
                exec_re = re.compile(r"^Exec(\[[^]=]*])?=")
                lines = [ln for ln in self._lines(self.file_path) or [] if exec_re.match(ln)]
                words = lines[0].split("=", 1)[1].split() if lines else []
                command = shutil.which(words[0], path=self.path) if words else None
                return os.path.realpath(command) if command else ""
        return ""

    def _fallback(self, mime):
        pattern = re.compile(_bre(mime) + ";")
        best, chosen = -1, None
        for folder in f"{self.data_home}:{self.data_dirs}".replace(":", " ").split():
            for path in self._listing(pattern, folder + "/applications"):
                values = [ln.split("=")[1] if ln.count("=") >= 1 else "" for ln in self._lines(path) or []
                          if "InitialPreference=" in ln]  # fmt: skip
                text = "0" + values[0] if len(values) == 1 else ("0" if not values else None)
                if text is not None and re.fullmatch(r"-?\d+", text.strip()) and int(text) > best:
                    best, chosen = int(text), path
        return os.path.basename(chosen.rstrip("/")) if chosen else None

    def _listing(self, pattern, folder):
        for path in sorted(glob.glob(glob.escape(folder) + "/*.desktop")):
            if any(pattern.search(line) for line in self._lines(path) or []):
                yield path
        for sub in sorted(glob.glob(glob.escape(folder) + "/*/")):
            yield from self._listing(pattern, sub)


def default_video_player(args, deadline):
    """OSWorld's default_video_player: the app xdg-mime names most often over its list of video types (each
    asked twice but one, as OSWorld's list has them; ties go to the first named), or "unknown"."""
    defaults, apps = XdgDefaults(), []
    answers = {}  # type: dict[str, str | None]
    for ext in args["types"]:
        if deadline.over():
            raise RuntimeError(f"the default applications of {len(answers)} video types took the whole time")
        if ext not in answers:
            answers[ext] = defaults.query(f"video/{ext}")
        app = answers[ext]
        if app:
            apps.append(app + "\n")  # what OSWorld's getter gets: xdg-mime's output line
    return collections.Counter(apps).most_common(1)[0][0] if apps else "unknown"


OPS = {
    f.__name__: f
    for f in (
        chrome_open_tabs,
        chrome_page_count,
        chrome_launch_landed,
        chrome_close_tabs,
        chrome_tabs,
        chrome_active_url,
        chrome_page,
        chrome_html_parse,
        chrome_info_from_website,
        chrome_history,
        chrome_cookies,
        chrome_bookmarks,
        chrome_pref,
        add_history,
        accessibility_tree,
        terminal_output,
        list_directory,
        shortcuts_on_desktop,
        slide_media,
        xlsx_last_row,
        vlc_status,
        default_video_player,
        chrome_appearance_mode,
    )
}


def main(argv):
    op, args = argv[1], json.loads(argv[2])
    deadline = Deadline(args.pop("deadline", 30))
    try:
        value = OPS[op](args, deadline)
    except Exception as exc:  # noqa: BLE001 (every failure is reported to the host as one line)
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]}))
        return 1
    print(json.dumps({"value": value}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
