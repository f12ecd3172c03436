"""Real replicas under libvirt (TCG here): resets, input, identity, failures, adoption, pool, teardown.

Few and time-bounded: one saved state (made once, reused across runs) serves every snapshot replica;
only one cold reset is measured here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from PIL import ImageChops

from osfleet.config import Settings
from osfleet.protocol.actions import ACTIONS
from osfleet.replicas.manager import NoReplicaAvailableError, ReplicaHost
from osfleet.replicas.records import ReplicaRecord, State
from osfleet.replicas.spec import replica_spec
from osfleet.vm.images import GoldenImage
from tests.conftest import VENV_BIN

pytestmark = pytest.mark.vm


@pytest.fixture
def host(golden: GoldenImage, settings: Settings, no_leftovers: None) -> Iterator[ReplicaHost]:
    h = ReplicaHost(golden, settings, mode="snapshot", auto_recover=False)
    mine_before = {r.id for r in h.replicas()}
    try:
        yield h
    finally:
        h.stop_background()
        h.down([r.id for r in h.replicas() if r.id not in mine_before])
        h.close()


def shell(h: ReplicaHost, rid: str, command: str) -> str:
    (res,) = h.act(rid, ACTIONS.validate_python([{"type": "shell", "command": command, "timeout": 30}]))
    assert res.ok, res.error
    return res.stdout or ""


def test_a_file_written_in_the_guest_is_gone_after_either_reset(host: ReplicaHost) -> None:
    rid = host.create().replica
    for mode in ("snapshot", "cold"):
        shell(host, rid, "echo dirty > ~/marker && sync")
        assert shell(host, rid, "cat ~/marker").strip() == "dirty"
        took = host.reset(rid, mode)  # type: ignore[arg-type]
        assert shell(host, rid, "test -e ~/marker && echo present || echo absent").strip() == "absent", mode
        assert took.seconds < (5 if mode == "snapshot" else 120)
    host.settle()
    assert host.get(rid).generation == 3
    # the old generations' domains and disks are gone; generation 4 is the paused standby of the next reset
    name = host.generations.domain_name
    assert host.virt.names(f"osfleet-{rid}-") == [name(rid, 3), name(rid, 4)]
    assert sorted(p.name for p in host.replica_dir(rid).glob("disk-g*")) == ["disk-g3.qcow2", "disk-g4.qcow2"]


def test_click_and_typed_text_change_the_screen(host: ReplicaHost) -> None:
    rid = host.create().replica
    before = host.virt.screenshot(host.get(rid).domain)
    acts = ACTIONS.validate_python(
        [
            {"type": "click", "x": 200, "y": 200},
            {"type": "type", "text": "echo Typed-By-QMP > /tmp/typed\n"},
            {"type": "wait", "seconds": 1.5},
        ]
    )
    assert all(r.ok for r in host.act(rid, acts))
    after = host.virt.screenshot(host.get(rid).domain)
    assert ImageChops.difference(before, after).getbbox() is not None
    assert shell(host, rid, "cat /tmp/typed").strip() == "Typed-By-QMP"
    png = host.screenshot(rid, "png")
    jpeg = host.screenshot(rid, "jpeg")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and jpeg[:2] == b"\xff\xd8"


def test_clones_get_their_own_identity_and_the_right_clock(host: ReplicaHost) -> None:
    a, b = host.create().replica, host.create().replica
    ida = shell(host, a, "hostname; cat /etc/machine-id; date +%s").split()
    idb = shell(host, b, "hostname; cat /etc/machine-id; date +%s").split()
    assert ida[0] == host.get(a).hostname and idb[0] == host.get(b).hostname and ida[0] != idb[0]
    assert ida[1] != idb[1]
    assert abs(int(ida[2]) - time.time()) < 5 and abs(int(idb[2]) - time.time()) < 5


def test_a_slow_guest_command_times_out_and_the_replica_survives(host: ReplicaHost) -> None:
    rid = host.create().replica
    (res,) = host.act(rid, ACTIONS.validate_python([{"type": "shell", "command": "sleep 30", "timeout": 1}]))
    assert not res.ok and "timed out" in (res.error or "")
    assert shell(host, rid, "echo alive").strip() == "alive"
    assert "sleep 30" not in shell(host, rid, "ps -eo args")


def test_a_killed_qemu_is_noticed_and_touches_no_other_replica(host: ReplicaHost) -> None:
    a, b = host.create().replica, host.create().replica
    pid = host.virt.qemu_pid(host.get(a).domain)
    assert pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and a not in host.check():
        time.sleep(0.5)
    assert host.get(a).state == State.FAILED and "QEMU process is gone" in (host.get(a).error or "")
    assert host.get(b).state == State.READY and shell(host, b, "echo ok").strip() == "ok"
    host.recover(a)
    assert host.get(a).state == State.READY and shell(host, a, "echo back").strip() == "back"
    assert host.counters["failures_detected"] == 1 and host.counters["recoveries"] == 1


def test_a_restarted_host_adopts_live_replicas_and_cleans_half_made_ones(
    golden: GoldenImage, settings: Settings, host: ReplicaHost
) -> None:
    live = host.create().replica
    host.settle()
    # A replica whose bring-up was interrupted: its record says booting, its domain half started.
    half = ReplicaRecord(
        id="r-halfmade",
        image=golden.name,
        mode="snapshot",
        state=State.BOOTING,
        generation=1,
        domain=host.generations.domain_name("r-halfmade", 1),
    )
    host.registry.store.save(half)
    (settings.replicas_dir / half.id).mkdir(exist_ok=True)
    spec = replica_spec(
        golden, half.domain, host.saved().disk, (host.saved().disk, golden.disk), host.accel, host.shape, incoming=True
    )
    host.virt.start_transient(spec, paused=True)
    # A domain with the replica prefix that no record knows.
    orphan = replica_spec(
        golden, "osfleet-r-orphan01-g1", host.saved().disk, (golden.disk,), host.accel, host.shape, incoming=True
    )
    host.virt.start_transient(orphan, paused=True)
    # The live replica as a fork's child is while its siblings load: vCPUs at a low priority (an agent that
    # died then left them so).
    host.virt.set_vcpu_nice(host.get(live).domain, 19)
    assert set(vcpu_nice(host, live)) == {19}

    with ReplicaHost(golden, settings, auto_recover=False) as restarted:
        report = restarted.adopt()
        assert live in report.kept
        assert "r-halfmade" in report.cleaned
        assert "osfleet-r-orphan01-g1" in report.orphan_domains
        assert not (settings.replicas_dir / "r-halfmade").exists()
        assert not host.virt.is_running(half.domain) and not host.virt.is_running("osfleet-r-orphan01-g1")
        assert restarted.get(live).state == State.READY
        assert shell(restarted, live, "echo adopted").strip() == "adopted"
        assert restarted.virt.names(f"osfleet-{live}-")[0] == host.get(live).domain
        assert set(vcpu_nice(restarted, live)) == {0}  # back to the priority of every other replica


def vcpu_nice(host: ReplicaHost, rid: str) -> list[int]:
    cpus = host.virt.qmp(host.get(rid).domain, "query-cpus-fast")
    return [os.getpriority(os.PRIO_PROCESS, int(c["thread-id"])) for c in cpus]


def test_warm_pool_hands_out_only_ready_replicas(golden: GoldenImage, settings: Settings, no_leftovers: None) -> None:
    with ReplicaHost(golden, settings, warm=1, auto_recover=False) as pool:
        try:
            with pytest.raises(NoReplicaAvailableError):
                pool.lease("agent-0")
            pool.start_background()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not any(r.state == State.READY for r in pool.replicas()):
                time.sleep(0.2)
            rec, lease = pool.lease("agent-1")
            assert rec.state == State.LEASED and shell(pool, rec.id, "echo ready").strip() == "ready"
            # the pool refills behind the lease
            while time.monotonic() < deadline and sum(r.state == State.READY for r in pool.replicas()) < 1:
                time.sleep(0.2)
            assert sum(r.state == State.READY for r in pool.replicas()) == 1
        finally:
            pool.stop_background()
            pool.down()


def test_cli_up_ls_screenshot_down(golden: GoldenImage, tmp_path: object, no_leftovers: None) -> None:
    osf = str(VENV_BIN / "osfleet")
    up = subprocess.run(
        [osf, "replicas", "up", "--count", "1", "--image", golden.name], capture_output=True, text=True, timeout=300
    )
    assert up.returncode == 0, up.stderr
    rid = up.stdout.split()[0]
    ls = subprocess.run([osf, "replicas", "ls"], capture_output=True, text=True, timeout=60)
    assert rid in ls.stdout and "ready" in ls.stdout and "running" in ls.stdout
    shot = f"{tmp_path}/s.png"
    sc = subprocess.run([osf, "replicas", "screenshot", rid, "--out", shot], capture_output=True, text=True, timeout=60)
    assert sc.returncode == 0, sc.stderr
    with open(shot, "rb") as f:
        assert f.read(4) == b"\x89PNG"
    bad = subprocess.run([osf, "replicas", "screenshot", "r-nosuch"], capture_output=True, text=True, timeout=60)
    assert (
        bad.returncode == 1 and bad.stderr.strip() == "osfleet: error: no replica r-nosuch (see 'osfleet replicas ls')"
    )
    down = subprocess.run([osf, "replicas", "down", rid], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert rid not in subprocess.run([osf, "replicas", "ls"], capture_output=True, text=True, timeout=60).stdout


def test_adoption_leaves_replicas_of_another_live_process_alone(
    golden: GoldenImage, settings: Settings, host: ReplicaHost
) -> None:
    """A second process (a CLI call beside a running host agent) must not take or clean the agent's replicas."""
    other = subprocess.Popen(["sleep", "120"])  # stands in for the managing process
    try:
        busy = ReplicaRecord(
            id="r-otherpid",
            image=golden.name,
            mode="snapshot",
            state=State.RESETTING,
            generation=1,
            domain=host.generations.domain_name("r-otherpid", 1),
            owner_pid=other.pid,
        )
        host.registry.store.save(busy)
        (settings.replicas_dir / busy.id).mkdir(exist_ok=True)
        spec = replica_spec(
            golden,
            busy.domain,
            host.saved().disk,
            (host.saved().disk, golden.disk),
            host.accel,
            host.shape,
            incoming=True,
        )
        host.virt.start_transient(spec, paused=True)
        with ReplicaHost(golden, settings, auto_recover=False) as second:
            report = second.adopt()
            assert "r-otherpid" in report.foreign and "r-otherpid" not in report.cleaned
            assert second.virt.is_running(busy.domain) and (settings.replicas_dir / busy.id).exists()
    finally:
        other.kill()
        other.wait()
    with ReplicaHost(golden, settings, auto_recover=False) as third:  # the owner is gone: now it is half-made
        assert "r-otherpid" in third.adopt().cleaned
        assert not third.virt.is_running(busy.domain)
