"""``osfleet infra``: preview, up, destroy and outputs of the project's Pulumi stacks with the engine built
on this machine (the Automation API drives the real ``pulumi`` binary; its output streams through)."""

from __future__ import annotations

import json

import click

from osfleet.lab.cli import friendly
from osfleet.lab.engine import STACKS

_stack_option = click.option("--stack", "stack_name", type=click.Choice(STACKS), default="lab", show_default=True)


def _echo(line: str) -> None:
    click.echo(line.rstrip("\n"), err=True)


@click.group()
def infra() -> None:
    """The Pulumi program in infra/ (stacks lab, onprem, aws, k8s), state and secrets kept on this machine."""


@infra.command("preview")
@_stack_option
@friendly
def infra_preview(stack_name: str) -> None:
    """What an up would change."""
    from osfleet.lab.engine import call, stack

    st = stack(stack_name)
    res = call(st.preview, on_output=_echo)
    click.echo(json.dumps(res.change_summary))


@infra.command("up")
@_stack_option
@friendly
def infra_up(stack_name: str) -> None:
    """Create or update the stack's hosts, golden image and host agents."""
    from osfleet.lab.engine import call, stack

    st = stack(stack_name)
    res = call(st.up, on_output=_echo)
    click.echo(json.dumps({k: v.value for k, v in res.outputs.items() if not v.secret}, indent=2))


@infra.command("destroy")
@_stack_option
@friendly
def infra_destroy(stack_name: str) -> None:
    """Remove everything the stack made."""
    from osfleet.lab.engine import call, stack

    st = stack(stack_name)
    call(st.destroy, on_output=_echo)


@infra.command("outputs")
@_stack_option
@click.option("--show-secrets", is_flag=True, help="include the agent token")
@friendly
def infra_outputs(stack_name: str, show_secrets: bool) -> None:
    """The stack's outputs (host addresses, agent URLs, golden image) as JSON."""
    from osfleet.lab.engine import call, stack

    st = stack(stack_name)
    outs = call(st.outputs)
    click.echo(json.dumps({k: v.value for k, v in outs.items() if show_secrets or not v.secret}, indent=2))


@infra.command("pulumi", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@friendly
def infra_pulumi(args: tuple[str, ...]) -> None:
    """Run the engine built here on the project with its state, secrets and offline settings, e.g.
    ``osfleet infra pulumi config set --secret osfleet:agentToken T --stack lab`` (``up``/``preview`` need
    the Python language host, which is not built here: use ``osfleet infra up``)."""
    import os

    from osfleet.lab.engine import engine_env, engine_root, engine_version, project_dir

    root = engine_root()
    engine_version(root)
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

    from pulumi import automation as auto

    from osfleet.lab.engine import call, stack

    st = stack(stack_name)
    call(st.set_config, "osfleet:agentToken", auto.ConfigValue(value or secrets.token_hex(16), secret=True))
    click.echo(f"osfleet:agentToken set (secret) on stack {stack_name}", err=True)
