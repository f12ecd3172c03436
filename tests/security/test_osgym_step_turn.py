"""Red team: OSGym's ``POST /step`` names its vm in the body, so it used to skip its replica's turn
(``osfleet.api.osgym_turn``): a tenant could queue steps on one vm that each held a worker thread and a body of up to
the server's limit while they waited for the replica. Now:

- a step's body is bounded by what a step can carry, and one past that is refused 413 unread, even while the vm is
  busy with the tenant's previous step; a chunked one (no ``Content-Length``) is read up to that bound, not refused
  for the server's limit it is counted at;
- queued steps wait for their vm's turn on the event loop: they hold no worker thread, so another tenant's requests
  are served while they wait.

A real host agent (uvicorn on loopback, in a thread) over the test fakes, with two clients.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from osfleet.api.app import create_app
from osfleet.api.auth import digest
from osfleet.api.limits import THREADS_PER_REPLICA, THREADS_SPARE
from osfleet.api.osgym_turn import MAX_STEP_BODY
from osfleet.config import AgentConfig, ClientToken
from tests.fakes import FakeHost
from tests.security.test_fair_share_requests import Host, _answer, _raw_post, in_use, wait_for
from tests.test_tenants import ALICE, BOB, OPERATOR, OSGYM_TASK, A, B

pytestmark = pytest.mark.system  # an OSGym reset starts the evaluation jail (its task is scored there)

REPLICAS = 9
ANYIO_THREADS = 40  # anyio's default thread pool, which ``size_thread_pool`` keeps for a host this small
THREADS = max(ANYIO_THREADS, REPLICAS * THREADS_PER_REPLICA + THREADS_SPARE)


@pytest.fixture
def agent(tmp_path: Path, served: Callable[..., str]) -> Iterator[tuple[FakeHost, str]]:
    fake = FakeHost(tmp_path / "h", ready=REPLICAS - 1, max_replicas=REPLICAS)
    clients = (ClientToken("alice", digest(ALICE)), ClientToken("bob", digest(BOB)))
    config = AgentConfig(token=OPERATOR, warm=0, clients=clients, max_body_bytes=32 * 2**20)
    url = served(create_app(config, lambda: fake))
    try:
        yield fake, url
    finally:
        if fake.act_gate is not None:
            fake.act_gate.set()


def vm(url: str, who: dict[str, str]) -> int:
    r = httpx.post(f"{url}/reset", json={"task_config": OSGYM_TASK, "timeout": 600}, headers=who, timeout=30)
    assert r.status_code == 200, r.text
    return int(r.json()["vm_id"])


def step(url: str, who: dict[str, str], vm_id: int) -> httpx.Response:
    return httpx.post(f"{url}/step", json={"action": "click(1,2)", "vm_id": vm_id}, headers=who, timeout=60)


def test_an_osgym_step_larger_than_any_step_is_refused_unread_while_its_vm_is_busy(
    agent: tuple[FakeHost, str],
) -> None:
    fake, url = agent
    vm_id = vm(url, A)
    fake.act_gate = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(step, url, A, vm_id)
        assert fake.acting.wait(20)  # the vm's replica is busy with her first step
        declared = 3 * 2**20  # under the server's limit (32 MiB), over any step's
        s = _raw_post(url, "/step", ALICE, declared)  # announced, never sent: it must not be waited for
        status, headers, body = _answer(s)
        s.close()
        assert status == 413 and headers.get("connection") == "close", body
        assert f"OSGym step of {declared} bytes is over the {MAX_STEP_BODY} bytes" in body.decode()
        fake.act_gate.set()
        assert first.result().status_code == 200


def test_queued_osgym_steps_wait_for_their_turn_holding_no_worker_thread(agent: tuple[FakeHost, str]) -> None:
    fake, url = agent
    vms = [vm(url, A) for _ in range(REPLICAS - 2)]  # her share of requests in flight grows with what she holds
    fake.act_gate = threading.Event()
    with ThreadPoolExecutor(THREADS + 1) as pool:
        queued = [pool.submit(step, url, A, vms[0]) for _ in range(THREADS)]  # as many as the host has threads
        assert fake.acting.wait(20)
        wait_for(lambda: in_use(Host(fake, url), "alice", "requests") == THREADS)  # all in, their bodies read
        # bob's lease needs a worker thread: alice's queued steps must not be holding them all
        r = pool.submit(httpx.post, f"{url}/v1/leases", json={"holder": "b"}, headers=B, timeout=60)
        assert r.result(timeout=15).status_code == 201
        assert not fake.act_gate.is_set() and not any(f.done() for f in queued)  # hers still wait their turn
        fake.act_gate.set()
        assert [f.result().status_code for f in queued] == [200] * THREADS
    assert len(fake.applied) == THREADS  # each applied once, one after another


def test_a_chunked_osgym_step_is_read_up_to_the_bound_and_applied(agent: tuple[FakeHost, str]) -> None:
    fake, url = agent
    vm_id = vm(url, A)
    body = json.dumps({"action": "click(1,2)", "vm_id": vm_id}).encode()
    chunks = iter([body[:5], body[5:]])  # no Content-Length: its size is known only once it is read
    r = httpx.post(f"{url}/step", content=chunks, headers={**A, "Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text
    assert len(fake.applied) == 1
