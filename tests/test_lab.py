"""The lab on this machine, for real: namespaces, veth links, sshd by key, per-host home and prefix, clean down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from fabric import Connection

from osfleet.config import Settings
from osfleet.lab import net
from osfleet.lab.lab import lab_root, running
from osfleet.lab.proc import alive
from osfleet.lab.state import LabState, load

# One xdist worker: the machine has one lab (lab_root); and in CI a step of their own (pyproject's machine_lab).
pytestmark = [pytest.mark.xdist_group("lab"), pytest.mark.machine_lab]

REPO = Path(__file__).resolve().parent.parent
OSFLEET = str(Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "osfleet")


def osfleet(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OSFLEET, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def connect(state: LabState, addr: str) -> Connection:
    """Root on a lab host with the lab key only (no agent, no other keys)."""
    return Connection(
        addr,
        user="root",
        connect_timeout=10,
        connect_kwargs={"key_filename": state.key, "look_for_keys": False, "allow_agent": False},
    )


@pytest.fixture(scope="module")
def lab() -> Iterator[LabState]:
    root = lab_root()
    existing = load(root)
    if existing is not None and running(existing):
        pytest.skip(f"a lab is up on this machine ({root}); these tests make their own: 'osfleet lab down' first")
    done = osfleet("lab", "up", "--hosts", "2")  # clears a dead lab's leftovers itself
    assert done.returncode == 0, done.stderr
    state = load(root)
    assert state is not None
    yield state
    osfleet("lab", "down")


@pytest.mark.system
def test_hosts_answer_ssh_by_key_with_their_own_home_and_prefix(lab: LabState) -> None:
    seen = []
    for h in lab.hosts:
        with connect(lab, h.addr) as c:
            out = c.run(
                'echo "$OSFLEET_HOME $OSFLEET_NAME_PREFIX $(readlink /proc/self/ns/net)"', hide=True, in_stream=False
            )
            seen.append(tuple(out.stdout.split()))
        assert seen[-1][:2] == (h.home, h.name_prefix)
    homes, prefixes, netns = zip(*seen, strict=True)
    assert len(set(homes)) == len(set(prefixes)) == len(set(netns)) == 2
    assert os.readlink("/proc/self/ns/net") not in netns


@pytest.mark.system
def test_hosts_refuse_other_keys(lab: LabState, tmp_path: Path) -> None:
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    c = Connection(
        lab.hosts[0].addr,
        user="root",
        connect_timeout=10,
        connect_kwargs={"key_filename": str(other), "look_for_keys": False, "allow_agent": False},
    )
    with pytest.raises(paramiko.AuthenticationException):
        c.open()
    c.close()


@pytest.mark.system
def test_host_keys_are_pinned_in_known_hosts(lab: LabState) -> None:
    for h in lab.hosts:
        done = subprocess.run(
            ["ssh", "-i", lab.key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
             "-o", f"UserKnownHostsFile={lab.known_hosts}", f"root@{h.addr}", "hostname"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


@pytest.mark.system
def test_ls_json_lists_running_hosts(lab: LabState) -> None:
    done = osfleet("lab", "ls", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["up"] is True
    assert [(h["name"], h["addr"], h["sshd_running"]) for h in out["hosts"]] == [
        (h.name, h.addr, True) for h in lab.hosts
    ]


@pytest.mark.system
def test_second_up_is_refused_with_one_line(lab: LabState) -> None:
    done = osfleet("lab", "up", "--hosts", "1")
    assert done.returncode == 1
    assert done.stderr.startswith("osfleet: error: a lab of 2 hosts is already up")
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.system
def test_subnet_avoids_this_machines_networks(lab: LabState) -> None:
    import ipaddress

    subnet = ipaddress.IPv4Network(lab.subnet)
    links = [ipaddress.IPv4Network(f"{h.host_addr}/{h.prefix_len}", strict=False) for h in lab.hosts]
    for used in net.used_networks():
        if used.overlaps(subnet):
            assert any(used.subnet_of(link) for link in links), used  # only the lab's own links


@pytest.mark.vm
def test_replicas_down_all_on_one_host_leaves_the_others(lab: LabState, settings: Settings) -> None:
    """Needs a built golden image and replicas that honour OSFLEET_NAME_PREFIX."""
    from osfleet.imaging.host import Host
    from osfleet.imaging.publisher import publish
    from osfleet.vm.images import list_images
    from osfleet.vm.virt import Virt

    images = list_images(settings)
    if not images:
        pytest.skip("no golden image built (osfleet image build)")
    try:
        for h in lab.hosts:
            with connect(lab, h.addr) as c:
                publish(Host(c), images[0], store=str(Settings(home=Path(h.home)).image_store))
            done = osfleet("replicas", "up", "--count", "1", "--mode", "cold", env=h.env, timeout=900)
            assert done.returncode == 0, done.stderr
        with Virt(settings.libvirt_uri) as v:
            before = {h.name: v.names(h.name_prefix) for h in lab.hosts}
        assert all(len(names) == 1 for names in before.values()), before
        done = osfleet("replicas", "down", "--all", env=lab.hosts[0].env, timeout=300)
        assert done.returncode == 0, done.stderr
        with Virt(settings.libvirt_uri) as v:
            assert v.names(lab.hosts[0].name_prefix) == []
            assert v.names(lab.hosts[1].name_prefix) == before[lab.hosts[1].name]
            assert v.is_running(before[lab.hosts[1].name][0])
    finally:
        for h in lab.hosts:
            osfleet("replicas", "down", "--all", "--states", "--force", env=h.env, timeout=300)


@pytest.mark.system
def test_bench_infra_refused_by_a_live_lab_leaves_no_folder(lab: LabState) -> None:
    scratch = Settings.from_env().scratch_dir
    before = set(scratch.glob("osfleet-bench-infra-*"))
    done = osfleet("bench", "infra", "--hosts", "1")
    assert done.returncode == 1 and "is already up" in done.stderr.splitlines()[-1], done.stderr
    assert set(scratch.glob("osfleet-bench-infra-*")) == before
    assert load(lab_root()) == lab  # the lab it found is left as it was


@pytest.mark.system
def test_down_leaves_nothing() -> None:
    """Runs last in this module: its own lab, taken down, then every trace checked."""
    root = lab_root()
    state = load(root)
    if state is None or not running(state):
        done = osfleet("lab", "up", "--hosts", "2")
        assert done.returncode == 0, done.stderr
        state = load(root)
    assert state is not None
    pids = [h.sshd_pid for h in state.hosts]
    assert all(alive(p) for p in pids)
    done = osfleet("lab", "down")
    assert done.returncode == 0, done.stderr
    assert net.lab_namespaces() == []
    assert net.lab_links() == []
    assert not any(alive(p) for p in pids)
    assert not root.exists()
    again = osfleet("lab", "down")
    assert again.returncode == 0 and "nothing to remove" in again.stderr


@pytest.mark.system
def test_up_clears_a_lab_whose_hosts_died() -> None:
    """A restart or a killed run leaves the state file, namespaces and links but no sshd: up clears, not refuses."""
    root = lab_root()
    done = osfleet("lab", "up", "--hosts", "2")
    assert done.returncode == 0, done.stderr
    try:
        dead = load(root)
        assert dead is not None
        for h in dead.hosts:
            os.kill(h.sshd_pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(alive(h.sshd_pid) for h in dead.hosts) and time.monotonic() < deadline:
            time.sleep(0.05)
        listed = osfleet("lab", "ls", "--json")
        assert [h["sshd_running"] for h in json.loads(listed.stdout)["hosts"]] == [False, False]
        again = osfleet("lab", "up", "--hosts", "1")
        assert again.returncode == 0, again.stderr
        assert "clearing it first" in again.stderr
        state = load(root)
        assert state is not None and len(state.hosts) == 1 and running(state)
        assert net.lab_namespaces() == [state.hosts[0].netns]
    finally:
        osfleet("lab", "down")
    assert not root.exists()
