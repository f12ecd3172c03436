"""``osfleet bench checkpoint``: keep a replica's state under a name, start copies from it, side by side with fork.

Each round, on one host and one parent replica mid-task (a file written): a checkpoint is saved
(``save_s``: the parent's live save until the record exists), one copy is started from it (``start_one_s``),
then N (``start_n_s``), and every copy is checked for the parent's file; then the same parent is forked N ways
(``fork_save_s``, ``fork_total_s``), so the two are measured in the same run on the same machine (timings here
are noisy: compare the ratios). ``bytes`` is what the checkpoint holds (disk layers, RAM file resident on
tmpfs, its device state, the RAM's copy on disk once written). Every round's replicas are retired and the
checkpoint deleted; ``leaks`` counts what is left (domains, forks, checkpoint records).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from osfleet.config import ReplicaShape, Settings
from osfleet.errors import OsfleetError, as_osfleet
from osfleet.measure.host_facts import describe
from osfleet.measure.stats import percentile
from osfleet.replicas.manager import ReplicaHost
from osfleet.vm.images import GoldenImage

Say = Callable[[str], None]
MARKER_PATH = "/var/tmp/osfleet-checkpoint-marker"
OWNER = "bench"


def run(
    image: GoldenImage, copies: int, rounds: int, settings: Settings | None = None, say: Say = print
) -> dict[str, Any]:
    """The checkpoint bench; a failure part-way still returns what was measured, with the failure named."""
    if copies < 1 or rounds < 1:
        raise OsfleetError("--copies and --rounds must be at least 1")
    settings = settings or Settings.from_env()
    result: dict[str, Any] = {"benchmark": "checkpoint", "image": image.name, "copies": copies, "rounds": rounds}
    samples: dict[str, list[float]] = {}
    host: ReplicaHost | None = None
    try:
        host = ReplicaHost(image, settings, ReplicaShape(), mode="snapshot", auto_recover=False, say=say, fork_ready=0)
        result["accelerator"] = host.accel
        host.saved()
        for i in range(rounds):
            say(f"[round {i + 1}/{rounds}] a parent mid-task, a checkpoint, 1 then {copies} copies, a fork of {copies}")
            for key, value in _round(host, copies, f"bench-{secrets.token_hex(4)}").items():
                samples.setdefault(key, []).append(value)
        result.update({f"{k}_p50": percentile(v, 50) for k, v in samples.items()})
        result["samples"] = samples
        result["start_n_vs_fork"] = result["start_n_s_p50"] / result["fork_total_s_p50"]
    except Exception as exc:  # what was measured is still reported, with the failure named (exit code 1)
        result["failure"] = str(as_osfleet(exc, "the checkpoint benchmark"))
        say(f"checkpoint bench failed: {result['failure']}")
    finally:
        if host is not None:
            try:
                for c in host.checkpoints.list(OWNER):
                    host.delete_checkpoint(c.name, OWNER)
                host.down(host.made_here())
            finally:
                host.close()
    result["machine"] = describe(result.get("accelerator"))
    result["leaks"] = _leaks(settings)
    return result


def _round(host: ReplicaHost, copies: int, name: str) -> dict[str, float]:
    parent = host.create().replica
    rec, lease = host.lease("bench", owner=OWNER)
    if rec.id != parent:  # the bench's own host: the one ready replica is the one just made
        raise OsfleetError(f"leased {rec.id}, expected {parent}")
    marker = secrets.token_hex(8)
    _shell(host, parent, f"echo {marker} > {MARKER_PATH}")
    started = time.monotonic()
    kept = host.checkpoint(parent, name, OWNER, lease.id)
    save_s = time.monotonic() - started
    made: list[str] = []
    try:
        started = time.monotonic()
        _, one = host.start_checkpoint(name, OWNER, 1, "bench")
        start_one_s = time.monotonic() - started
        made += [c.record.id for c in one]
        started = time.monotonic()
        _, many = host.start_checkpoint(name, OWNER, copies, "bench")
        start_n_s = time.monotonic() - started
        made += [c.record.id for c in many]
        wrong = [rid for rid in made if _shell(host, rid, f"cat {MARKER_PATH}").strip() != marker]
        if wrong:
            raise OsfleetError(f"copies without the parent's file: {', '.join(wrong)}")
        forked = host.fork(parent, copies, lease.id)
        made += [c.record.id for c in forked.children]
        state = host.forks.load(kept.fork_id)
        from osfleet.replicas.checkpoints import fork_bytes

        disk, memory = fork_bytes(state)
        return {
            "save_s": save_s,
            "start_one_s": start_one_s,
            "start_n_s": start_n_s,
            "fork_save_s": forked.save_seconds,
            "fork_total_s": forked.total_seconds,
            "bytes": float(disk + memory),
            "disk_bytes": float(disk),
        }
    finally:
        host.down([*made, parent])
        host.delete_checkpoint(name, OWNER)


def _shell(host: ReplicaHost, rid: str, command: str) -> str:
    out = host.shell(rid, command, 30, as_root=True)
    if out["exit_code"] != 0:
        raise OsfleetError(f"{rid}: {command!r} failed: {out['stderr'].strip()[:200]}")
    return str(out["stdout"])


def _leaks(settings: Settings) -> dict[str, int]:
    from osfleet.replicas.checkpoints import CheckpointBook
    from osfleet.vm.virt import Virt

    with Virt(settings.libvirt_uri) as virt:
        templates = len(virt.names(f"{settings.template_prefix}f-"))
    forks = len(list(settings.forks_dir.iterdir())) if settings.forks_dir.exists() else 0
    records = len(CheckpointBook(settings.checkpoints_dir, 0, 0).list(OWNER))
    return {"fork_templates": templates, "fork_folders": forks, "checkpoints": records}


def checkpoint_table(result: dict[str, Any]) -> str:
    """One paragraph: the medians, checkpoint against fork."""
    return (
        f"checkpoint of {result['bytes_p50'] / 2**20:.0f} MiB saved in {result['save_s_p50']:.2f} s; one copy started "
        f"in {result['start_one_s_p50']:.2f} s, {result['copies']} in {result['start_n_s_p50']:.2f} s; a fork of "
        f"{result['copies']}: saved in {result['fork_save_s_p50']:.2f} s, all ready in "
        f"{result['fork_total_s_p50']:.2f} s "
        f"(copies/fork {result['start_n_vs_fork']:.2f}); p50 of {result['rounds']} round(s), leaks "
        f"{sum(result['leaks'].values())}"
    )
