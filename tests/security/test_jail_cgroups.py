"""The evaluation jail's cgroups (``osfleet.tasks.jail.cgroups``): where a sandbox's folders go on cgroup v1 and v2,
what each evaluation's folder bounds, and that nothing is left behind.

This machine has cgroup v1 for ``memory`` and ``pids`` (and a v2 hierarchy without them): the v1 path is tested
for real, with a real process moved in; the v2 path is tested on the real v2 hierarchy as far as it goes without
its controllers (folders, moving a process, removal, the refusal when a controller is missing), and the limits it
would write are checked as data.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from osfleet.tasks.jail import cgroups
from osfleet.tasks.jail.cgroups import Bounds, Groups

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
CONTAINER_V2 = "1208 1190 0:29 /kubepods/pod1 /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
ESCAPED = "35 31 0:32 / /srv/cg\\040one rw - cgroup cgroup rw,memory,pids\n"


@pytest.mark.unit
def test_mountinfo_gives_each_hierarchy_its_controllers_and_folder() -> None:
    found = {m.point: m for m in cgroups.mounts(HYBRID)}
    assert set(found) == {Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified")}
    assert "memory" in found[Path("/sys/fs/cgroup/memory")].options
    assert found[Path("/sys/fs/cgroup/unified")].fstype == "cgroup2"
    (escaped,) = cgroups.mounts(ESCAPED)
    assert escaped.point == Path("/srv/cg one") and {"memory", "pids"} <= escaped.options


@pytest.mark.unit
def test_own_cgroups_name_each_controller_and_the_v2_path() -> None:
    own = cgroups.own_cgroups("9:name=systemd:/\n8:pids:/\n4:memory:/process_api/c1\n2:cpu,cpuacct:/a\n0::/\n")
    assert own["memory"] == "/process_api/c1" and own["pids"] == "/" and own["cpuacct"] == "/a" and own[""] == "/"


@pytest.mark.unit
def test_a_cgroup_outside_what_a_mount_shows_is_not_used() -> None:
    (mount,) = cgroups.mounts(CONTAINER_V2)
    assert cgroups._inside(mount, "/kubepods/pod1/agent") == Path("/sys/fs/cgroup/agent")
    assert cgroups._inside(mount, "/kubepods/pod1") == Path("/sys/fs/cgroup")
    assert cgroups._inside(mount, "/system.slice") is None


@pytest.mark.unit
def test_each_version_bounds_memory_with_its_files_and_tasks() -> None:
    bounds = Bounds(memory_bytes=832 * 2**20, tasks=128)
    assert cgroups.v1_limits(bounds) == {
        "memory": {"memory.limit_in_bytes": str(832 * 2**20), "memory.memsw.limit_in_bytes": str(832 * 2**20)},
        "pids": {"pids.max": "128"},
    }
    assert cgroups.v2_limits(bounds) == {"memory.max": str(832 * 2**20), "memory.swap.max": "0", "pids.max": "128"}


@pytest.mark.unit
def test_the_kernels_counters_are_read_by_name() -> None:
    assert cgroups._counter("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill") == 3
    assert cgroups._counter("low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n", "max") == 2
    assert cgroups._counter("", "max") == 0


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def _groups_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


@pytest.mark.system
@pytest.mark.skipif(os.geteuid() != 0, reason="making cgroups needs root (or a delegated cgroup)")
def test_v1_an_evaluation_gets_its_own_bounded_group_and_leaves_nothing(sleeper: subprocess.Popen[bytes]) -> None:
    groups, where = Groups.for_sandbox(version=1)
    if groups is None:
        pytest.fail(f"this machine has cgroup v1 for memory and pids, but: {where}")
    try:
        assert groups.version == 1 and set(groups.bases) == {"memory", "pids"}, where
        group = groups.evaluation(Bounds(memory_bytes=300 * 2**20, tasks=16))
        memory = next(f for f in group.folders if f.is_relative_to(groups.bases["memory"]))
        pids = next(f for f in group.folders if f.is_relative_to(groups.bases["pids"]))
        assert int((memory / "memory.limit_in_bytes").read_text()) == 300 * 2**20
        assert (pids / "pids.max").read_text().strip() == "16"
        group.add(sleeper.pid)
        lines = _groups_of(sleeper.pid).splitlines()
        for controller, folder in (("memory", memory), ("pids", pids)):
            line = next(x for x in lines if f":{controller}:" in x)
            assert line.endswith(f"/{folder.parent.name}/{folder.name}"), line
        usage = group.usage()
        assert (usage.oom_kills, usage.refused_forks) == (0, 0) and usage.peak_bytes is not None
        assert not group.remove()  # a process is in it: the kernel keeps it
        sleeper.kill()
        sleeper.wait()
        groups.release(group)
        assert not memory.exists() and not pids.exists()
    finally:
        groups.close()
    assert not any(base.exists() for base in groups.bases.values())


@pytest.mark.system
@pytest.mark.skipif(os.geteuid() != 0, reason="making cgroups needs root (or a delegated cgroup)")
def test_a_dead_sandboxs_folders_are_swept_by_the_next() -> None:
    first, _ = Groups.for_sandbox(version=1)
    assert first is not None
    parent = first.bases["memory"].parent
    first.close()
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process ever has it
    stale = parent / f"{cgroups.PREFIX}{gone}-1"
    (stale / "e1").mkdir(parents=True)
    try:
        second, _ = Groups.for_sandbox(version=1)
        assert second is not None
        second.close()
        assert not stale.exists()
    finally:
        if stale.exists():
            (stale / "e1").rmdir()
            stale.rmdir()


@pytest.mark.system
@pytest.mark.skipif(os.geteuid() != 0, reason="making cgroups needs root (or a delegated cgroup)")
def test_v2_folders_take_a_process_and_go_when_it_has_ended(sleeper: subprocess.Popen[bytes]) -> None:
    """On this machine's v2 hierarchy, which has no memory or pids controller: everything but the limits."""
    groups, where = Groups.for_sandbox(controllers=(), version=2)
    if groups is None:
        pytest.fail(f"this machine has a cgroup v2 hierarchy, but: {where}")
    try:
        assert groups.version == 2
        group = groups.evaluation(Bounds(memory_bytes=2**28, tasks=8))
        (folder,) = group.folders
        group.add(sleeper.pid)
        assert "populated 1" in (folder / "cgroup.events").read_text()
        line = next(x for x in _groups_of(sleeper.pid).splitlines() if x.startswith("0::"))
        assert line.endswith(f"/{folder.parent.name}/{folder.name}"), line
        sleeper.kill()
        sleeper.wait()
        groups.release(group)
        assert not folder.exists()
    finally:
        groups.close()
    assert not any(base.exists() for base in groups.bases.values())


@pytest.mark.system
def test_v2_without_its_controllers_says_why_and_makes_nothing() -> None:
    """Here memory and pids are bound to v1 hierarchies, so the v2 one cannot give them to anyone."""
    groups, why = Groups.for_sandbox(version=2)
    assert groups is None
    assert "memory, pids not available" in why or "cannot enable" in why, why
