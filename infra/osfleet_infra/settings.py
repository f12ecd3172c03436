"""Stack configuration, validated before any resource is declared so bad config fails at preview with one
line naming the key (``osfleet:<key>: <what is wrong>``)."""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi

from osfleet.errors import OsfleetError

NS = "osfleet"
PLATFORMS = ("lab", "onprem", "aws", "k8s")
MODES = ("snapshot", "cold")
TENANCIES = ("single", "multi")
# Who the replicas of a stack's hosts serve, and so whether KSM may merge their memory (osfleet.vm.host_tune's rule):
# "multi" unless said otherwise, because a fleet with client tokens serves tenants that must not learn what each
# other's desktops hold (KSM's merge timing is such a channel). A stack whose every client is one team's RL run
# sets "single" to get KSM's density.
DEFAULT_TENANCY = "multi"
REPO = Path(__file__).resolve().parents[2]
DEFAULT_RECIPE = "golden_images/recipes/desktop.yaml"
DEFAULT_AGENT_PORT = 8080
DEFAULT_WARM = 1
DEFAULT_MODE = "snapshot"
DEFAULT_LAB_HOSTS = 2
DEFAULT_HOME = "/var/lib/osfleet"
DEFAULT_OSFLEET_BIN = "/opt/osfleet/bin/osfleet"
DEFAULT_SSH_KEY = "~/.ssh/id_ed25519"


class ConfigError(pulumi.RunError):
    """A bad config value; the engine prints its message as one line, without a traceback."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{NS}:{key}: {problem}")


@dataclass(frozen=True)
class Common:
    """Keys every stack reads."""

    platform: str
    footprint: Any  # osfleet.measure.cost.Footprint measured in osfleet:footprintRun, or None
    usd_per_host_hour: float | None
    recipe: Path
    recipe_hash: str
    agent_port: int
    warm: int
    mode: str
    token: pulumi.Output[str]
    tenancy: str = DEFAULT_TENANCY


def _int(cfg: pulumi.Config, key: str, default: int, low: int, high: int) -> int:
    raw = cfg.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(key, f"{raw!r} is not a whole number") from None
    if not low <= value <= high:
        raise ConfigError(key, f"{value} is out of range {low}..{high}")
    return value


def _choice(cfg: pulumi.Config, key: str, default: str, choices: tuple[str, ...]) -> str:
    value = cfg.get(key) or default
    if value not in choices:
        raise ConfigError(key, f"{value!r} is not one of {', '.join(choices)}")
    return value


def bool_value(cfg: pulumi.Config, key: str, default: bool) -> bool:
    raw = cfg.get(key)
    if raw is None:
        return default
    if raw.lower() not in ("true", "false"):
        raise ConfigError(key, f"{raw!r} is not true or false")
    return raw.lower() == "true"


def read_common(cfg: pulumi.Config, stack: str) -> Common:
    """Validate the keys every stack shares. The agents' secret token comes from ``pulumi config set --secret
    osfleet:agentToken``; the ``k8s`` stack makes one when it is not set (``pulumi stack output agentToken``)."""
    from osfleet.imaging.builder import image_hash_for
    from osfleet.recipe import load_recipe

    platform = _choice(cfg, "platform", stack if stack in PLATFORMS else "", PLATFORMS)
    recipe = Path(cfg.get("recipe") or DEFAULT_RECIPE)
    recipe = recipe if recipe.is_absolute() else REPO / recipe
    if not recipe.is_file():
        raise ConfigError("recipe", f"no recipe file {recipe}")
    try:
        recipe_hash = image_hash_for(load_recipe(recipe))
    except OsfleetError as exc:
        raise ConfigError("recipe", str(exc)) from None
    if cfg.get_secret("agentToken") is not None:
        token = cfg.require_secret("agentToken")
    elif platform == "k8s":  # the cluster keeps it in a Secret: a token made once, kept secret in the stack's state
        from osfleet_infra.components import generated_token

        token = generated_token("agent-token")
    else:
        raise ConfigError("agentToken", "missing secret; set it with 'pulumi config set --secret osfleet:agentToken'")
    price = cfg.get_float("usdPerHostHour")
    if price is not None and price < 0:
        raise ConfigError("usdPerHostHour", f"{price} is negative")
    return Common(
        platform=platform,
        footprint=read_footprint(cfg),
        usd_per_host_hour=price,
        recipe=recipe,
        recipe_hash=recipe_hash,
        agent_port=_int(cfg, "agentPort", DEFAULT_AGENT_PORT, 1, 65535),
        warm=_int(cfg, "warm", DEFAULT_WARM, 0, 4096),
        mode=_choice(cfg, "mode", DEFAULT_MODE, MODES),
        token=token,
        tenancy=_choice(cfg, "tenancy", DEFAULT_TENANCY, TENANCIES),
    )


def read_footprint(cfg: pulumi.Config) -> Any:
    """The per-replica footprint measured in a run directory (``osfleet bench all``), for capacity outputs."""
    raw = cfg.get("footprintRun")
    if not raw:
        return None
    from osfleet.report.load import load

    run_dir = Path(raw).expanduser()
    if not run_dir.is_dir():
        raise ConfigError("footprintRun", f"no run directory {run_dir}")
    try:
        cost = load(run_dir).cost
    except OsfleetError as exc:
        raise ConfigError("footprintRun", str(exc)) from None
    if cost is None:
        raise ConfigError("footprintRun", f"{run_dir} has no measured footprint (needs its load test and reset bench)")
    return cost.footprint


def parse_target(key: str, spec: str) -> tuple[str, str, int]:
    """``user@host[:port]`` -> (user, host, port)."""
    user, at, rest = spec.rpartition("@")
    if not at or not user or not rest:
        raise ConfigError(key, f"{spec!r} is not user@host[:port]")
    host, colon, port = rest.partition(":")
    try:
        port_n = int(port) if colon else 22
    except ValueError:
        raise ConfigError(key, f"{spec!r} has a bad port") from None
    return user, host, port_n


def require_reachable(key: str, addr: str, port: int, timeout: float = 5.0) -> None:
    """Fail the preview when a host's SSH server does not answer (rather than midway through an update).

    A TCP connect alone is not proof (proxies and NAT accept connections for hosts that are not there), so
    the server must also greet with its SSH banner.
    """
    try:
        with socket.create_connection((addr, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            banner = conn.recv(256)
    except OSError as exc:
        raise ConfigError(key, f"host {addr}:{port} is unreachable ({exc.strerror or exc})") from None
    if not banner.startswith(b"SSH-"):
        raise ConfigError(key, f"host {addr}:{port} is unreachable (no SSH server answers there)")


def list_value(cfg: pulumi.Config, key: str) -> list[Any] | None:
    try:
        value = cfg.get_object(key)
    except (ValueError, pulumi.ConfigTypeError):
        raise ConfigError(key, "is not valid JSON (set a list with 'pulumi config set --path')") from None
    if value is not None and not isinstance(value, list):
        raise ConfigError(key, "must be a list")
    return value


def local_osfleet_bin() -> str:
    """The osfleet command of the environment running the program (the lab shares this machine's venv)."""
    return str(Path(sys.executable).parent / "osfleet")
