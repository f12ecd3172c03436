"""Suite tasks on the desktop applications OSWorld covers beyond the office: Chrome, GIMP, VLC, VS Code,
Thunderbird, and the accessibility tree (mousepad's window), each scored by OSWorld's getter and metric for it.

Chrome keeps its profile in ~/.config/google-chrome (where OSWorld's getters read Bookmarks and Preferences)
and writes it back when it quits, so an oracle that changes a setting first closes Chrome, as a user's change
would be saved on quitting. Oracles that need the running application (Chrome's tabs, VLC's player, the
``code`` command) talk to it as a script would: DevTools, VLC's HTTP interface, code-server's command line.
"""

from __future__ import annotations

import io
import json
import math
import struct
import tarfile
import wave
import zipfile
from pathlib import Path
from typing import Any

from osfleet.tasks.suites.common import (
    HOME,
    chrome_with_devtools,
    cloud,
    download,
    launch,
    python,
    rule,
    run,
    shell,
    task,
    vm_file,
)

CHROME_PROFILE = f"{HOME}/.config/google-chrome"
DEVTOOLS = "http://127.0.0.1:1337"
VLC_HTTP = "http://127.0.0.1:8080/requests/status.xml"
VLCRC = f"{HOME}/.config/vlc/vlcrc"
THUNDERBIRD_PROFILE = f"{HOME}/.thunderbird/osfleet.default-release"
GIMPRC = f"{HOME}/.config/GIMP/2.10/gimprc"
# Python for an oracle: quit this user's Chrome (the browser process started with its profile; its helpers
# follow) and wait until it has written the profile. Matched by its exact argument, never by a name pattern.
STOP_CHROME = """
import os, signal, time
def _chrome_pids():
    flag = "--user-data-dir=" + os.path.expanduser("~/.config/google-chrome")
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\\0")
        except OSError:
            continue
        if os.path.basename(argv[0]) == "chromium" and flag in argv:
            pids.append(int(pid))
    return pids
for pid in _chrome_pids():
    os.kill(pid, signal.SIGTERM)
for _ in range(60):
    if not _chrome_pids():
        break
    time.sleep(0.5)
"""


def _page(assets: Path, name: str, title: str) -> str:
    (assets / name).write_text(
        f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{title}</title></head>"
        f"<body><h1>{title}</h1><p>A page of the osfleet suite.</p></body></html>\n"
    )
    return f"file://{HOME}/site/{name}"


def _chrome_prefs(update: str) -> dict[str, Any]:
    """Oracle: quit Chrome, then change its Preferences (``update`` is Python acting on the dict ``p``)."""
    return python(
        STOP_CHROME
        + f"""
import json
path = os.path.expanduser("~/.config/google-chrome/Default/Preferences")
os.makedirs(os.path.dirname(path), exist_ok=True)
p = json.load(open(path)) if os.path.exists(path) else {{}}
{update}
json.dump(p, open(path, "w"))"""
    )


def _chrome_tasks(assets: Path) -> list[dict[str, Any]]:
    out = []
    recipes = _page(assets, "recipes.html", "Family recipes")
    site = f"{HOME}/site"
    out.append(
        task(
            "chrome-bookmark-page",
            "chrome",
            "Open ~/site/recipes.html ('Family recipes') in Chrome and bookmark it on the bookmarks bar.",
            [download("recipes.html", f"{site}/recipes.html")],
            {
                "func": "is_expected_bookmarks",
                "result": {"type": "bookmarks"},
                "expected": rule({"type": "bookmark_bar_websites_urls", "urls": [recipes]}),
            },
            [
                python(
                    STOP_CHROME
                    + f"""
import json
path = os.path.expanduser("~/.config/google-chrome/Default/Bookmarks")
os.makedirs(os.path.dirname(path), exist_ok=True)
empty = {{"type": "folder", "children": []}}
b = json.load(open(path)) if os.path.exists(path) else {{"roots": {{}}, "version": 1}}
roots = b.setdefault("roots", {{}})
for name, title in (("bookmark_bar", "Bookmarks bar"), ("other", "Other bookmarks"), ("synced", "Mobile bookmarks")):
    roots.setdefault(name, dict(empty, name=title, children=[]))
roots["bookmark_bar"]["children"].append({{"type": "url", "name": "Family recipes", "url": {recipes!r}}})
b.pop("checksum", None)
json.dump(b, open(path, "w"), indent=3)"""
                )
            ],
        )
    )
    pages = {
        n: _page(assets, f"{n}.html", t) for n, t in (("news", "Local news"), ("maps", "City map"), ("mail", "Webmail"))
    }
    out.append(
        task(
            "chrome-open-tabs",
            "chrome",
            "Chrome shows 'Local news'. Also open ~/site/maps.html and ~/site/mail.html, each in a new tab.",
            [
                download(
                    "news.html",
                    f"{site}/news.html",
                    ("maps.html", f"{site}/maps.html"),
                    ("mail.html", f"{site}/mail.html"),
                ),
                *chrome_with_devtools(),
                {"type": "chrome_open_tabs", "parameters": {"urls_to_open": [pages["news"]]}},
            ],
            {
                "func": "is_expected_tabs",
                "result": {"type": "open_tabs_info"},
                "expected": rule({"type": "url", "urls": list(pages.values())}),
            },
            [
                # Chrome under TCG takes tens of seconds per new tab: open both, then wait until both have loaded
                # (DevTools lists their titles), so the check finds Chrome done rather than busy.
                shell(
                    "; ".join(
                        f"curl -sf -m 60 -X PUT '{DEVTOOLS}/json/new?{pages[n]}' >/dev/null" for n in ("maps", "mail")
                    )
                    + f"; for i in $(seq 1 120); do n=$(curl -sf -m 10 {DEVTOOLS}/json/list | grep -cE "
                    + '\'"title": "(City map|Webmail)"\'); [ "$n" -ge 2 ] && exit 0; sleep 1; done; exit 1',
                    timeout=240,
                )
            ],
        )
    )
    out.append(
        task(
            "chrome-font-size",
            "chrome",
            "In Chrome's settings, set the default font size to 20 or more.",
            [],
            {
                "func": "check_font_size",
                "result": {"type": "chrome_font_size"},
                "expected": rule({"type": "range", "min": 19, "max": 99999}),
            },
            [_chrome_prefs('p.setdefault("webkit", {}).setdefault("webprefs", {})["default_font_size"] = 20')],
        )
    )
    out.append(
        task(
            "chrome-do-not-track",
            "chrome",
            "Turn on Chrome's 'Send a \"Do Not Track\" request with your browsing traffic' setting.",
            [],
            {"func": "exact_match", "result": {"type": "enable_do_not_track"}, "expected": rule({"expected": "true"})},
            [_chrome_prefs('p["enable_do_not_track"] = True')],
        )
    )
    return out


def _png(path: Path, size: tuple[int, int]) -> None:
    """A picture with a shape in one corner, so a mirrored, rotated or scaled copy is told from the original."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, (235, 240, 250))
    draw = ImageDraw.Draw(img)
    w, h = size
    draw.rectangle([w // 10, h // 10, w // 2, h // 2], fill=(200, 40, 40))
    draw.ellipse([w // 2, h // 2, w - w // 8, h - h // 8], fill=(30, 120, 60))
    img.save(path)


def _pil(script: str) -> dict[str, Any]:
    return python("from PIL import Image, ImageOps\n" + script)


def _gimp_tasks(assets: Path) -> list[dict[str, Any]]:
    from PIL import Image

    out = []
    desk = f"{HOME}/Desktop"
    _png(assets / "leaf.png", (240, 160))
    out.append(
        task(
            "gimp-mirror-image",
            "gimp",
            "Flip ~/Desktop/leaf.png horizontally with GIMP and export the result as ~/Desktop/leaf_mirror.png.",
            [download("leaf.png", f"{desk}/leaf.png")],
            {
                "func": "check_image_mirror",
                "expected": vm_file(f"{desk}/leaf.png"),
                "result": vm_file(f"{desk}/leaf_mirror.png"),
            },
            [_pil(f"ImageOps.mirror(Image.open({desk + '/leaf.png'!r})).save({desk + '/leaf_mirror.png'!r})")],
        )
    )
    _png(assets / "banner.png", (300, 150))
    out.append(
        task(
            "gimp-scale-image",
            "gimp",
            "Scale ~/Desktop/banner.png to 128 x 64 pixels and export it as ~/Desktop/banner_small.png.",
            [download("banner.png", f"{desk}/banner.png")],
            {
                "func": "check_image_size",
                "result": vm_file(f"{desk}/banner_small.png"),
                "expected": rule({"width": 128, "height": 64}),
            },
            [_pil(f"Image.open({desk + '/banner.png'!r}).resize((128, 64)).save({desk + '/banner_small.png'!r})")],
        )
    )
    _png(assets / "photo.png", (200, 120))
    Image.open(assets / "photo.png").rotate(-90, expand=True).save(assets / "photo-rotated-gold.png")
    out.append(
        task(
            "gimp-rotate-image",
            "gimp",
            "Rotate ~/Desktop/photo.png by 90 degrees clockwise and export it as ~/Desktop/photo_rotated.png.",
            [download("photo.png", f"{desk}/photo.png")],
            {
                "func": "compare_images",
                "result": vm_file(f"{desk}/photo_rotated.png"),
                "expected": cloud("photo-rotated-gold.png"),
            },
            [
                _pil(
                    f"Image.open({desk + '/photo.png'!r}).rotate(-90, expand=True)"
                    f".save({desk + '/photo_rotated.png'!r})"
                )
            ],
        )
    )
    out.append(
        task(
            "gimp-undo-levels",
            "gimp",
            "In GIMP's preferences (System Resources), set the minimal number of undo levels to 100.",
            [],
            {
                "func": "check_config_status",
                "result": {"type": "gimp_config_file", "file_name": "gimprc", "dest": "gimprc"},
                "expected": rule({"type:": "key-value", "key": "undo-levels", "value": "100"}),
            },
            [shell(f"mkdir -p {Path(GIMPRC).parent} && echo '(undo-levels 100)' >> {GIMPRC}")],
        )
    )
    return out


def _wav(path: Path, seconds: float = 30.0, rate: int = 8000) -> None:
    """A quiet 440 Hz tone, long enough to still be playing when a task is checked."""
    frames = b"".join(
        struct.pack("<h", int(3000 * math.sin(2 * math.pi * 440 * i / rate))) for i in range(int(seconds * rate))
    )
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames)


def _vlc_tasks(assets: Path) -> list[dict[str, Any]]:
    out = []
    out.append(
        task(
            "vlc-max-volume",
            "vlc",
            "In VLC's preferences (Interface, show all settings: Qt interface), set the maximum volume displayed to "
            "200 and save.",
            [],
            {
                "func": "check_qt_max_volume",
                "result": {"type": "vlc_config", "dest": "vlcrc"},
                "expected": rule({"expected_qt_max_volume": 200}),
            },
            [shell(f"mkdir -p {Path(VLCRC).parent} && printf '[qt]\\nqt-max-volume=200\\n' >> {VLCRC}")],
        )
    )
    out.append(
        task(
            "vlc-recordings-folder",
            "vlc",
            "Make VLC save its recordings into ~/Desktop (Preferences, Input / Codecs, Record directory or filename).",
            [],
            {
                "func": "is_vlc_recordings_folder",
                "result": {"type": "vlc_config", "dest": "vlcrc"},
                "expected": rule({"recording_file_path": f"{HOME}/Desktop"}),
            },
            [shell(f"mkdir -p {Path(VLCRC).parent} && printf 'input-record-path={HOME}/Desktop\\n' >> {VLCRC}")],
        )
    )
    _wav(assets / "tone.wav")
    music = f"{HOME}/Music/tone.wav"
    out.append(
        task(
            "vlc-play-file",
            "vlc",
            "VLC has tone.wav open and paused. Play it.",
            [
                download("tone.wav", music),
                # Paused by the loop below, not by --start-paused: with --loop that flag pauses again at each pass's
                # start (every 30 s), so a file played by the agent read "paused" to an evaluator that looked later
                # (OSWorld's, through its harness under TCG); and it lost a race on VLC's first start anyway.
                launch(f"vlc --loop --aout=adummy {music}"),
                run(
                    f"for i in $(seq 1 45); do curl -sf -u :password {VLC_HTTP} >/dev/null && break; sleep 1; done; "
                    f"for i in $(seq 1 30); do curl -sf -u :password '{VLC_HTTP}?command=pl_forcepause' >/dev/null; "
                    f"curl -sf -u :password {VLC_HTTP} | grep -q '<state>paused</state>' && exit 0; sleep 1; done; "
                    "echo 'VLC did not pause' >&2; exit 1"
                ),
            ],
            {
                "func": "is_vlc_playing",
                "result": {"type": "vlc_playing_info", "dest": "status.xml"},
                "expected": rule({"type": "file_name", "file_name": "tone.wav"}),
            },
            [
                # VLC under TCG takes a moment to leave the paused state: resume, then wait until it says so.
                shell(
                    f"curl -sf -u :password '{VLC_HTTP}?command=pl_forceresume' >/dev/null; "
                    f"for i in $(seq 1 60); do curl -sf -u :password {VLC_HTTP} | grep -q '<state>playing</state>' "
                    f"&& exit 0; [ $i = 20 ] && curl -sf -u :password '{VLC_HTTP}?command=pl_play' >/dev/null; "
                    "sleep 1; done; exit 1",
                    timeout=90,
                )
            ],
        )
    )
    return out


def _vsix(path: Path) -> None:
    """A minimal VS Code extension package (a zip with its manifest), installable offline."""
    package = {
        "name": "wordcount",
        "displayName": "Word count",
        "publisher": "osfleet",
        "version": "0.0.1",
        "engines": {"vscode": "^1.60.0"},
        "contributes": {"commands": [{"command": "wordcount.show", "title": "Word count"}]},
    }
    manifest = (
        '<?xml version="1.0" encoding="utf-8"?>\n<PackageManifest Version="2.0.0" '
        'xmlns="http://schemas.microsoft.com/developer/vsx-schema/2011"><Metadata>'
        '<Identity Language="en-US" Id="wordcount" Version="0.0.1" Publisher="osfleet"/>'
        '<DisplayName>Word count</DisplayName><Description xml:space="preserve">Counts words.</Description>'
        '</Metadata><Installation><InstallationTarget Id="Microsoft.VisualStudio.Code"/></Installation>'
        '<Dependencies/><Assets><Asset Type="Microsoft.VisualStudio.Code.Manifest" Path="extension/package.json" '
        'Addressable="true"/></Assets></PackageManifest>\n'
    )
    types = (
        '<?xml version="1.0" encoding="utf-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/'
        'content-types"><Default Extension=".json" ContentType="application/json"/><Default Extension=".vsixmanifest" '
        'ContentType="text/xml"/></Types>\n'
    )
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in (
            ("[Content_Types].xml", types),
            ("extension.vsixmanifest", manifest),
            ("extension/package.json", json.dumps(package, indent=2) + "\n"),
        ):
            z.writestr(zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0)), text)
    path.write_bytes(buf.getvalue())


def _json_merge(path: str, update: str) -> dict[str, Any]:
    return python(f"""
import json, os
path = {path!r}
os.makedirs(os.path.dirname(path), exist_ok=True)
data = json.load(open(path)) if os.path.exists(path) and open(path).read().strip() else None
{update}
json.dump(data, open(path, "w"), indent=4)""")


def _vscode_tasks(assets: Path) -> list[dict[str, Any]]:
    out = []
    user = f"{HOME}/.config/Code/User"
    out.append(
        task(
            "vscode-auto-save",
            "vs_code",
            "Make VS Code save files automatically after a delay (the 'Files: Auto Save' setting, afterDelay).",
            [],
            {
                "func": "check_json_settings",
                "result": vm_file(f"{user}/settings.json"),
                "expected": rule({"expected": {"files.autoSave": "afterDelay"}}),
            },
            [_json_merge(f"{user}/settings.json", 'data = data or {}\ndata["files.autoSave"] = "afterDelay"')],
        )
    )
    binding = {"key": "ctrl+alt+t", "command": "workbench.action.terminal.new"}
    out.append(
        task(
            "vscode-keybinding",
            "vs_code",
            "In VS Code, bind Ctrl+Alt+T to 'Terminal: Create New Terminal' (workbench.action.terminal.new).",
            [],
            {
                "func": "check_json_keybindings",
                "result": vm_file(f"{user}/keybindings.json"),
                "expected": rule({"expected": binding}),
            },
            [_json_merge(f"{user}/keybindings.json", f"data = (data or []) + [{binding!r}]")],
        )
    )
    _vsix(assets / "wordcount.vsix")
    vsix = f"{HOME}/Downloads/wordcount.vsix"
    out.append(
        task(
            "vscode-install-vsix",
            "vs_code",
            "Install the VS Code extension in ~/Downloads/wordcount.vsix.",
            [download("wordcount.vsix", vsix)],
            {
                "func": "is_extension_installed",
                # VS Code's extensions folder, as OSWorld's own extension tasks also check it with ls ("code
                # --list-extensions" starts code-server's CLI: ~30 s under TCG, the whole check's budget).
                "result": {
                    "type": "vm_command_line",
                    "command": ["ls", f"{HOME}/.vscode/extensions", "|", "grep", "osfleet.wordcount"],
                },
                "expected": rule({"type": "contain", "expected": "osfleet.wordcount"}),
            },
            [shell(f"code --install-extension {vsix}", timeout=180)],
        )
    )
    return out


def _thunderbird_profile(path: Path) -> None:
    """A Thunderbird profile (profiles.ini + prefs.js + Local Folders) as OSWorld's tasks ship theirs: a tarball
    that a set-up step extracts into the home folder."""
    prefs = (
        'user_pref("mail.account.account1.server", "server1");\n'
        'user_pref("mail.accountmanager.accounts", "account1");\n'
        'user_pref("mail.identity.id1.fullName", "Ana Tester");\n'
        'user_pref("mail.identity.id1.useremail", "ana@example.com");\n'
        'user_pref("mail.server.server1.hostname", "Local Folders");\n'
        'user_pref("mail.server.server1.type", "none");\n'
        'user_pref("mail.server.server1.userName", "nobody");\n'
    )
    ini = (
        "[Profile0]\nName=default-release\nIsRelative=1\nPath=osfleet.default-release\nDefault=1\n\n"
        "[General]\nStartWithLastProfile=1\nVersion=2\n"
    )
    files = {
        ".thunderbird/profiles.ini": ini,
        ".thunderbird/osfleet.default-release/prefs.js": prefs,
        ".thunderbird/osfleet.default-release/Mail/Local Folders/Inbox": "",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1704067200, 0o644
            tar.addfile(info, io.BytesIO(data))
    # gzip writes the time into its header: fix it so the generator writes the same bytes each run.
    raw = bytearray(buf.getvalue())
    raw[4:8] = b"\x00\x00\x00\x00"
    path.write_bytes(bytes(raw))


def _thunderbird_tasks(assets: Path) -> list[dict[str, Any]]:
    out = []
    _thunderbird_profile(assets / "thunderbird-profile.tar.gz")
    setup = [
        download("thunderbird-profile.tar.gz", f"{HOME}/thunderbird-profile.tar.gz"),
        run(f"tar -xz --recursive-unlink -f {HOME}/thunderbird-profile.tar.gz -C {HOME}/"),
    ]
    prefs = f"{THUNDERBIRD_PROFILE}/prefs.js"
    out.append(
        task(
            "thunderbird-no-auto-quote",
            "thunderbird",
            "In Thunderbird, stop quoting the original message automatically when replying (Account Settings, "
            "Composition & Addressing).",
            setup,
            {
                "func": "check_thunderbird_prefs",
                "result": vm_file(prefs),
                "expected": rule({"expect": {"mail.identity.id1.auto_quote": {"method": "eq", "ref": False}}}),
            },
            [shell(f"echo 'user_pref(\"mail.identity.id1.auto_quote\", false);' >> {prefs}")],
        )
    )
    rules_file = f"{THUNDERBIRD_PROFILE}/Mail/Local Folders/msgFilterRules.dat"
    target = "mailbox://nobody@Local%20Folders/Boss"
    condition = "AND (from,contains,boss@example.com)"
    filters = (
        f'version="9"\nlogging="no"\nname="From the boss"\nenabled="yes"\ntype="17"\naction="Move to folder"\n'
        f'actionValue="{target}"\ncondition="{condition}"\n'
    )
    out.append(
        task(
            "thunderbird-filter",
            "thunderbird",
            "In Thunderbird, add a message filter on Local Folders that moves mail from boss@example.com into a "
            "folder 'Boss'.",
            list(setup),
            {
                "func": "check_thunderbird_filter",
                "result": vm_file(rules_file),
                "expected": rule(
                    {
                        "expect": [
                            {
                                "enabled": "yes",
                                "action": "Move to folder",
                                "actionValue": target,
                                "condition": [condition],
                            }
                        ]
                    }
                ),
            },
            [python(f"open({rules_file!r}, 'w').write({filters!r})")],
        )
    )
    return out


def _accessibility_tasks(assets: Path) -> list[dict[str, Any]]:
    (assets / "shopping.txt").write_text("bread\napples\ntea\n")
    notes = f"{HOME}/Desktop/shopping.txt"
    wait = (
        "for i in $(seq 1 60); do xdotool search --onlyvisible --name shopping.txt >/dev/null && exit 0; sleep 1; "
        "done; exit 1"
    )
    return [
        task(
            "editor-open-in-mousepad",
            "text_editor",
            "Open ~/Desktop/shopping.txt in the text editor (Mousepad).",
            [download("shopping.txt", notes)],
            {
                "func": "check_accessibility_tree",
                "result": {"type": "accessibility_tree"},
                "expected": rule([{"selectors": ['application[name="mousepad"] frame[name*="shopping.txt"]']}]),
            },
            [shell(f"setsid -f mousepad {notes} >/dev/null 2>&1 </dev/null; {wait}", timeout=90)],
        )
    ]


def tasks(assets: Path) -> list[dict[str, Any]]:
    return (
        _chrome_tasks(assets)
        + _gimp_tasks(assets)
        + _vlc_tasks(assets)
        + _vscode_tasks(assets)
        + _thunderbird_tasks(assets)
        + _accessibility_tasks(assets)
    )
