"""The Python client, Gymnasium environment and OpenEnv adapter against real host agents on loopback over fake
guests (no VM): the HTTP, retries, errors and lease handling are all real; only the desktop is a stand-in."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import osfleet.gym  # noqa: F401  (registers osfleet/Desktop-v0)
from osfleet.client import (
    AsyncFleet,
    AuthenticationError,
    CapacityError,
    Fleet,
    InfrastructureError,
    InvalidActionError,
    InvalidTaskError,
    LeaseError,
    NotFoundError,
    RetryPolicy,
)
from osfleet.client.messages import anthropic_content, for_model, from_anthropic, from_openai, openai_content
from osfleet.gym import DesktopEnvError, InvalidDesktopAction
from osfleet.protocol.actions import Action, ActionResult
from osfleet.replicas.actions import check_actions
from osfleet.replicas.errors import LeaseError as ReplicaLeaseError
from osfleet.replicas.leases import Claim
from tests.fakes import FakeHost
from tests.test_fleet import TASK, Agent, free_port

TOKEN = "token-h1"
REPO = Path(__file__).resolve().parent.parent


class BoundedHost(FakeHost):
    """A fake host that refuses off-screen input as the real one does (``check_actions``)."""

    def act(self, rid: str, actions: list[Action], claim: Claim | None = None) -> list[ActionResult]:
        check_actions(actions, self.image.screen)
        return super().act(rid, actions, claim)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent("h1", BoundedHost(tmp_path / "h1", ready=4), free_port())
    a.start()
    yield a
    a.stop()


def url_of(a: Agent) -> str:
    return f"http://127.0.0.1:{a.port}"


def leased(a: Agent) -> int:
    return sum(1 for r in a.host.replicas() if r.lease is not None)


class DroppingProxy:
    """A TCP proxy that forwards requests to ``target`` but, for the first ``drops`` requests whose body contains
    ``marker``, closes the client's connection after the server answered (the answer never arrives)."""

    def __init__(self, target: int, marker: bytes, drops: int = 1) -> None:
        self.target, self.marker, self.drops = target, marker, drops
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.dropped = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target))
        doomed = threading.Event()  # this connection carried a marked request: its answer is swallowed

        def up() -> None:
            with contextlib.suppress(OSError):
                while data := client.recv(1 << 16):
                    if self.marker in data and self.dropped < self.drops:
                        self.dropped += 1
                        doomed.set()
                    upstream.sendall(data)

        threading.Thread(target=up, daemon=True).start()
        try:
            while data := upstream.recv(1 << 16):
                if doomed.is_set():
                    return  # the server applied it; the client never hears back
                client.sendall(data)
        except OSError:
            return
        finally:
            for sock in (client, upstream):  # shutdown first: it wakes the other pump blocked in recv
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def openenv_server(url: str, token_file: Path, folder: Path, *options: str) -> Iterator[int]:
    """``osfleet openenv serve`` over ``url`` as a real process; yields its port once it answers, then SIGTERM."""
    port = free_port()
    with (folder / "openenv.log").open("w") as log:
        proc = subprocess.Popen(
            [
                str(REPO / ".venv/bin/osfleet"),
                "openenv",
                "serve",
                "--url",
                url,
                "--token-file",
                str(token_file),
                "--port",
                str(port),
                *options,
            ],
            stderr=log,
        )
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                    break
                except OSError:
                    assert proc.poll() is None and time.monotonic() < deadline, "openenv serve did not start"
                    time.sleep(0.2)
            yield port
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


# --- the async client --------------------------------------------------------------------------------------------
@pytest.mark.system  # starts processes (a server, the evaluation sandbox)
def test_a_session_resets_steps_observes_evaluates_forks_and_releases(agent: Agent) -> None:
    async def main() -> None:
        async with AsyncFleet(url_of(agent), TOKEN) as fleet:
            async with fleet.lease(holder="t") as s:
                r = await s.reset(TASK)
                assert r.instruction == "Run something." and r.screen is not None
                assert r.screen.array().shape == (40, 64, 3)
                step = await s.step([{"type": "shell", "command": "echo hi"}])
                assert not step.replayed and step.results[0].ok and s.steps == 1
                assert (await s.observe(format="jpeg", quality=50)).format == "jpeg"
                assert (await s.evaluate()).reward == 1.0  # the fake's check says "yes" once a shell ran
                kids = await s.fork(2)
                assert [k.steps for k in kids] == [1, 1] and all(k.instruction == "Run something." for k in kids)
                assert leased(agent) == 3
                for k in kids:
                    await k.release()
            assert leased(agent) == 0

    asyncio.run(main())


@pytest.mark.system  # starts processes (a server, the evaluation sandbox)
def test_a_step_whose_answer_was_lost_is_retried_with_its_action_id_and_applied_once(agent: Agent) -> None:
    proxy = DroppingProxy(agent.port, b'"action_id": "once"'.replace(b" ", b""), drops=1)

    async def main() -> None:
        retry = RetryPolicy(backoff=0.05)
        async with AsyncFleet(f"http://127.0.0.1:{proxy.port}", TOKEN, retry=retry) as fleet, fleet.lease() as s:
            await s.reset(TASK, observe=False)
            step = await s.step({"type": "shell", "command": "echo once"}, action_id="once", observe=False)
            assert step.replayed  # the first delivery was applied; the retry got the stored result

    try:
        asyncio.run(main())
    finally:
        proxy.close()
    assert proxy.dropped == 1
    assert [a for _, acts in agent.host.applied for a in acts if getattr(a, "command", "") == "echo once"] != []
    assert sum(1 for _, acts in agent.host.applied for a in acts if getattr(a, "command", "") == "echo once") == 1


@pytest.mark.system  # starts processes (a server, the evaluation sandbox)
def test_a_lease_waits_out_503_capacity_until_a_replica_is_free_then_gives_up(tmp_path: Path) -> None:
    a = Agent("h1", BoundedHost(tmp_path / "h1", ready=0), free_port())
    a.start()
    try:
        threading.Timer(1.0, a.host._make).start()

        async def main() -> None:
            async with AsyncFleet(url_of(a), TOKEN) as fleet:
                start = time.monotonic()
                s = await fleet.lease(wait=30)
                assert time.monotonic() - start >= 0.9
                with pytest.raises(CapacityError, match="lease"):
                    await fleet.lease(wait=1.5)  # the only replica is leased
                await s.release()

        asyncio.run(main())
    finally:
        a.stop()


@pytest.mark.system  # starts processes (a server, the evaluation sandbox)
def test_each_refusal_is_one_clear_exception(agent: Agent) -> None:
    async def main() -> None:
        async with AsyncFleet(url_of(agent), "wrong-token") as bad:
            with pytest.raises(AuthenticationError, match="bearer token"):
                await bad.lease()
        async with AsyncFleet(url_of(agent), TOKEN) as fleet, fleet.lease() as s:
            with pytest.raises(NotFoundError, match="no built-in task 'no-such-task'"):
                await s.reset("no-such-task")
            with pytest.raises(InvalidTaskError, match="unsupported OSWorld metric .no_such_metric."):
                await s.reset({"id": "x", "instruction": "y", "evaluator": {"func": "no_such_metric"}})
            with pytest.raises(InvalidActionError, match="off the 64x40 screen"):
                await s.step({"type": "click", "x": 5000, "y": 5})
            with pytest.raises(InvalidActionError, match="action 0"):
                await s.step({"type": "click", "x": "left"})  # refused locally, before a round trip
            await s.release()
            with pytest.raises(LeaseError, match="released"):
                await s.step({"type": "wait", "seconds": 0})
        async with AsyncFleet(
            f"http://127.0.0.1:{free_port()}", TOKEN, retry=RetryPolicy(attempts=2, backoff=0.01)
        ) as f:
            with pytest.raises(InfrastructureError, match="cannot connect"):
                await f.lease()

    asyncio.run(main())


@pytest.mark.system  # starts processes (a server, the evaluation sandbox)
def test_a_server_that_never_answers_is_an_infrastructure_error_within_the_timeout() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (the kernel does) and never answers

    async def main() -> None:
        fleet = AsyncFleet(
            f"http://127.0.0.1:{silent.getsockname()[1]}",
            TOKEN,
            timeout=0.5,
            retry=RetryPolicy(attempts=2, backoff=0.01),
        )
        start = time.monotonic()
        with pytest.raises(InfrastructureError, match="no answer"):
            await fleet.health()
        assert time.monotonic() - start < 5
        await fleet.aclose()

    try:
        asyncio.run(main())
    finally:
        silent.close()


@pytest.mark.system
def test_hundreds_of_sessions_share_one_event_loop(tmp_path: Path) -> None:
    a = Agent("h1", BoundedHost(tmp_path / "h1", ready=200), free_port())
    a.start()
    try:

        async def one(fleet: AsyncFleet, i: int) -> bool:
            async with fleet.lease(holder=f"e{i}") as s:
                await s.reset(TASK, observe=False)
                await s.step({"type": "wait", "seconds": 0}, observe=False)
                return True

        async def main() -> list[bool]:
            async with AsyncFleet(url_of(a), TOKEN, max_connections=64) as fleet:
                return list(await asyncio.gather(*(one(fleet, i) for i in range(200))))

        assert all(asyncio.run(main()))
        assert leased(a) == 0
    finally:
        a.stop()


@pytest.mark.system  # starts processes (a server, the evaluation sandbox)
def test_a_group_starts_every_session_from_one_desktop_and_releases_all(agent: Agent) -> None:
    async def main() -> None:
        async with AsyncFleet(url_of(agent), TOKEN) as fleet:
            async with await fleet.group(TASK, 3) as group:
                assert len(group) == 3 and len({s.replica_id for s in group}) == 3
                assert len({x.data for x in group.screens if x is not None}) == 1
                assert agent.host.forked == [group[0].replica_id]
            assert leased(agent) == 0

    asyncio.run(main())


@pytest.mark.system  # starts processes (a server, the evaluation sandbox)
def test_the_blocking_twin_does_the_same(agent: Agent) -> None:
    with Fleet(url_of(agent), token_file=None, token=TOKEN) as fleet:
        with fleet.lease() as s:
            assert s.reset(TASK).instruction == "Run something."
            assert s.step({"type": "wait", "seconds": 0}).done is False
            assert s.evaluate().reward == 0.0
            kids = s.fork(1)
            kids[0].release()
        with fleet.lease() as s2, pytest.raises(NotFoundError):
            s2.reset("no-such-task")
    assert leased(agent) == 0


@pytest.mark.system
def test_a_client_killed_mid_episode_leaves_no_lease_past_its_ttl(agent: Agent) -> None:
    script = (
        "import sys, time; from osfleet.client import Fleet\n"
        f"f = Fleet({url_of(agent)!r}, {TOKEN!r}); s = f.lease(ttl=1.5); s.reset(); print(s.replica_id, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None
    rid = proc.stdout.readline().strip()
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    assert agent.host.get(rid).lease is not None
    time.sleep(2.0)
    # The lease is no longer honoured after its TTL: anyone's step with it is refused, and the host's monitor
    # (on a real host: every 2 s) takes the replica back.
    lease_id = agent.host.get(rid).lease.id  # type: ignore[union-attr]
    with pytest.raises(ReplicaLeaseError, match="expired"):
        agent.host.check_lease(rid, lease_id)
    assert agent.host.leases.expired_leases() != []


# --- model API helpers --------------------------------------------------------------------------------------------
@pytest.mark.system  # starts processes (a server, the evaluation sandbox)
def test_observations_become_chat_parts_and_tool_calls_become_actions_at_desktop_scale(agent: Agent) -> None:
    with Fleet(url_of(agent), TOKEN) as fleet, fleet.lease() as s:
        screen = s.observe()
    view = for_model(screen, max_width=32)
    assert (view.screen.width, view.screen.height) == (32, 20) and view.scale_x == 2.0
    oa = openai_content(view, "do it")
    assert oa[0] == {"type": "text", "text": "do it"}
    assert oa[1]["image_url"]["url"].startswith("data:image/png;base64,")
    an = anthropic_content(view)
    assert an[0]["source"]["media_type"] == "image/png" and an[0]["source"]["data"]
    assert from_anthropic({"action": "left_click", "coordinate": [10, 5]}, view) == [
        {"type": "click", "button": "left", "count": 1, "keys": [], "x": 21, "y": 11}  # the model pixel's centre
    ]
    # key names go as the model wrote them: the host knows X's and browsers' names
    assert from_anthropic({"action": "key", "text": "ctrl+Return"}) == [{"type": "hotkey", "keys": ["ctrl", "Return"]}]
    assert (
        from_anthropic({"action": "scroll", "coordinate": [1, 1], "scroll_direction": "up", "scroll_amount": 2})[0][
            "clicks"
        ]
        == -2
    )
    assert from_anthropic({"action": "screenshot"}) == []
    assert from_openai({"type": "keypress", "keys": ["CTRL", "S"]}) == [{"type": "hotkey", "keys": ["CTRL", "S"]}]
    assert from_openai({"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 31, "y": 19}]}, view) == [
        {"type": "drag", "path": [[3, 3], [63, 39]], "keys": []}
    ]
    with pytest.raises(InvalidActionError, match=r"click: \(1000, 1000\) is off the 32x20 screen"):
        from_openai({"type": "click", "x": 1000, "y": 1000}, view)  # refused, never clamped onto the desktop
    with pytest.raises(InvalidActionError, match="zoom: region"):
        from_anthropic({"action": "zoom"})
    with pytest.raises(InvalidActionError, match="'teleport' is not one of Anthropic's computer actions"):
        from_anthropic({"action": "teleport"})
    # and the translated actions are valid osfleet actions end to end
    with Fleet(url_of(agent), TOKEN) as fleet, fleet.lease() as s:
        assert s.step(from_openai({"type": "click", "x": 3, "y": 3}, view)).results[0].ok


# --- Gymnasium --------------------------------------------------------------------------------------------------
@pytest.mark.system  # starts processes (a server, the evaluation sandbox)
@pytest.mark.parametrize("kind", ["screen", "dict"])
def test_gymnasiums_own_checker_passes_and_an_episode_ends_with_a_reward(agent: Agent, kind: str) -> None:
    from gymnasium.utils.env_checker import check_env

    env = gym.make("osfleet/Desktop-v0", url=url_of(agent), token=TOKEN, task=TASK, max_steps=3, observation=kind)
    check_env(env.unwrapped, skip_render_check=True)
    env.close()
    env.close()
    env = gym.make("osfleet/Desktop-v0", url=url_of(agent), token=TOKEN, task=TASK, max_steps=3, observation=kind)
    env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step([{"type": "shell", "command": "echo hi"}])
    assert reward == 0.0 and not (terminated or truncated)
    obs, reward, terminated, truncated, info = env.step({"type": "terminate", "status": "success"})
    assert terminated and reward == 1.0 and info["evaluation"]["success"]
    with pytest.raises(gym.error.ResetNeeded):
        env.step({"type": "wait", "seconds": 0})
    env.close()
    assert leased(agent) == 0


@pytest.mark.system  # starts processes (a server, the evaluation sandbox)
def test_fork_gives_environments_at_the_parents_screen(agent: Agent) -> None:
    env = gym.make("osfleet/Desktop-v0", url=url_of(agent), token=TOKEN, task=TASK, max_steps=5, observation="dict")
    obs, _ = env.reset(seed=1)
    env.step({"type": "wait", "seconds": 0})
    pairs = env.unwrapped.fork(3)  # type: ignore[attr-defined]
    assert len(pairs) == 3
    for child, cobs in pairs:
        assert np.array_equal(cobs["screen"], obs["screen"]) and cobs["instruction"] == "Run something."
        assert child.unwrapped._steps == 1
        child.step({"type": "wait", "seconds": 0})
        child.close()
    env.close()
    assert leased(agent) == 0


@pytest.mark.system  # starts processes (a server, the evaluation sandbox)
def test_the_env_raises_gymnasium_errors(agent: Agent) -> None:
    with pytest.raises(DesktopEnvError, match="bearer token"):
        gym.make("osfleet/Desktop-v0", url=url_of(agent), token="wrong", task=TASK)
    env = gym.make("osfleet/Desktop-v0", url=url_of(agent), token=TOKEN, task="no-such-task")
    with pytest.raises(DesktopEnvError, match="no built-in task"):
        env.reset()
    env.unwrapped.task = TASK  # type: ignore[attr-defined]
    env.reset()
    with pytest.raises(InvalidDesktopAction, match="off the 64x40 screen"):
        env.step({"type": "click", "x": 9999, "y": 1})
    with pytest.raises(InvalidDesktopAction, match="not in the action space"):
        env.unwrapped.step({"type": 99})  # type: ignore[attr-defined]
    env.close()
    assert leased(agent) == 0


@pytest.mark.system  # starts processes (a server, the evaluation sandbox)
def test_the_vector_env_steps_every_desktop_and_autoresets_next_step(agent: Agent) -> None:
    envs = gym.make_vec(
        "osfleet/Desktop-v0",
        num_envs=3,
        vectorization_mode="vector_entry_point",
        url=url_of(agent),
        token=TOKEN,
        task=TASK,
        max_steps=2,
    )
    obs, info = envs.reset(seed=0)
    assert obs.shape == (3, 40, 64, 3) and list(info["instruction"]) == ["Run something."] * 3
    actions = [{"type": "wait", "seconds": 0}] * 3
    _, rewards, terminated, truncated, _ = envs.step(actions)
    assert not truncated.any()
    _, rewards, terminated, truncated, _ = envs.step(actions)
    assert truncated.all() and rewards.tolist() == [0.0, 0.0, 0.0]
    _, rewards, terminated, truncated, infos = envs.step(envs.action_space.sample())  # the autoreset step
    assert not truncated.any() and infos["steps"].tolist() == [0, 0, 0]
    envs.close()
    assert leased(agent) == 0


# --- OpenEnv ------------------------------------------------------------------------------------------------------
def raw_env_client(base_url: str) -> Any:
    """openenv-core's own ``EnvClient``, passing actions, observations and state through as the JSON they are."""
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient

    class Raw(EnvClient):  # type: ignore[type-arg]
        def _step_payload(self, action: Any) -> Any:
            return action

        def _parse_result(self, payload: dict[str, Any]) -> StepResult[Any]:
            return StepResult(
                observation=payload.get("observation"), reward=payload.get("reward"), done=bool(payload.get("done"))
            )

        def _parse_state(self, payload: Any) -> Any:
            return payload

    return Raw(base_url=base_url)


@pytest.mark.system
@pytest.mark.slow
def test_openenv_cores_own_client_drives_a_desktop_through_osfleet_openenv_serve(agent: Agent, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    task_file = tmp_path / "task.json"
    task_file.write_text(json.dumps(TASK))
    with openenv_server(url_of(agent), token_file, tmp_path, "--task", str(task_file), "--max-steps", "3") as port:
        schema = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/schema", timeout=5).read())
        assert "actions" in schema["action"]["properties"]

        async def main() -> None:
            async with raw_env_client(f"http://127.0.0.1:{port}") as c:
                r = await c.reset()
                assert r.observation["screenshot"] and r.observation["instruction"] == "Run something."
                assert leased(agent) == 1
                r = await c.step({"actions": [{"type": "shell", "command": "echo hi"}]})
                assert r.done is False and r.observation["results"][0]["ok"]
                r = await c.step({"actions": [{"type": "terminate"}]})
                assert r.done is True and r.reward == 1.0
                assert (await c.state())["step_count"] == 2

        asyncio.run(main())
        deadline = time.monotonic() + 10
        while leased(agent) and time.monotonic() < deadline:  # the session's desktop goes back when it closes
            time.sleep(0.1)
        assert leased(agent) == 0


@pytest.mark.system
def test_openenv_serve_refuses_to_listen_beyond_loopback_without_saying_so(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(REPO / ".venv/bin/osfleet"), "openenv", "serve", "--url", "http://127.0.0.1:1", "--bind", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "--allow-remote" in out.stderr and "Traceback" not in out.stderr
