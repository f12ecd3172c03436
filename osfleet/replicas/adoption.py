"""After a restart: rebuild this process's view from records + libvirt, and clean up what nobody owns.

Replicas another live process manages (a running host agent, a benchmark) are left alone, and a record is
read again before anything of its replica is destroyed: another process may have created it since the
records were listed.
"""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

from osfleet.config import Settings
from osfleet.errors import OsfleetError
from osfleet.replicas import checkpoints, forks, saved_state
from osfleet.replicas.generations import Generations
from osfleet.replicas.records import (
    RUNNING_STATES,
    TRANSIENT_STATES,
    RecordStore,
    ReplicaRecord,
    State,
    owned_by_other_live_process,
)
from osfleet.replicas.registry import Registry
from osfleet.vm.virt import Virt

ADOPT_LOCK = ".adopt.lock"


@dataclass
class AdoptReport:
    kept: list[str] = field(default_factory=list)
    cleaned: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    orphan_domains: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)  # managed by another live process: left alone


@contextmanager
def _adoption_lock(settings: Settings) -> Iterator[None]:
    """One adopting process at a time per host: the second one waits, then finds the first one's records
    (now naming a live owner) and leaves them alone instead of adopting them too."""
    settings.replicas_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.replicas_dir / ADOPT_LOCK, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def adopt(registry: Registry, gen: Generations) -> AdoptReport:
    """Keep live replicas of this image, mark vanished ones failed, clean half-made ones and orphans."""
    with _adoption_lock(gen.settings):
        return _adopt(registry, gen)


def _adopt(registry: Registry, gen: Generations) -> AdoptReport:
    report = AdoptReport()
    settings = gen.settings
    records, broken = registry.store.load_all()
    for path in broken:
        path.unlink(missing_ok=True)
    running = set(gen.virt.names(settings.replica_prefix))
    for rec in records:
        if rec.image != gen.image.name:
            continue  # another image's host agent owns it
        if owned_by_other_live_process(rec):
            report.foreign.append(rec.id)
            continue
        if rec.state == State.RETIRED or rec.state in TRANSIENT_STATES:
            gen.destroy_all(rec.id)
            shutil.rmtree(gen.replica_dir(rec.id), ignore_errors=True)
            registry.store.delete(rec.id)
            report.cleaned.append(rec.id)
            continue
        registry.add(rec)
        with registry.locked(rec.id) as live:
            if live.state in RUNNING_STATES and live.domain not in running:
                registry.fail(live, "the replica's domain disappeared while no host agent was running")
                report.failed.append(live.id)
            else:
                registry.save(live)  # names this process as its manager from now on
                if live.state in RUNNING_STATES:
                    gen.vcpus_at_normal_priority(live.domain)  # a fork's child whose agent died
                (report.failed if live.state == State.FAILED else report.kept).append(live.id)
    current = registry.domains()
    for name in running - current:
        owner = name[len(settings.name_prefix) :].rsplit("-g", 1)[0]
        if owner in registry or _unclaimed(registry.store, owner):
            gen.destroy(name)
            report.orphan_domains.append(name)
    if settings.replicas_dir.exists():
        for d in settings.replicas_dir.iterdir():
            if d.is_dir() and d.name.startswith("r-") and d.name not in registry and _unclaimed(registry.store, d.name):
                shutil.rmtree(d, ignore_errors=True)
    return report


def _unclaimed(store: RecordStore, replica_id: str) -> bool:
    """No record of this replica exists now (read again, not from an earlier listing)."""
    try:
        ReplicaRecord.model_validate_json(store.path(replica_id).read_text())
    except (OSError, ValueError):
        return True
    return False


def teardown_all(settings: Settings, states: bool = False, force: bool = False) -> tuple[int, int]:
    """Remove every replica domain and file of this host (its name prefix and its home), whatever image.

    Checkpoints stay (with their forks), unless ``states``: they sit on the saved states removed then.
    Returns (domains destroyed, records removed). Refuses while another process manages replicas here,
    unless ``force``. Another host sharing this libvirtd (a lab host) has its own prefix and is untouched.
    """
    records, _ = RecordStore(settings.replicas_dir).load_all()
    busy = sorted({r.owner_pid for r in records if owned_by_other_live_process(r)})
    if busy and not force:
        raise OsfleetError(
            f"replicas here are managed by running process(es) {', '.join(map(str, busy))}: "
            "stop them first, or pass --force"
        )
    with Virt(settings.libvirt_uri) as virt:
        names = virt.names(settings.replica_prefix) + virt.names(settings.template_prefix)
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(virt.destroy, names))
    removed = 0
    if settings.replicas_dir.exists():
        removed = len(list(settings.replicas_dir.glob("*.json")))
        shutil.rmtree(settings.replicas_dir)
    book = checkpoints.CheckpointBook(settings.checkpoints_dir, 0, 0)
    if states:  # checkpoints sit on the saved states' layers: they go with them
        book.remove_all()
    forks.remove_all_forks(settings, keep=book.fork_ids())
    if states:
        saved_state.remove_saved_states(settings)
    return len(names), removed
