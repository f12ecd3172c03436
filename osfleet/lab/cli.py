"""``osfleet lab``: a lab of SSH-reachable hosts (network namespaces) on this machine."""

from __future__ import annotations

import json

import click

from osfleet.cli_support import friendly
from osfleet.lab.kube.cli import k8s

__all__ = ["friendly", "lab"]


def _say(message: str) -> None:
    click.echo(message, err=True)


@click.group()
def lab() -> None:
    """A lab of bare-metal-like hosts on this machine: namespaces with their own address, sshd and state."""


@lab.command("up")
@click.option("--hosts", default=2, show_default=True, type=click.IntRange(1, 63), help="number of lab hosts")
@friendly
def lab_up(hosts: int) -> None:
    """Make the lab: per host a network namespace, a veth link, an sshd (lab key), an OSFLEET_HOME and a prefix.

    A lab already up is refused; one whose sshds all stopped (a restart, a killed run) is cleared first.
    """
    from osfleet.lab.lab import lab_root, up

    state = up(hosts, lab_root(), _say)
    click.echo(f"lab up: {len(state.hosts)} hosts on {state.subnet}; ssh -i {state.key} root@<address>")


@lab.command("ls")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@friendly
def lab_ls(as_json: bool) -> None:
    """The lab's hosts: address, SSH target, OSFLEET_HOME, replica-name prefix, whether sshd runs."""
    from osfleet.lab.lab import lab_root, status
    from osfleet.lab.state import load

    state = load(lab_root())
    if as_json:
        out = {"up": state is not None, **(state.to_json() if state else {})}
        if state:
            out["hosts"] = status(state)
        click.echo(json.dumps(out, indent=2))
        return
    if state is None:
        click.echo("no lab (osfleet lab up --hosts N makes one)")
        return
    click.echo(f"lab on {state.subnet}, key {state.key}, known hosts {state.known_hosts}")
    click.echo(f"{'host':6} {'ssh':18} {'sshd':8} {'prefix':16} OSFLEET_HOME")
    for h in status(state):
        sshd = f"{h['sshd_pid']}" if h["sshd_running"] else "stopped"
        click.echo(f"{h['name']:6} {h['ssh']:18} {sshd:8} {h['name_prefix']:16} {h['home']}")


@lab.command("down")
@friendly
def lab_down() -> None:
    """Remove every process, replica domain, namespace, link, key and file the lab made."""
    from osfleet.lab.lab import down, lab_root

    down(lab_root(), _say)


lab.add_command(k8s)
