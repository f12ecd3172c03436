"""Recorded episodes on the fake host (no VM): record -> ls -> show -> export (JSONL, Parquet), who ended an
episode (the agent, or the infrastructure), the size cap, and client metadata per step."""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from PIL import Image

from osfleet.api.app import create_app
from osfleet.cli import cli
from osfleet.config import AgentConfig, RecordingConfig
from osfleet.errors import VirtError
from osfleet.recording import TrajectoryStore, store_dir
from tests.fakes import FakeHost

TOKEN = "recording-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TASK = {
    "id": "t-rec",
    "instruction": "Run something.",
    "evaluator": {
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": "check"},
        "expected": {"type": "rule", "rules": {"expected": "yes\n"}},  # OSWorld's exact_match: the whole output
    },
}
META = {"model": "policy-7b", "tokens": {"in": 812, "out": 34}, "logprobs": [-0.12, -1.5]}


def agent(fake: FakeHost, **rec: object) -> TestClient:
    config = AgentConfig(token=TOKEN, warm=0, recording=RecordingConfig(**rec))  # type: ignore[arg-type]
    return TestClient(create_app(config, lambda: fake))


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "home", ready=2)


@pytest.fixture
def home_env(fake: FakeHost, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("OSFLEET_HOME", str(fake.home))
    yield fake.home


def episode(c: TestClient, steps: int = 2, evaluate: bool = True, release: bool = True) -> tuple[str, str]:
    lease = c.post("/v1/leases", json={"holder": "trainer-1"}, headers=AUTH).json()
    rid, lid = lease["replica_id"], lease["lease_id"]
    assert c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": TASK}, headers=AUTH).status_code == 200
    for i in range(steps):
        body = {
            "lease_id": lid,
            "action_id": f"a{i}",
            "actions": [{"type": "shell", "command": f"echo {i}"}, {"type": "click", "x": 3, "y": 4}],
            "metadata": {**META, "step": i},
            "observe": i % 2 == 0,  # recorded either way
        }
        r = c.post(f"/v1/replicas/{rid}/step", json=body, headers=AUTH)
        assert r.status_code == 200, r.text
        assert (r.json()["observation"] is not None) == (i % 2 == 0)
    if evaluate:
        assert c.post(f"/v1/replicas/{rid}/evaluate", json={"lease_id": lid}, headers=AUTH).json()["reward"] == 1.0
    if release:
        assert c.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=AUTH).status_code == 200
    return rid, lid


@pytest.mark.system
def test_record_ls_show_export_round_trip(fake: FakeHost, home_env: Path, tmp_path: Path) -> None:
    with agent(fake, image_format="webp", quality=60) as c:
        rid, _ = episode(c, steps=3)
        # a retried step is replayed, not recorded twice
    store = TrajectoryStore(store_dir(home_env))
    [meta] = store.all()
    assert (meta.replica_id, meta.holder, meta.task_id, meta.steps) == (rid, "trainer-1", "t-rec", 3)
    assert (meta.ended_by, meta.end_reason, meta.reward, meta.success) == ("agent", "evaluated", 1.0, True)
    assert meta.image_format == "webp" and meta.reset_image == "reset.webp"
    steps = store.steps(meta.id)
    assert [s.action_id for s in steps] == ["a0", "a1", "a2"]
    assert steps[1].metadata == {**META, "step": 1}
    assert [a["type"] for a in steps[0].actions] == ["shell", "click"] and all(r["ok"] for r in steps[0].results)
    for s in steps:  # every observation re-encoded (the fake's are PNG) and readable
        with Image.open(store.image_path(meta.id, s.image or "")) as img:
            assert img.format == "WEBP" and img.size == fake.image.screen == (s.width, s.height)

    runner = CliRunner()
    ls = runner.invoke(cli, ["trajectories", "ls", "--json"])
    assert ls.exit_code == 0, ls.output
    assert [x["id"] for x in json.loads(ls.output)] == [meta.id]
    table = runner.invoke(cli, ["trajectories", "ls"])
    assert meta.id in table.output and "agent:evaluated" in table.output
    show = runner.invoke(cli, ["trajectories", "show", meta.id])
    assert show.exit_code == 0 and "policy-7b" in show.output and "#2" in show.output
    shown = json.loads(runner.invoke(cli, ["trajectories", "show", meta.id, "--json"]).output)
    assert len(shown["step_records"]) == 3 and shown["reward"] == 1.0
    missing = runner.invoke(cli, ["trajectories", "show", "t-nope"])
    assert missing.exit_code == 1 and "no recorded episode t-nope" in missing.output

    out = tmp_path / "ep.jsonl"
    r = runner.invoke(cli, ["trajectories", "export", meta.id, "--format", "jsonl", "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [x["step"] for x in rows] == [0, 1, 2] and {x["episode_id"] for x in rows} == {meta.id}
    assert rows[2]["metadata"]["logprobs"] == [-0.12, -1.5] and rows[0]["episode_reward"] == 1.0
    assert Image.open(io.BytesIO(base64.b64decode(rows[0]["image"]))).size == fake.image.screen


@pytest.mark.system
def test_parquet_export(fake: FakeHost, home_env: Path, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    with agent(fake) as c:
        episode(c, steps=2)
        episode(c, steps=1, evaluate=False)
    out = tmp_path / "all.parquet"
    r = CliRunner().invoke(cli, ["trajectories", "export", "--all", "--format", "parquet", "--out", str(out)])
    assert r.exit_code == 0, r.output
    table = pq.read_table(out).to_pylist()
    assert len(table) == 3
    by_episode: dict[str, list[dict[str, object]]] = {}
    for row in table:
        by_episode.setdefault(str(row["episode_id"]), []).append(row)
    reasons = sorted(rows[0]["episode_end_reason"] for rows in by_episode.values())  # type: ignore[type-var]
    assert reasons == ["evaluated", "released"]
    row = next(x for x in table if x["step"] == 1)
    assert json.loads(str(row["metadata"]))["model"] == "policy-7b"
    assert Image.open(io.BytesIO(row["image"])).format == "JPEG"  # type: ignore[arg-type]


@pytest.mark.system
def test_an_infrastructure_failure_ends_the_episode_as_such(fake: FakeHost, home_env: Path) -> None:
    with agent(fake) as c:
        lease = c.post("/v1/leases", json={}, headers=AUTH).json()
        rid, lid = lease["replica_id"], lease["lease_id"]
        c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": TASK}, headers=AUTH)
        fake.act_error = VirtError("QEMU went away")
        body = {"lease_id": lid, "action_id": "a0", "actions": [{"type": "click", "x": 1, "y": 1}]}
        r = c.post(f"/v1/replicas/{rid}/step", json=body, headers=AUTH)
        assert r.status_code == 503 and r.json()["kind"] == "infrastructure"
    [meta] = TrajectoryStore(store_dir(home_env)).all()
    assert (meta.ended_by, meta.end_reason, meta.error, meta.reward) == (
        "infrastructure",
        "replica_failed",
        "QEMU went away",
        None,
    )


@pytest.mark.system  # over a second: kept out of the unit tier's 2 minutes
def test_an_expired_lease_ends_the_episode_as_the_infrastructures_doing(fake: FakeHost, home_env: Path) -> None:
    with agent(fake) as c:
        lease = c.post("/v1/leases", json={"ttl_seconds": 0.2}, headers=AUTH).json()
        rid, lid = lease["replica_id"], lease["lease_id"]
        c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": TASK}, headers=AUTH)
        time.sleep(0.3)
        c.app.state  # noqa: B018
        deadline = time.monotonic() + 10  # the recorder's sweep runs every 2 s
        store = TrajectoryStore(store_dir(home_env))
        while time.monotonic() < deadline and store.all()[0].open:
            time.sleep(0.1)
        [meta] = store.all()
        assert (meta.ended_by, meta.end_reason) == ("infrastructure", "lease_expired")


@pytest.mark.system
def test_the_store_stays_under_its_cap_oldest_first(fake: FakeHost, home_env: Path) -> None:
    with agent(fake, max_episodes=2) as c:
        for _ in range(4):
            episode(c, steps=1)
            time.sleep(0.01)
    metas = TrajectoryStore(store_dir(home_env)).all()
    assert len(metas) == 2
    stamps = [m.started_at for m in metas]
    assert stamps == sorted(stamps, reverse=True)
    with agent(fake, max_bytes=1) as c:  # one byte: only the episode being written is kept
        episode(c, steps=1, release=False)
        assert len(TrajectoryStore(store_dir(home_env)).all()) == 1


@pytest.mark.system
def test_recording_is_off_unless_configured(fake: FakeHost, home_env: Path) -> None:
    with TestClient(create_app(AgentConfig(token=TOKEN, warm=0), lambda: fake)) as c:
        episode(c, steps=1)
    assert not store_dir(home_env).exists()


@pytest.mark.system
def test_osgym_episodes_are_recorded_with_their_action_strings(fake: FakeHost, home_env: Path) -> None:
    with agent(fake) as c:
        vm = c.post("/reset", json={"task_config": TASK}, headers=AUTH).json()["vm_id"]
        assert c.post("/step", json={"action": "click(1,2)", "vm_id": vm}, headers=AUTH).status_code == 200
        assert c.post("/step", json={"action": "finish()", "vm_id": vm}, headers=AUTH).json()["is_finish"]
    [meta] = TrajectoryStore(store_dir(home_env)).all()
    steps = TrajectoryStore(store_dir(home_env)).steps(meta.id)
    assert [s.metadata["osgym_action"] for s in steps] == ["click(1,2)", "finish()"]
    assert (meta.end_reason, meta.ended_by, meta.steps) == ("evaluated", "agent", 2)


@pytest.mark.system
def test_a_new_task_on_the_same_lease_starts_a_new_episode(fake: FakeHost, home_env: Path) -> None:
    with agent(fake) as c:
        lease = c.post("/v1/leases", json={}, headers=AUTH).json()
        rid, lid = lease["replica_id"], lease["lease_id"]
        for n in range(2):
            c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": TASK, "observe": False}, headers=AUTH)
            body = {"lease_id": lid, "action_id": f"a{n}", "actions": [{"type": "wait", "seconds": 0}]}
            assert c.post(f"/v1/replicas/{rid}/step", json=body, headers=AUTH).status_code == 200
        c.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=AUTH)
    older, newer = reversed(TrajectoryStore(store_dir(home_env)).all())
    assert (older.end_reason, older.ended_by, older.steps) == ("reset", "agent", 1)
    assert (newer.end_reason, newer.ended_by, newer.steps) == ("released", "agent", 1)
    assert older.reset_image is not None  # recorded though the client did not ask to observe


@pytest.mark.vm
def test_a_real_replicas_episode_is_recorded_with_its_desktop(golden: Any, settings: Any, no_leftovers: None) -> None:
    from osfleet.replicas.manager import ReplicaHost

    hosts: list[ReplicaHost] = []

    def factory() -> ReplicaHost:
        hosts.append(ReplicaHost(golden, settings, warm=1, auto_recover=False))
        return hosts[0]

    store = TrajectoryStore(store_dir(settings.home))
    before = set(store.ids())
    config = AgentConfig(token=TOKEN, warm=1, recording=RecordingConfig(quality=70))
    try:
        with TestClient(create_app(config, factory)) as c:
            try:
                deadline = time.monotonic() + 240
                while time.monotonic() < deadline and not any(r.state == "ready" for r in hosts[0].replicas()):
                    time.sleep(0.5)
                lease = c.post("/v1/leases", json={"holder": "vm-test"}, headers=AUTH).json()
                rid, lid = lease["replica_id"], lease["lease_id"]
                reset = {"lease_id": lid, "task_id": "cli-write-note", "observe": False}
                assert c.post(f"/v1/replicas/{rid}/reset", json=reset, headers=AUTH).status_code == 200
                oracle = [{"type": "cli_command", "command": "mkdir -p ~/notes && echo 'buy milk' > ~/notes/todo.txt"}]
                step = {"lease_id": lid, "action_id": "a1", "actions": oracle, "observe": False, "metadata": META}
                assert c.post(f"/v1/replicas/{rid}/step", json=step, headers=AUTH).status_code == 200
                scored = c.post(f"/v1/replicas/{rid}/evaluate", json={"lease_id": lid}, headers=AUTH)
                assert scored.json()["reward"] == 1.0
                thumb = c.get(f"/ui/api/replicas/{rid}/screen", params={"w": 320}, headers=AUTH)
                with Image.open(io.BytesIO(thumb.content)) as img:
                    assert img.format == "JPEG" and img.width == 320
                assert c.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}, headers=AUTH).status_code == 200
            finally:
                hosts[0].stop_background()
                hosts[0].down()
        [tid] = set(store.ids()) - before
        meta, steps = store.meta(tid), store.steps(tid)
        assert (meta.task_id, meta.reward, meta.end_reason, meta.steps) == ("cli-write-note", 1.0, "evaluated", 1)
        assert steps[0].metadata == META and steps[0].results[0]["ok"]
        for name in (meta.reset_image, steps[0].image):
            with Image.open(store.image_path(tid, name or "")) as img:
                assert img.format == "JPEG" and img.size == (1280, 800)
                low, high = img.convert("L").getextrema()
                assert high - low > 50  # a drawn desktop, not a blank screen
    finally:
        for tid in set(store.ids()) - before:
            store.delete(tid)


def noise_png(seed: int) -> bytes:
    """A screen-sized image JPEG cannot shrink much (random pixels): ~100 KB per recorded step."""
    import random

    rnd = random.Random(seed)
    img = Image.frombytes("RGB", (320, 200), bytes(rnd.getrandbits(8) for _ in range(320 * 200 * 3)))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.system
def test_the_byte_cap_holds_under_a_flood_of_steps(tmp_path: Path) -> None:
    """Twelve episodes stepping at once with big screens, 10 000-character actions and 300 KB of metadata
    per step: the store stays under its cap (finished episodes go first, then the oldest open ones), each
    episode stops at its share, and what was kept is clipped."""
    from osfleet.recording import Recorder

    cap = 3 * 2**20
    store = TrajectoryStore(tmp_path / "trajectories")
    rec = Recorder(store, RecordingConfig(max_bytes=cap, quality=95))
    shots = [noise_png(i) for i in range(4)]
    old = rec.begin("r-old", "l-old", task={"id": "old"})
    rec.step("r-old", "l-old", "a0", [{"type": "wait"}], [{"type": "wait", "ok": True}], 0.1, True, None, shots[0])
    rec.end("r-old", "l-old", "released")
    big_action = {"type": "type", "text": "x" * 10000}
    meta = {"blob": "m" * 300_000}

    def flood(n: int) -> None:
        rid, lid = f"r-{n}", f"l-{n}"
        rec.begin(rid, lid, task={"id": f"t{n}"})
        for i in range(40):
            result = {"type": "type", "ok": True, "stdout": "o" * 50_000}
            rec.step(rid, lid, f"a{i}", [big_action] * 20, [result], 0.1, False, meta, shots[i % 4])

    threads = [threading.Thread(target=flood, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    on_disk = store.bytes_on_disk()
    metas = store.all()
    meta_files = sum((store.root / m.id / "meta.json").stat().st_size for m in metas)
    assert on_disk - meta_files <= cap, (on_disk, meta_files)
    assert old not in {m.id for m in metas}  # the finished episode went first
    assert all(m.bytes <= cap // 8 for m in metas) and any(m.capped_at_step is not None for m in metas)
    step = store.steps(metas[0].id)[0]
    assert len(step.actions) == 20 and step.actions[0]["text_truncated_from"] == 10000
    assert len(step.actions[0]["text"]) == 4096 and step.results[0]["stdout_truncated_from"] == 50_000
    assert "osfleet_note" in step.metadata
    kept = {m.replica_id for m in metas}
    assert len(kept) < 12  # open episodes were dropped too (12 at their share would be 1.5 caps)
    gone = sorted({f"r-{n}" for n in range(12)} - kept)[0]
    rec.step(gone, "l-" + gone[2:], "late", [{"type": "wait"}], [], 0.1, False)  # an evicted episode is not begun again
    assert {m.replica_id for m in store.all()} == kept


class _SignallingLock:
    """A lock that says when a thread starts waiting for it (so a test can hold a prune open at a chosen point)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.waited = threading.Event()

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            self.waited.set()
            self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


@pytest.mark.unit
def test_a_step_written_while_a_prune_recounts_is_not_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving behind a CI failure of the flood test: a prune recounts the store from disk while another
    episode writes a step; that step landed after the recount read its episode but reported its size before the
    recount replaced the running total, so the total forgot it and the store crept over its cap unseen. Forced
    here: the recount's read of the store lets episode B write (and wait for the prune) before it returns."""
    from osfleet.recording import Recorder

    store = TrajectoryStore(tmp_path / "trajectories")
    rec = Recorder(store, RecordingConfig(max_bytes=2 * 2**20, quality=95))
    shots = [noise_png(i) for i in range(4)]
    pruning = _SignallingLock()
    rec._pruning = pruning  # type: ignore[assignment]
    rec.begin("r-b", "l-b", task={"id": "b"})
    real_all, real_prune = store.all, store.prune
    counted, pruned = threading.Event(), threading.Event()

    def prune(*args: Any, **kwargs: Any) -> list[str]:
        try:
            return real_prune(*args, **kwargs)
        finally:
            pruned.set()

    def all_then_a_step_of_b() -> list[Any]:
        metas = real_all()
        if pruned.is_set() and pruning._lock.locked() and not counted.is_set():  # the recount after the prune
            counted.set()
            writer = threading.Thread(
                target=rec.step, args=("r-b", "l-b", "b0", [{"type": "wait"}], [], 0.1, False, None, shots[3])
            )
            writer.start()
            assert pruning.waited.wait(10)  # B wrote its step and waits for this prune
            metas_after = real_all()
            assert sum(m.bytes for m in metas_after) > sum(m.bytes for m in metas)
        return metas

    monkeypatch.setattr(store, "all", all_then_a_step_of_b)
    monkeypatch.setattr(store, "prune", prune)
    for n in range(40):  # episodes of A's replica fill the store past its cap: one of their steps starts the prune
        lease = f"l-a{n}"
        rec.begin("r-a", lease, task={"id": f"a{n}"})
        for i in range(3):
            rec.step("r-a", lease, f"a{n}.{i}", [{"type": "wait"}], [], 0.1, False, None, shots[i % 3])
        rec.end("r-a", lease, "released")
        if counted.is_set():
            break
    assert counted.is_set()
    deadline = time.monotonic() + 10
    while pruning._lock.locked() and time.monotonic() < deadline:
        time.sleep(0.01)
    monkeypatch.setattr(store, "all", real_all)
    on_disk = sum(m.bytes for m in store.all())
    assert rec._bytes >= on_disk, "the running total forgot bytes that are on disk"
