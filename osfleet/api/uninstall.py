"""A host agent run by a Kubernetes DaemonSet tears its node's replicas down when the DaemonSet goes away.

From inside, the agent's pod ends the same way for two different reasons. A restart (the pod deleted, a rolling
update, a crash): the DaemonSet's next pod on the node adopts the replicas from their records on the node's disk,
so they must be left running. An uninstall (``pulumi destroy``, ``kubectl delete daemonset``): no pod will ever
come back for them, and left running they would hold the node's memory and CPU for good. What tells the two apart
is the DaemonSet itself, so at shutdown the agent asks the API server for it, with a service account that may
only ``get`` that one object (the ``k8s`` stack's ``osfleet-agent`` Role):

- found and not being deleted: a restart, keep the replicas;
- being deleted (``deletionTimestamp``, the foreground deletion ``pulumi destroy`` makes), or gone (404): tear down;
- 401/403 although the same read worked at start-up: the account or its Role was deleted, which only happens with
  the stack: tear down;
- anything else (API server unreachable, a timeout, 403 since start-up): keep, and say so. A wrong teardown loses
  episodes; a replica wrongly kept is adopted by the next agent or removed by ``osfleet replicas down --all``.

Only the replicas go: their domains, overlays and records. Checkpoints are clients' data and stay, with the saved
states they are layered on, whose memory files sit in the node's RAM folder (``OSFLEET_MEMORY_DIR``);
``osfleet replicas down --all --states`` on the node frees those too.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DAEMONSET_ENV = "OSFLEET_K8S_DAEMONSET"  # the agent's DaemonSet, set by the k8s stack
ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TIMEOUT_SECONDS = 5.0  # inside the pod's termination grace period (30 s) with room for the teardown

Verdict = Literal["present", "deleting", "gone", "unknown"]


@dataclass(frozen=True)
class DaemonSetOwner:
    """Where the agent's DaemonSet is read: the API server, the account's token and CA, its namespace and name."""

    api: str
    namespace: str
    name: str
    token_file: Path
    ca_file: Path | None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, account: Path = ACCOUNT_DIR) -> DaemonSetOwner | None:
        """The owner when the agent runs in a pod of a DaemonSet that says so; None otherwise (bare metal, a lab
        host, a pod without the stack's account)."""
        env = dict(os.environ) if env is None else env
        name, host = env.get(DAEMONSET_ENV), env.get("KUBERNETES_SERVICE_HOST")
        if not name or not host or not (account / "token").exists() or not (account / "namespace").exists():
            return None
        port = env.get("KUBERNETES_SERVICE_PORT", "443")
        host = f"[{host}]" if ":" in host else host
        ca = account / "ca.crt"
        return cls(f"https://{host}:{port}", (account / "namespace").read_text().strip(), name,
                   account / "token", ca if ca.exists() else None)  # fmt: skip

    def read(self) -> tuple[int | None, dict[str, object] | None]:
        """(HTTP status, the object when 200) of the DaemonSet; (None, None) when the API server did not answer."""
        url = f"{self.api}/apis/apps/v1/namespaces/{self.namespace}/daemonsets/{self.name}"
        try:
            token = self.token_file.read_text().strip()  # projected tokens rotate: read at each call
        except OSError:
            return None, None
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
        context = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else None
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_SECONDS, context=context) as resp:
                body = json.loads(resp.read(4 << 20))
                return resp.status, body if isinstance(body, dict) else None
        except urllib.error.HTTPError as exc:
            exc.close()
            return exc.code, None
        except (urllib.error.URLError, OSError, ValueError):
            return None, None

    def verdict(self, readable_at_start: bool) -> Verdict:
        status, body = self.read()
        if status == 200 and body is not None:
            meta = body.get("metadata")
            return "deleting" if isinstance(meta, dict) and meta.get("deletionTimestamp") else "present"
        if status == 404 or (status in (401, 403) and readable_at_start):
            return "gone"
        return "unknown"


def uninstalled(owner: DaemonSetOwner | None, readable_at_start: bool, say: Callable[[str], None]) -> bool:
    """Whether the agent, shutting down, should tear its node's replicas down (its DaemonSet is going away)."""
    if owner is None:
        return False
    verdict = owner.verdict(readable_at_start)
    where = f"DaemonSet {owner.namespace}/{owner.name}"
    if verdict == "present":
        say(f"{where} is still there: a restart, the replicas stay for the next agent on this node")
    elif verdict == "unknown":
        say(f"could not tell whether {where} is being removed: the replicas stay "
            "(the next agent adopts them, or 'osfleet replicas down --all' removes them)")  # fmt: skip
    else:
        say(f"{where} is {verdict}: an uninstall, tearing this node's replicas down")
    return verdict in ("deleting", "gone")


def check_at_start(owner: DaemonSetOwner | None, say: Callable[[str], None]) -> bool:
    """Read the DaemonSet once at start-up; whether that worked (so a 401/403 at shutdown means removed)."""
    if owner is None:
        return False
    status, _ = owner.read()
    if status != 200:
        say(f"cannot read DaemonSet {owner.namespace}/{owner.name} (HTTP {status or 'no answer'}): "
            "an uninstall will leave this node's replicas running")  # fmt: skip
    return status == 200
