"""``osfleet infra``: the project's Pulumi stacks with the engine built on this machine.

The commands drive the plain ``pulumi`` CLI in the project's root, exactly what a user runs after
``eval "$(osfleet infra env)"``: the same language host (``osfleet.lab.language_host``), the same
``Pulumi.<stack>.yaml``, the same state. (They used to run the program inline through the Automation API,
which the user's own ``pulumi up`` could not reproduce.) The engine's output streams to stderr; what a
command returns (outputs) goes to stdout as JSON.
"""

from __future__ import annotations

import json
import shlex

import click

from osfleet.cli_support import friendly
from osfleet.lab.engine import STACKS

_stack_option = click.option("--stack", "stack_name", type=click.Choice(STACKS), default="lab", show_default=True)


@click.group()
def infra() -> None:
    """The Pulumi program in infra/ (stacks lab, onprem, aws, k8s), state and secrets kept on this machine."""


@infra.command("env")
@friendly
def infra_env() -> None:
    """POSIX ``export`` lines for the plain ``pulumi`` CLI: ``eval "$(.venv/bin/osfleet infra env)"``, then in
    the project's root ``pulumi stack select lab``, ``pulumi preview``, ``pulumi up`` ... work as Pulumi
    documents them (the engine and our language host on PATH, the local file backend, the passphrase file, no
    update checks, no plugin downloads), and ``SSL_CERT_FILE``: the system's CAs plus those of the stacks deployed
    from here, so the shell verifies the agents' HTTPS (``curl``, Python, Go) without a ``--cacert``."""
    from osfleet.config import Settings
    from osfleet.lab.engine import engine_env, ensure_engine
    from osfleet.tls import write_trust_bundle

    ensure_engine()  # built on first use; its progress goes to stderr, the exports to stdout
    env = engine_env()
    env["SSL_CERT_FILE"] = str(write_trust_bundle(Settings.from_env().home))
    for key, value in env.items():
        click.echo(f"export {key}={shlex.quote(value)}")


def _select(stack_name: str) -> None:
    """Select the stack, creating it (with this machine's passphrase secrets) the first time."""
    from osfleet.lab.engine import run_cli

    run_cli(["stack", "select", "--create", stack_name, "--non-interactive"], capture=True)


@infra.command("preview")
@_stack_option
@friendly
def infra_preview(stack_name: str) -> None:
    """What an up would change (``pulumi preview --stack S``)."""
    from osfleet.lab.engine import run_cli

    _select(stack_name)
    run_cli(["preview", "--stack", stack_name, "--non-interactive"])


@infra.command("up")
@_stack_option
@friendly
def infra_up(stack_name: str) -> None:
    """Create or update the stack's hosts, golden image and host agents (``pulumi up --yes --stack S``)."""
    from osfleet.lab.engine import run_cli

    _select(stack_name)
    run_cli(["up", "--yes", "--stack", stack_name, "--non-interactive"])
    click.echo(run_cli(["stack", "output", "--json", "--stack", stack_name], capture=True).strip())


@infra.command("destroy")
@_stack_option
@friendly
def infra_destroy(stack_name: str) -> None:
    """Remove everything the stack made (``pulumi destroy --yes --stack S``)."""
    from osfleet.lab.engine import run_cli

    _select(stack_name)
    run_cli(["destroy", "--yes", "--stack", stack_name, "--non-interactive"])


@infra.command("outputs")
@_stack_option
@click.option("--show-secrets", is_flag=True, help="include the agent token")
@friendly
def infra_outputs(stack_name: str, show_secrets: bool) -> None:
    """The stack's outputs (host addresses, agent URLs, golden image) as JSON."""
    from osfleet.lab.engine import run_cli

    args = ["stack", "output", "--json", "--stack", stack_name] + (["--show-secrets"] if show_secrets else [])
    outs = json.loads(run_cli(args, capture=True) or "{}")
    if not show_secrets:  # the CLI prints secrets as "[secret]"; leave them out, as before
        outs = {k: v for k, v in outs.items() if v != "[secret]"}
    click.echo(json.dumps(outs, indent=2))


@infra.command("pulumi", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@friendly
def infra_pulumi(args: tuple[str, ...]) -> None:
    """Run the engine built here on the project with its state, secrets and offline settings, e.g.
    ``osfleet infra pulumi config set --secret osfleet:agentToken T --stack lab`` (the same as ``pulumi ARGS``
    in the project's root after ``eval "$(osfleet infra env)"``)."""
    import os

    from osfleet.lab.engine import engine_env, ensure_engine, project_dir

    root = ensure_engine()
    env = {**os.environ, **engine_env()}
    os.chdir(project_dir())
    os.execve(str(root / "bin" / "pulumi"), ["pulumi", *args], env)


@infra.command("token")
@_stack_option
@click.option("--value", default=None, help="the token (default: 32 random hex digits)")
@friendly
def infra_token(stack_name: str, value: str | None) -> None:
    """Create the stack if needed and set osfleet:agentToken as a secret (encrypted with this machine's passphrase)."""
    import secrets

    from osfleet.lab.engine import run_cli

    _select(stack_name)
    # The value goes in on stdin, never on a command line another user could read.
    args = ["config", "set", "--secret", "osfleet:agentToken", "--stack", stack_name, "--non-interactive"]
    run_cli(args, capture=True, stdin=value or secrets.token_hex(16))
    click.echo(f"osfleet:agentToken set (secret) on stack {stack_name}", err=True)
