"""The stacks: ``lab`` and ``onprem`` (hosts prepared over SSH), ``aws`` (EC2 .metal) and ``k8s``.

``run()`` is the whole program; ``infra/__main__.py`` calls it and ``osfleet infra``/``bench infra`` pass
it to the Automation API as an inline program.
"""

from __future__ import annotations

import os
from pathlib import Path

import pulumi

from osfleet_infra.bare_metal import deploy_bare_metal as deploy_bare_metal  # re-exported
from osfleet_infra.components import HostTarget
from osfleet_infra.settings import (
    DEFAULT_HOME,
    DEFAULT_LAB_HOSTS,
    DEFAULT_OSFLEET_BIN,
    DEFAULT_SSH_KEY,
    NS,
    ConfigError,
    bool_value,
    list_value,
    local_osfleet_bin,
    parse_target,
    read_common,
    require_reachable,
)


def run() -> None:
    cfg = pulumi.Config(NS)
    common = read_common(cfg, pulumi.get_stack())
    if common.platform == "aws":
        from osfleet_infra.aws import deploy_aws

        deploy_aws(cfg, common)
    elif common.platform == "k8s":
        from osfleet_infra.k8s import deploy_k8s

        deploy_k8s(cfg, common)
    else:
        targets = lab_targets(cfg) if common.platform == "lab" else onprem_targets(cfg)
        tune = bool_value(cfg, "tuneKernel", common.platform != "lab")
        deploy_bare_metal(targets, common, tune_kernel=tune)


def lab_targets(cfg: pulumi.Config) -> list[HostTarget]:
    """The hosts of this machine's lab (``osfleet lab up``), checked against ``osfleet:hosts``."""
    from osfleet.lab.lab import lab_root
    from osfleet.lab.state import load

    want = cfg.get_int("hosts")
    want = DEFAULT_LAB_HOSTS if want is None else want
    if want < 1:
        raise ConfigError("hosts", f"{want} hosts: a stack needs at least one")
    state = load(lab_root())
    if state is None:
        raise ConfigError("hosts", f"no lab on this machine; run 'osfleet lab up --hosts {want}'")
    if len(state.hosts) != want:
        raise ConfigError(
            "hosts",
            f"the lab has {len(state.hosts)} hosts, the stack wants {want}; run 'osfleet lab up --hosts {want}'",
        )
    targets = []
    for h in state.hosts:
        require_reachable("hosts", h.addr, 22)
        targets.append(
            HostTarget(
                name=h.name, addr=h.addr, key_file=state.key, home=h.home,
                name_prefix=h.name_prefix, osfleet_bin=local_osfleet_bin(),
            )
        )  # fmt: skip
    return targets


def onprem_targets(cfg: pulumi.Config) -> list[HostTarget]:
    """``osfleet:hosts`` as a list of ``user@host[:port]``, all reached with ``osfleet:sshKey``."""
    specs = list_value(cfg, "hosts")
    if not specs:
        raise ConfigError("hosts", "zero hosts; give a list of user@host[:port]")
    key = os.path.expanduser(cfg.get("sshKey") or DEFAULT_SSH_KEY)
    if not Path(key).is_file():
        raise ConfigError("sshKey", f"no private key file {key}")
    targets = []
    for i, spec in enumerate(specs, 1):
        user, addr, port = parse_target("hosts", str(spec))
        require_reachable("hosts", addr, port)
        targets.append(
            HostTarget(
                name=f"host{i}", addr=addr, user=user, port=port, key_file=key,
                home=cfg.get("home") or DEFAULT_HOME, name_prefix=cfg.get("namePrefix") or "osfleet-",
                osfleet_bin=cfg.get("osfleetBin") or DEFAULT_OSFLEET_BIN,
                osfleet_pip_spec=cfg.get("osfleetPipSpec") or "",
            )
        )  # fmt: skip
    return targets
