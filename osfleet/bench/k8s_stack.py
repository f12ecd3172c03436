"""A throwaway copy of the ``k8s`` stack for a benchmark on the k8s lab, and what the benchmarks read of the lab.

A benchmark must never touch what a user deployed: its stack lives in a folder of its own (not the checkout's
``Pulumi.k8s.yaml``, not this machine's ``k8s`` stack), and is destroyed and forgotten by the engine whatever
happens inside the ``with`` block. The namespace is the stack's default, so a benchmark refuses to start while a
``k8s`` stack holds it rather than fight it for the same objects.
"""

from __future__ import annotations

import json
import secrets
import shutil
import ssl
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osfleet.config import Settings
from osfleet.errors import ConfigError

Say = Callable[[str], None]
Kubectl = Callable[..., str]
NAMESPACE = "osfleet"  # the stack's default
# The lab's node store, replica prefix and RAM folder (as in Pulumi.k8s.yaml: apart from this machine's osfleet).
LAB_CONFIG = {
    "osfleet:imageStorePath": "/var/lib/osfleet/k8s-lab/node",
    "osfleet:namePrefix": "osfleet-k8s-",
    "osfleet:memoryDir": "/dev/shm/osfleet-k8s",
}


@dataclass
class Deployed:
    """A stack that ``pulumi up`` brought up: where its gateway answers and how long ``up`` took."""

    stack: Any  # the Automation API stack, for preview
    url: str
    token: str
    context: ssl.SSLContext  # verifies the gateway against the stack's own CA
    up_seconds: float
    up_changes: int
    destroy_seconds: float | None = None  # set once the block has ended and destroy has returned


def lab_kubectl(settings: Settings, hint: str) -> tuple[Any, Kubectl]:
    """The running lab's state and its kubectl, or one line saying to start it (``hint``: the command)."""
    from osfleet.lab.kube.cluster import kubectl
    from osfleet.lab.kube.state import lab_root, load

    state = load(lab_root(settings))
    if state is None or not state.ready:
        raise ConfigError(f"no k8s lab is up: {hint}")
    return state, lambda args, timeout=120: kubectl(state, args, timeout)


def refuse_if_stack_up(kubectl: Kubectl) -> None:
    namespaces = json.loads(kubectl(["get", "namespaces", "-o", "json"])).get("items", [])
    if any(ns.get("metadata", {}).get("name") == NAMESPACE for ns in namespaces):
        raise ConfigError(f"namespace {NAMESPACE!r} exists (a k8s stack is up): pulumi destroy --stack k8s first")


def built_image(settings: Settings) -> str:
    from osfleet.imaging.container import newest_reference

    image = newest_reference(settings)
    if image is None:
        raise ConfigError("no container image built on this machine: osfleet image container")
    return image


def is_kwok(node: dict[str, Any]) -> bool:
    """A node kwok plays (the annotation the lab gives its simulated nodes)."""
    from osfleet.lab.kube.state import KWOK_ANNOTATION

    key, value = KWOK_ANNOTATION
    return bool(node.get("metadata", {}).get("annotations", {}).get(key) == value)


def real_nodes(kubectl: Kubectl) -> list[str]:
    """The nodes a real kubelet runs (not kwok's): in the lab, this machine's."""
    items = json.loads(kubectl(["get", "nodes", "-o", "json"])).get("items", [])
    return sorted(n["metadata"]["name"] for n in items if not is_kwok(n))


@contextmanager
def throwaway_stack(name: str, image: str, settings: Settings, say: Say, config: dict[str, str]) -> Iterator[Deployed]:
    """``pulumi up`` of stack ``name`` with ``image`` and ``config`` over the lab's defaults; destroyed after."""
    from pulumi import automation as auto

    from osfleet.bench.infra import _changes
    from osfleet.lab.engine import call, purge_stack_files, stack
    from osfleet.tls import client_context

    work = Path(tempfile.mkdtemp(prefix=f"osfleet-{name}-"))
    echo = lambda line: say("    " + line.rstrip())  # noqa: E731
    st = stack(name, settings, work_dir=work)
    deployed: Deployed | None = None
    try:
        values = {"osfleet:platform": "k8s", "osfleet:containerImage": image, **LAB_CONFIG, **config}
        for key, value in values.items():
            st.set_config(key, auto.ConfigValue(value))
        st.set_config("osfleet:agentToken", auto.ConfigValue(secrets.token_hex(16), secret=True))
        say("  pulumi up")
        start = time.monotonic()
        up = call(st.up, on_output=echo)
        outputs = up.outputs
        deployed = Deployed(
            stack=st,
            url=outputs["fleetUrl"].value,
            token=outputs["gatewayToken"].value,
            context=client_context(ca_pem=outputs["caCert"].value),
            up_seconds=round(time.monotonic() - start, 2),
            up_changes=_changes(up.summary),
        )
        yield deployed
    finally:
        say("  pulumi destroy")
        start = time.monotonic()
        try:
            call(st.destroy, on_output=echo)
            if deployed is not None:
                deployed.destroy_seconds = round(time.monotonic() - start, 2)
            call(st.workspace.remove_stack, name)
            purge_stack_files(name, settings)
        finally:
            shutil.rmtree(work, ignore_errors=True)
