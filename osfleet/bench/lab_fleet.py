"""A fleet on this machine as a user makes one: lab hosts, ``pulumi up --stack lab`` with the plain CLI and
osfleet's language host, and a fleet gateway over the agents it deployed. The main job runs its load through
this; leaving the ``with`` block (normally, on an error, on Ctrl-C or SIGTERM) stops the gateway, runs
``pulumi destroy`` and takes the lab down, and the result records what was left.

The stack is the project's ``lab`` stack; its config is a copy of ``Pulumi.lab.yaml`` in the run directory
(``--config-file``) holding this run's agent token and warm-pool size, so the checkout's files are never
written. A ``lab`` stack that already has resources (someone's deployment) is refused, never touched; a
stack made here is removed at the end (``stack rm --preserve-config``).
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from osfleet.config import Settings
from osfleet.errors import ConfigError, OsfleetError

Say = Callable[[str], None]
STACK = "lab"
HEALTH_SECONDS = 120.0
READY_SECONDS = 600.0


@dataclass(frozen=True)
class DeployedAgent:
    """A host agent the stack deployed, as the gateway and its overhead probe address it."""

    name: str
    url: str
    token: str


def _status(url: str, token: str | None = None, ca_file: Path | None = None) -> int:
    """The HTTP status ``url`` answers (0: no answer); an https URL verified against ``ca_file``."""
    from osfleet.tls import client_context

    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    context = client_context(ca_file) if ca_file is not None and url.startswith("https://") else None
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, ValueError):
        return 0


class LabFleet:
    """``with LabFleet(run_dir, hosts, warm, settings, say) as fleet:`` -> ``fleet.gateway``, ``fleet.agents``;
    ``fleet.result`` is the infra section of the report (``infra.json``)."""

    def __init__(self, run_dir: Path, hosts: int, warm: int, settings: Settings, say: Say) -> None:
        self.run_dir = run_dir
        self.hosts = hosts
        self.warm = warm
        self.settings = settings
        self.say = say
        self.config_file = run_dir / f"Pulumi.{STACK}.yaml"
        self.ca_file = (
            run_dir / "lab-ca.pem"
        )  # the stack's CA (its caCert output), which the agents' certificates chain to
        self.agents: list[DeployedAgent] = []
        self.gateway: Any = None
        self.result: dict[str, Any] = {"stack": STACK, "hosts": hosts, "warm": warm, "cli": "pulumi"}
        self._lab_state: Any = None
        self._made_stack = False
        self._deployed = False

    # --- the plain CLI ------------------------------------------------------------------------------------
    def _pulumi(self, *args: str, capture: bool = False, stdin: str | None = None) -> str:
        from osfleet.lab.engine import run_cli

        echo = (lambda line: None) if capture else (lambda line: self.say("    " + line))
        return run_cli(list(args), self.settings, capture=capture, stdin=stdin, echo=echo)

    def _stack_args(self) -> list[str]:
        return ["--stack", STACK, "--config-file", str(self.config_file), "--non-interactive"]

    def _history(self) -> dict[str, Any]:
        out = self._pulumi("stack", "history", "--json", "--page-size", "1", "--stack", STACK, capture=True)
        rows = json.loads(out or "[]")
        return rows[0] if rows else {}

    def _resources(self) -> int:
        """Resources the stack's state holds now, as the CLI counts them (providers not included)."""
        out = self._pulumi("stack", "export", "--stack", STACK, capture=True)
        rows = (json.loads(out or "{}").get("deployment") or {}).get("resources") or []
        return sum(1 for r in rows if not str(r.get("type", "")).startswith("pulumi:providers:"))

    def _prepare_stack(self) -> None:
        """Select ``lab`` (made in a scratch folder when missing, so its salt lands in our config copy) and
        write the run's config file."""
        from osfleet.lab.engine import PROJECT, project_dir, run_cli

        listed = json.loads(self._pulumi("stack", "ls", "--json", capture=True) or "[]")
        exists = any(s.get("name") == STACK for s in listed)
        base = (project_dir() / f"Pulumi.{STACK}.yaml").read_text()
        salt = ""
        if not exists:
            scratch = Path(tempfile.mkdtemp(prefix="osfleet-stack-"))
            try:
                (scratch / "Pulumi.yaml").write_text(f"name: {PROJECT}\nruntime: python\n")
                run_cli(["stack", "init", STACK, "--non-interactive"], self.settings, capture=True, cwd=scratch)
                made = (scratch / f"Pulumi.{STACK}.yaml").read_text()
                salt = next((ln for ln in made.splitlines() if ln.startswith("encryptionsalt:")), "")
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            self._made_stack = True
        elif (n := self._resources()) > 0:
            raise ConfigError(
                f"the {STACK} stack already has {n} resources (someone's deployment): take it down with "
                f"'pulumi destroy --stack {STACK}' first; the main job deploys and destroys its own"
            )
        lines = [ln for ln in base.splitlines() if not ln.startswith("encryptionsalt:")]
        self.config_file.write_text("\n".join(lines + ([salt] if salt else [])) + "\n")
        self.config_file.chmod(0o600)
        for key, value in (("osfleet:hosts", str(self.hosts)), ("osfleet:warm", str(self.warm))):
            self._pulumi("config", "set", key, value, *self._stack_args(), capture=True)
        token = secrets.token_hex(16)
        self._pulumi("config", "set", "--secret", "osfleet:agentToken", *self._stack_args(), capture=True, stdin=token)

    # --- up and down --------------------------------------------------------------------------------------
    def __enter__(self) -> LabFleet:
        from osfleet.bench.chaos import Gateway, gateway_overhead
        from osfleet.lab import lab as lab_ops
        from osfleet.lab.engine import engine_version, ensure_engine

        try:  # the engine is built on its first use here (bench all on a fresh machine)
            self.result["engine"] = engine_version(ensure_engine(self.settings, self.say))
            self.say(f"lab up --hosts {self.hosts}")
            t = time.monotonic()
            self._lab_state = lab_ops.up(self.hosts, lab_ops.lab_root(self.settings), self.say)
            self.result["lab_up_seconds"] = round(time.monotonic() - t, 2)
            self._prepare_stack()
            self.say(f"pulumi up --stack {STACK} ({self.result['engine']}, our language host)")
            t = time.monotonic()
            self._deployed = True
            self._pulumi("up", "--yes", *self._stack_args())
            self.result["up_seconds"] = round(time.monotonic() - t, 2)
            self.result["up_changes"] = self._history().get("resourceChanges", {})
            self.say("second pulumi up (nothing may change)")
            t = time.monotonic()
            self._pulumi("up", "--yes", *self._stack_args())
            self.result["second_up_seconds"] = round(time.monotonic() - t, 2)
            changes = self._history().get("resourceChanges", {})
            self.result["second_up_changes"] = sum(n for kind, n in changes.items() if kind != "same")
            self.result["resources"] = self._resources()
            outs = json.loads(
                self._pulumi("stack", "output", "--json", "--show-secrets", "--stack", STACK, capture=True)
            )
            token = outs["agentToken"]
            self.agents = [DeployedAgent(name, url, token) for name, url in sorted(outs["agents"].items())]
            ca = self.ca_file if outs.get("caCert") else None  # the agents serve https under the stack's own CA
            if ca is not None:
                ca.write_text(outs["caCert"])
            self.result["golden_image"] = outs.get("goldenImage")
            self.result["agents"] = {a.name: a.url for a in self.agents}
            health = {a.name: {"health": _status(f"{a.url}/health", ca_file=ca),
                               "authorized": _status(f"{a.url}/v1/host", token, ca)} for a in self.agents}  # fmt: skip
            self.result["health"] = health
            self.result["hosts_healthy"] = sum(h == {"health": 200, "authorized": 200} for h in health.values())
            if self.result["hosts_healthy"] < len(self.agents):
                raise OsfleetError(f"agents not healthy after pulumi up: {json.dumps(health)}")
            self.say(f"fleet gateway over {len(self.agents)} agents")
            self.gateway = Gateway(self.agents, self.run_dir, ca)
            self._wait_gateway()
            t = time.monotonic()
            self.wait_ready(len(self.agents) * self.warm, READY_SECONDS)
            self.result["warm_pool_ready_seconds"] = round(time.monotonic() - t, 2)
            self.say("gateway overhead: the same step straight to a host and through the gateway, alternating")
            self.result["gateway_overhead"] = gateway_overhead(self.gateway, self.agents, ca_file=ca)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def wait_ready(self, count: int, timeout: float) -> None:
        """Until the gateway sees ``count`` ready replicas across its hosts (the agents' warm pools; the first
        replica on a host is a cold boot that saves the state the others are restored from)."""
        from osfleet.bench.load import _get

        gw = self.gateway
        self.say(f"waiting for {count} ready replicas across the hosts (warm pools)")
        deadline = time.monotonic() + timeout
        last = time.monotonic()
        while time.monotonic() < deadline:
            status, reps = _get(f"{gw.url}/v1/replicas", headers=gw.headers, timeout=10)
            ready = sum(r["state"] == "ready" for r in reps) if status == 200 else 0
            if ready >= count:
                return
            if time.monotonic() - last > 30:
                self.say(f"  ... {ready}/{count} ready")
                last = time.monotonic()
            time.sleep(1.0)
        raise OsfleetError(f"the fleet did not have {count} ready replicas within {timeout:.0f} s")

    def wait_room(self, count: int, timeout: float) -> int:
        """Until the gateway's placement has room for ``count`` more replicas across the hosts (room is
        measured: free memory and idle CPU, which a host just done booting lacks for a while); returns the
        room there is, at most ``count``, when ``timeout`` runs out first."""
        from osfleet.bench.load import _get

        gw = self.gateway
        deadline = time.monotonic() + timeout
        room = 0
        said = False
        while True:
            status, doc = _get(f"{gw.url}/v1/host", headers=gw.headers, timeout=10)
            if status == 200:
                rooms = [h.get("room") or {} for h in (doc or {}).get("hosts", {}).values() if h.get("healthy")]
                room = sum(int(r.get("replicas") or 0) for r in rooms)
            if room >= count or time.monotonic() > deadline:
                return min(room, count)
            if not said:
                self.say(f"waiting for room for {count} replicas in the fleet (now {room}: busy CPU after boots)")
                said = True
            time.sleep(2.0)

    def _wait_gateway(self) -> None:
        gw = self.gateway
        deadline = time.monotonic() + HEALTH_SECONDS
        while time.monotonic() < deadline:
            if gw.proc.poll() is not None:
                raise OsfleetError(f"the fleet gateway exited with {gw.proc.returncode}; see {gw.log.name}")
            if _status(f"{gw.url}/health") == 200:
                return
            time.sleep(0.5)
        raise OsfleetError(f"the fleet gateway did not answer in {HEALTH_SECONDS:.0f} s; see {gw.log.name}")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Gateway, stack, lab, in that order, each tried even if an earlier one failed; then the leftovers."""
        from osfleet.bench.infra import infra_leftovers
        from osfleet.lab import lab as lab_ops

        if self.gateway is not None:
            self.gateway.stop()
            self.gateway = None
        problems: list[str] = []
        after_destroy: dict[str, int] = {}
        if self._deployed:
            self._deployed = False
            self.say(f"pulumi destroy --stack {STACK}")
            t = time.monotonic()
            try:
                self._pulumi("destroy", "--yes", *self._stack_args())
                self.result["destroy_seconds"] = round(time.monotonic() - t, 2)
                if self._lab_state is not None:
                    after_destroy = infra_leftovers(self._lab_state, self.settings)
            except OsfleetError as e:
                problems.append(f"pulumi destroy: {e}")
        if self._made_stack:
            self._made_stack = False
            try:
                # --force: after a failed destroy the state still lists resources of a lab that is going away now
                rm = ["stack", "rm", "--yes", "--force", "--preserve-config", STACK, "--non-interactive"]
                self._pulumi(*rm, capture=True)
            except OsfleetError as e:
                problems.append(f"pulumi stack rm: {e}")
        if self._lab_state is not None:
            self._lab_state = None
            self.say("lab down")
            t = time.monotonic()
            root = lab_ops.lab_root(self.settings)
            lab_ops.down(root, self.say, self.settings.libvirt_uri)
            self.result["lab_down_seconds"] = round(time.monotonic() - t, 2)
            self.result["lab_template_ram_removed"] = len(remove_template_memory(root, self.settings))
            after_down = lab_ops.leftovers(root, self.settings.libvirt_uri)
            after_down.pop("state_hosts", None)
            after_down["template_ram_files"] = len(_template_owners(root, self.settings))
            self.result["leftovers"] = {**after_destroy, **{f"lab_{k}": v for k, v in after_down.items()}}
        if problems:
            self.result["teardown_problems"] = problems
            for p in problems:
                self.say(f"teardown: {p}")


def _template_owners(lab_root: Path, settings: Settings) -> list[Path]:
    """Owner files of template RAM (on tmpfs, outside the lab's folder) whose saved state was a lab host's."""
    from osfleet.config import DEFAULT_MEMORY_DIR

    dirs = {d for d in (DEFAULT_MEMORY_DIR, settings.memory_dir) if d is not None and d.is_dir()}
    out = []
    for d in dirs:
        for owner in d.glob("*.state"):
            try:
                if Path(owner.read_text().strip()).is_relative_to(lab_root):
                    out.append(owner)
            except OSError:
                continue
    return out


def remove_template_memory(lab_root: Path, settings: Settings) -> list[Path]:
    """The lab hosts' agents keep their saved states' RAM in the machine's memory folder (a tmpfs), which
    ``lab down`` does not own; once their homes are gone these files are orphans taking RAM: remove exactly
    those (the owner file names the state it belonged to), now rather than at the next sweep."""
    removed = []
    for owner in _template_owners(lab_root, settings):
        owner.with_suffix(".ram").unlink(missing_ok=True)
        owner.unlink(missing_ok=True)
        removed.append(owner.with_suffix(".ram"))
    return removed
