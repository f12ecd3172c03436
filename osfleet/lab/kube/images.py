"""Container images into the k8s lab's containerd (what ``osfleet image container`` built): the node runs them
with ``imagePullPolicy: IfNotPresent`` and never pulls, so they must be there first."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from osfleet.errors import OsfleetError
from osfleet.lab.kube.cluster import ctr, kubectl
from osfleet.lab.kube.state import NODE_NAME, KubeLabState, lab_root, load

# The kubelet lists a node's images in its status from a cache it refreshes every 30 s, then reports them with the
# next status update (10 s): an image just imported is seen by the API (and the k8s stack's pre-flight check) ~40 s
# later at most.
REPORTED_WAIT_SECONDS = 120.0


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
    else:
        say(f"importing {reference} into the k8s lab's containerd")
        ctr(s, ["images", "import", str(archive)], timeout=900)
        if not has_image(reference):
            from osfleet.errors import CommandFailedError

            raise CommandFailedError(f"ctr imported {archive} but the lab's containerd does not list {reference}")
    wait_reported(s, reference, say)
    return True


def wait_reported(s: KubeLabState, reference: str, say: Callable[[str], None]) -> None:
    """Until the node's status lists ``reference``, so that ``pulumi up --stack k8s`` right after finds it there."""
    deadline = time.monotonic() + REPORTED_WAIT_SECONDS
    said = False
    while reference not in node_images(s):
        if time.monotonic() > deadline:
            raise OsfleetError(
                f"node {NODE_NAME} did not report {reference} within {REPORTED_WAIT_SECONDS:.0f} s (kubelet log: "
                f"{s.dir / 'logs' / 'kubelet.log'})"
            )
        if not said:
            say(f"waiting for node {NODE_NAME} to report {reference} (the kubelet lists images every ~30 s)")
            said = True
        time.sleep(2)


def node_images(s: KubeLabState) -> set[str]:
    """Every image name the node's status lists."""
    try:
        node = json.loads(kubectl(s, ["get", "node", NODE_NAME, "-o", "json"]))
    except (OsfleetError, ValueError):
        return set()
    return {name for image in node.get("status", {}).get("images") or [] for name in image.get("names") or []}
