"""The E2B and Cua servers install without the host's packages: a fresh venv with ``pip install '.[e2b,cua]'`` has no
libvirt, FastAPI, Fabric, Pulumi or Locust, and its ``osfleet e2b serve`` answers E2B's SDK over a host agent (whose
guest is a stand-in, tests/e2b_guest.py). The install is made from a copy of what the distribution is made of, so the
checkout gets no build/ or egg-info."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from tests.e2b_guest import ALICE, Look, Served
from tests.test_fleet import free_port

pytestmark = [pytest.mark.system, pytest.mark.slow]  # a venv from the package index; the server as a process
REPO = Path(__file__).resolve().parent.parent
HOST_PACKAGES = ("libvirt", "fastapi", "fabric", "pulumi", "locust", "invoke", "paramiko", "psutil")


def test_the_servers_extras_install_alone_and_serve(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("osfleet", "golden_images"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    python = str(venv / "bin" / "python")
    pins = str(REPO / "scripts" / "pins.txt")
    pip = subprocess.run(
        [python, "-m", "pip", "install", "-q", "-c", pins, f"{src}[e2b,cua]"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    shutil.rmtree(src)
    present = subprocess.run(
        [python, "-c", f"import importlib.util as u; print([m for m in {HOST_PACKAGES!r} if u.find_spec(m)])"],
        capture_output=True,
        text=True,
    )
    assert present.stdout.strip() == "[]", present.stderr
    cua = subprocess.run([str(venv / "bin" / "osfleet"), "cua", "serve", "--help"], capture_output=True, text=True)
    assert cua.returncode == 0 and "Usage: osfleet cua serve" in cua.stdout
    app = subprocess.run([python, "-c", "import osfleet.cua.app, osfleet.e2b.app"], capture_output=True, text=True)
    assert app.returncode == 0, app.stderr

    stack = Served(tmp_path / "stack")
    stack.guest.programs["echo hi"] = [Look(b"hi\n")]
    port = free_port()
    log = tmp_path / "e2b.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [str(venv / "bin" / "osfleet"), "e2b", "serve", "--url", stack.fleet_url, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert server.poll() is None, log.read_text()
            try:
                httpx.get(f"{url}/v2/sandboxes", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        box = Sandbox.create(api_key=ALICE, api_url=url, sandbox_url=url)
        assert box.commands.run("echo hi").stdout == "hi\n"
        assert len(stack.leased()) == 1
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        stack.stop()
    assert stack.leased() == []  # stopping the server gave the desktop back
