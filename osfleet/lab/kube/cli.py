"""``osfleet lab k8s``: a real Kubernetes cluster on this machine (see ``osfleet.lab.kube.cluster``)."""

from __future__ import annotations

import json

import click

from osfleet.cli_support import friendly


def _say(message: str) -> None:
    click.echo(message, err=True)


@click.group("k8s")
def k8s() -> None:
    """A Kubernetes cluster on this machine: real control plane, this machine as a KVM node, kwok nodes."""


@k8s.command("up")
@click.option("--kwok-nodes", default=0, show_default=True, type=click.IntRange(0, 1000),
              help="simulated nodes (kwok) beside the real one")  # fmt: skip
@click.option("--kwok-kvm", is_flag=True, help="label the simulated nodes for KVM too (for scale tests)")
@friendly
def k8s_up(kwok_nodes: int, kwok_kvm: bool) -> None:
    """Build the cluster's binaries if needed (scripts/build-k8s, once per machine), then start etcd, the API server,
    controller manager, scheduler, containerd, a kubelet (node osfleet-node, labelled osfleet.io/kvm=true, its
    store holding the newest golden image), kube-proxy, CoreDNS and kwok; prints the kubeconfig
    (``osfleet infra env`` exports it). A lab already up is refused; one whose processes all stopped (a restart, a
    killed run) is cleared first."""
    from osfleet.lab.kube import tools
    from osfleet.lab.kube.cluster import up
    from osfleet.lab.kube.state import lab_root

    cluster = tools.build("cluster", _say)
    tools.build("provider", _say)  # what `pulumi up --stack k8s` needs next
    state = up(kwok_nodes, kwok_kvm, lab_root(), cluster, _say)
    _stack_ready()
    click.echo(str(state.kubeconfig))


def _stack_ready() -> None:
    """The ``k8s`` stack in this machine's Pulumi backend, so ``pulumi up --stack k8s`` (and ``pulumi config set
    --stack k8s``) work as typed; an existing stack and its Pulumi.k8s.yaml are kept as they are."""
    from osfleet.errors import OsfleetError
    from osfleet.lab.engine import run_cli

    try:
        run_cli(["stack", "select", "--create", "k8s", "--non-interactive"], capture=True)
    except OsfleetError as exc:  # the cluster is up all the same; the stack can be made by hand
        _say(f"k8s lab: the Pulumi stack k8s was not made ({exc}): pulumi stack select --create k8s")
        return
    _say("k8s lab: Pulumi stack k8s selected (pulumi up --stack k8s deploys osfleet here)")


@k8s.command("ls")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@friendly
def k8s_ls(as_json: bool) -> None:
    """The k8s lab: API server, kubeconfig, node store, components and whether each still runs."""
    from osfleet.lab.kube.state import lab_root, load
    from osfleet.lab.proc import alive

    s = load(lab_root())
    if as_json:
        out: dict[str, object] = {"up": s is not None}
        if s is not None:
            out |= s.to_json() | {"kubeconfig": str(s.kubeconfig), "api": s.api_url, "node_store": str(s.node_home),
                                  "running": {n: alive(p) for n, p in s.pids.items()}}  # fmt: skip
        click.echo(json.dumps(out, indent=2))
        return
    if s is None:
        click.echo("no k8s lab (osfleet lab k8s up makes one)")
        return
    click.echo(f"k8s lab at {s.api_url}, kubeconfig {s.kubeconfig}, node store {s.node_home}, "
               f"{s.kwok_nodes} kwok nodes{' (KVM)' if s.kwok_kvm else ''}")  # fmt: skip
    for name, pid in s.pids.items():
        click.echo(f"  {name:24} {pid:8} {'running' if alive(pid) else 'stopped'}")


@k8s.command("down")
@friendly
def k8s_down() -> None:
    """Remove every process, container, replica domain, mount, cgroup, namespace and file of the k8s lab, and put
    back the kernel settings the kubelet changed."""
    from osfleet.lab.kube.cluster import down
    from osfleet.lab.kube.state import lab_root

    down(lab_root(), _say)
