"""Container images into the k8s lab's containerd (what ``osfleet image container`` built): the node runs them
with ``imagePullPolicy: IfNotPresent`` and never pulls, so they must be there first."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from osfleet.lab.kube.cluster import ctr
from osfleet.lab.kube.state import lab_root, load


def has_image(reference: str) -> bool | None:
    """Whether the lab's containerd holds ``reference`` (None: no lab is up)."""
    s = load(lab_root())
    if s is None or not s.ready:
        return None
    return reference in ctr(s, ["images", "ls", "-q"]).split()


def import_into_lab(archive: Path, reference: str, say: Callable[[str], None]) -> bool:
    """Import the OCI ``archive`` into the lab's containerd unless it is there already; False when no lab runs."""
    present = has_image(reference)
    if present is None:
        return False
    s = load(lab_root())
    assert s is not None
    if present:
        say(f"{reference} is already in the k8s lab's containerd")
        return True
    say(f"importing {reference} into the k8s lab's containerd")
    ctr(s, ["images", "import", str(archive)], timeout=900)
    if not has_image(reference):
        from osfleet.errors import CommandFailedError

        raise CommandFailedError(f"ctr imported {archive} but the lab's containerd does not list {reference}")
    return True
