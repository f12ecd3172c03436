"""The client installs alone: a fresh virtualenv with ``pip install '.[client]'`` has none of the host's packages
(libvirt, FastAPI, Fabric, Pulumi, Locust) and runs an episode against a real host agent.

The install is made from a copy of what the distribution is made of, so the checkout gets no build/ or egg-info.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from osfleet.bench.load import LocalAgent
from osfleet.vm.images import GoldenImage
from tests.conftest import local_agent

pytestmark = [pytest.mark.vm, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent
HOST_PACKAGES = ("libvirt", "fastapi", "fabric", "pulumi", "locust", "invoke", "paramiko", "psutil")

EPISODE = r"""
import sys
from osfleet.client import Fleet, InvalidActionError
from osfleet.client.messages import anthropic_content, for_model
import osfleet.gym  # registers osfleet/Desktop-v0

url, token_file = sys.argv[1], sys.argv[2]
with Fleet(url, token_file=token_file) as fleet:
    with fleet.lease() as s:
        first = s.reset("cli-write-note")
        view = for_model(first.screen, max_width=640)
        assert anthropic_content(view, first.instruction)[-1]["type"] == "image"
        try:
            s.step({"type": "teleport"})
        except InvalidActionError as exc:
            print("refused locally:", exc)
        s.step({"type": "wait", "seconds": 0}, observe=False)
        print("reward", s.evaluate().reward, "screen", first.screen.width, first.screen.height)
"""


@pytest.fixture(scope="module")
def client_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("client-install")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("osfleet", "golden_images"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    python = str(venv / "bin" / "python")
    pip = subprocess.run(
        [python, "-m", "pip", "install", "-q", "-c", str(REPO / "scripts" / "pins.txt"), f"{src}[client]"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    shutil.rmtree(src)  # the venv must not lean on the copy
    return python


@pytest.fixture(scope="module")
def agent(golden: GoldenImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalAgent, Path]]:
    with local_agent(golden, tmp_path_factory.mktemp("client-agent"), 1) as served:
        yield served


def test_the_client_only_install_has_none_of_the_hosts_packages(client_python: str) -> None:
    def importable(module: str) -> bool:
        return subprocess.run([client_python, "-c", f"import {module}"], capture_output=True).returncode == 0

    assert [m for m in HOST_PACKAGES if importable(m)] == []
    # the command is there, and a host's command says which extra it needs, in one line
    osfleet = str(Path(client_python).parent / "osfleet")
    out = subprocess.run([osfleet, "host", "serve"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        "osfleet: error: needs the 'host' extra (no module fastapi): pip install 'osfleet[host]'"
    ], out.stderr


def test_the_client_only_install_runs_an_episode(client_python: str, agent: tuple[LocalAgent, Path]) -> None:
    a, token = agent
    out = subprocess.run(
        [client_python, "-c", EPISODE, a.url, str(token)], capture_output=True, text=True, timeout=600, cwd="/"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused locally: action 0: Input tag 'teleport'" in out.stdout, out.stdout
    assert "reward 0.0 screen" in out.stdout, out.stdout  # nothing was typed: the note is not there


def test_the_quick_start_runs_from_the_client_only_install(client_python: str, agent: tuple[LocalAgent, Path]) -> None:
    """docs/tutorials/agent-loop.md's example, as written, from the client-only virtualenv."""
    a, token = agent
    out = subprocess.run(
        [client_python, str(REPO / "examples" / "agent_loop.py"), a.url, str(token)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd="/",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith('"buy milk". -> reward 1.0'), out.stdout
