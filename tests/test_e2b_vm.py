"""E2B's and Cua's clients on a real desktop replica, through ``osfleet e2b serve`` and ``osfleet cua serve`` run as
their commands over a real host agent (heavy: run under the lock).

    flock /tmp/osfleet-heavy.lock .venv/bin/python -m pytest -m vm -n0 tests/test_e2b_vm.py

e2b-desktop (in a venv of its own) types a command into the desktop's terminal and reads back what it wrote; E2B's
SDK follows a command's output as it prints, kills one, uses the filesystem calls and pauses and resumes a sandbox;
cua-computer types into the terminal and reads the file through its own ``run_command``. The E2B key is the host
agent's operator token here (tests/test_e2b.py holds two clients apart, offline; the acceptance check does it on a
replica).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from osfleet.bench.load import LocalAgent
from osfleet.vm.images import GoldenImage
from tests import e2b_desktop_venv
from tests.conftest import local_agent
from tests.test_fleet import free_port

pytestmark = [pytest.mark.vm, pytest.mark.slow]

NOTE = "mkdir -p ~/notes && echo 'buy milk' > ~/notes/todo.txt"


@pytest.fixture(scope="module")
def agent(golden: GoldenImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalAgent, Path]]:
    with local_agent(golden, tmp_path_factory.mktemp("e2b-agent"), 2) as served:
        yield served


class Command:
    """An ``osfleet`` server command as a subprocess, stopped with SIGTERM (its clean-up path)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, probe: str) -> None:
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "osfleet", *args],
                env={**os.environ, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, log.read_text()[-2000:]
            try:
                httpx.get(probe, timeout=2)
                return
            except httpx.TransportError:
                time.sleep(0.3)
        raise AssertionError(f"{args[:2]} did not answer within 120 s: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)


@pytest.fixture(scope="module")
def e2b(agent: tuple[LocalAgent, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    served, _ = agent
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("e2b-serve") / "e2b.log"
    server = Command(["e2b", "serve", "--url", served.url, "--port", str(port)], {}, log, f"{url}/v2/sandboxes")
    yield url
    server.stop()


def leased(agent: tuple[LocalAgent, Path]) -> list[str]:
    served, _ = agent
    answer = httpx.get(f"{served.url}/v1/replicas", headers={"Authorization": f"Bearer {served.token}"}).json()
    return [r["id"] for r in answer if r["leased"]]


def test_e2b_desktop_types_a_command_into_a_real_desktop_and_reads_what_it_wrote(
    agent: tuple[LocalAgent, Path], e2b: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("e2b-desktop")
    python = e2b_desktop_venv.make(folder)
    done = e2b_desktop_venv.run_flow(python, folder, e2b, agent[0].token, NOTE, 3.0)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["wrong_key"] == "AuthenticationException"
    assert seen["png"] == "89504e47" and seen["size"] == [1280, 800] and seen["cursor"] == [200, 200]
    assert seen["cat"] == "buy milk\n" and seen["read"] == "hello from e2b" and seen["who"] == "user"
    assert seen["running_after_kill"] is False and leased(agent) == []


def test_commands_stream_die_by_signal_and_files_answer_in_a_real_guest(
    agent: tuple[LocalAgent, Path], e2b: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from e2b import CommandExitException, Sandbox

    for name, value in (("E2B_API_URL", e2b), ("E2B_SANDBOX_URL", e2b), ("E2B_API_KEY", agent[0].token)):
        monkeypatch.setenv(name, value)
    box = Sandbox.create(timeout=600)
    try:
        printed: list[tuple[float, str]] = []
        done = box.commands.run(
            "for i in 1 2 3; do echo $i; sleep 2; done", on_stdout=lambda s: printed.append((time.monotonic(), s))
        )
        assert done.stdout == "1\n2\n3\n" and "".join(s for _, s in printed) == "1\n2\n3\n"
        assert printed[-1][0] - printed[0][0] > 2  # streamed as it printed, not all at the end
        slow = box.commands.run("sleep 300", background=True)
        assert box.commands.kill(slow.pid)
        with pytest.raises(CommandExitException) as killed:
            slow.wait()
        assert killed.value.exit_code == 137
        assert box.files.make_dir("/home/user/e2b-dir") is True and box.files.make_dir("/home/user/e2b-dir") is False
        box.files.write("/home/user/e2b-dir/a.txt", "a")
        assert [e.name for e in box.files.list("/home/user/e2b-dir")] == ["a.txt"]
        info = box.files.get_info("/home/user/e2b-dir/a.txt")
        assert (info.size, info.owner) == (1, "user")
        box.files.rename("/home/user/e2b-dir/a.txt", "/home/user/e2b-dir/b.txt")
        box.files.remove("/home/user/e2b-dir")
        assert not box.files.exists("/home/user/e2b-dir")
        left = box.commands.run("ls -a /tmp/.osfleet-e2b").stdout.split()
        assert left[:2] == [".", ".."] and len(left) == 3, left  # nothing left behind but this command's own folder
        assert len(left[2]) == 16 and set(left[2]) <= set("0123456789abcdef"), left
    finally:
        box.kill()


def test_a_paused_sandbox_resumes_with_its_state(agent: tuple[LocalAgent, Path], e2b: str) -> None:
    from e2b import Sandbox

    box = Sandbox.create(timeout=600, api_key=agent[0].token, api_url=e2b, sandbox_url=e2b)
    try:
        box.commands.run("echo kept > /home/user/kept.txt")
        assert box.pause() is True and leased(agent) == []
        again = Sandbox.connect(box.sandbox_id, timeout=600, api_key=agent[0].token, api_url=e2b, sandbox_url=e2b)
        assert again.files.read("/home/user/kept.txt") == "kept\n"
    finally:
        box.kill()
    assert leased(agent) == []


def test_cua_types_into_a_real_desktop_and_reads_the_file(
    agent: tuple[LocalAgent, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    os.environ["CUA_TELEMETRY_ENABLED"] = "false"  # before cua-core is imported: it reports to its vendor otherwise
    from computer.interface.linux import LinuxComputerInterface

    served, _ = agent
    address = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
    folder = tmp_path_factory.mktemp("cua-serve")
    env = {"OSFLEET_API_TOKEN": served.token, "OSFLEET_HOME": str(folder)}
    server = Command(
        ["cua", "serve", "--url", served.url, "--bind", address],
        env,
        folder / "cua.log",
        f"http://{address}:8000/status",
    )
    try:
        assert len(leased(agent)) == 1

        async def steps() -> tuple[bytes, str]:
            c = LinuxComputerInterface(address)
            await c.wait_for_ready(timeout=60)
            shot = await c.screenshot()
            await c.left_click(200, 200)
            await c.type_text("echo cua > /tmp/cua.txt\n")
            deadline = time.monotonic() + 30
            read = ""
            while read != "cua\n" and time.monotonic() < deadline:
                read = (await c.run_command("cat /tmp/cua.txt 2>/dev/null")).stdout
                await asyncio.sleep(0.3)
            return shot, read

        shot, read = asyncio.run(steps())
        assert shot[:4] == b"\x89PNG" and read == "cua\n"
    finally:
        server.stop()
    assert leased(agent) == []
