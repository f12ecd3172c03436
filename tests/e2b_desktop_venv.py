"""A virtualenv with only ``e2b-desktop`` (what an E2B user installs), for the tests that drive ``osfleet e2b serve``
with it: it cannot live in the project's venv (it needs Pillow 13; the client's range stops at 12). Made once per
test session from the package index, at the version scripts/pins.txt names; its scripts run as subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
E2B_DESKTOP = next(
    line.strip()
    for line in (REPO / "scripts" / "pins.txt").read_text().splitlines()
    if line.startswith("e2b-desktop==")
)

# What the tests run with it: E2B's documented flow, against E2B_API_URL/E2B_SANDBOX_URL/E2B_API_KEY from the
# environment; prints one JSON line of what it saw.
FLOW = r"""
import json, os, sys, time
from e2b_desktop import Sandbox
seen = {}
good = os.environ["E2B_API_KEY"]
os.environ["E2B_API_KEY"] = "not-a-client-token"
try:
    Sandbox.create(timeout=300)
    seen["wrong_key"] = "accepted"
except Exception as exc:
    seen["wrong_key"] = type(exc).__name__
os.environ["E2B_API_KEY"] = good
s = Sandbox.create(timeout=600)
png = s.screenshot()
seen["png"] = bytes(png[:4]).hex()
seen["size"] = list(s.get_screen_size())
s.left_click(200, 200)
s.write(sys.argv[1])
s.press("enter")
time.sleep(float(sys.argv[2]))
seen["cursor"] = list(s.get_cursor_position())
seen["cat"] = s.commands.run("cat ~/notes/todo.txt").stdout
s.files.write("/home/user/e2b.txt", "hello from e2b")
seen["read"] = s.files.read("/home/user/e2b.txt")
seen["who"] = s.commands.run("id -un").stdout.strip()
seen["id"] = s.sandbox_id
s.kill()
seen["running_after_kill"] = s.is_running()
print(json.dumps(seen))
"""

# The live view: stream.start(require_auth=True), then the URL e2b-desktop gives for it; stopped, the sandbox killed
# when the caller closes standard input.
STREAM = r"""
import json, sys
from e2b_desktop import Sandbox
s = Sandbox.create(timeout=300)
try:
    s.stream.start(require_auth=True)
    print(json.dumps({"url": s.stream.get_url(auth_key=s.stream.get_auth_key())}), flush=True)
    sys.stdin.read()
    s.stream.stop()
    print(json.dumps({"stopped": True}), flush=True)
finally:
    s.kill()
"""


def make(folder: Path) -> str:
    """The venv's python, made in ``folder`` with e2b-desktop alone."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    venv = folder / "venv-e2b-desktop"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    python = str(venv / "bin" / "python")
    pip = subprocess.run(
        [python, "-m", "pip", "install", "-q", E2B_DESKTOP], capture_output=True, text=True, env=env, timeout=1200
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    return python


def environment(folder: Path, url: str, key: str) -> dict[str, str]:
    """What E2B's SDK is given: the server for both planes, and the key."""
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(folder),
        "E2B_API_KEY": key,
        "E2B_API_URL": url,
        "E2B_SANDBOX_URL": url,
    }


def run_flow(
    python: str, folder: Path, url: str, key: str, typed: str, settle: float
) -> subprocess.CompletedProcess[str]:
    """Run ``FLOW`` with the venv's python against the server at ``url``."""
    script = folder / "e2b_flow.py"
    script.write_text(FLOW)
    return subprocess.run(
        [python, str(script), typed, str(settle)],
        capture_output=True,
        text=True,
        env=environment(folder, url, key),
        cwd=folder,
        timeout=900,
    )
