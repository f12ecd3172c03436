"""The ``osfleet`` command line: a thin root that mounts each area's commands from beside its code.

Every error a user can cause ends in one line on stderr and a non-zero exit (``cli_support.friendly``);
SIGTERM and SIGHUP are turned into the same interrupt as Ctrl-C, so every command's clean-up runs whichever
way it is stopped.
"""

from __future__ import annotations

import importlib
import sys

import click

from osfleet import __version__, logs
from osfleet.cli_support import interrupt_on_signals

# Each command, imported only when it is used: a client-only install (``pip install osfleet``) has the client's
# packages alone, so a host's commands must not be imported to run ``osfleet mcp serve`` or print the help.
COMMANDS = {
    "image": "osfleet.imaging.cli:image",
    "disk": "osfleet.imaging.cli:disk",
    "accel": "osfleet.imaging.cli:accel_cmd",
    "bench": "osfleet.bench.cli:bench",
    "replicas": "osfleet.replicas.cli:replicas",
    "checkpoints": "osfleet.replicas.cli:checkpoints",
    "host": "osfleet.api.cli:host",
    "fleet": "osfleet.fleet.cli:fleet",
    "tasks": "osfleet.tasks.cli:tasks",
    "report": "osfleet.report.cli:report_cmd",
    "lab": "osfleet.lab.cli:lab",
    "infra": "osfleet.lab.infra_cli:infra",
    "chaos": "osfleet.chaos.cli:chaos",
    "plan": "osfleet.plan:plan_cmd",
    "trajectories": "osfleet.recording.cli:trajectories",
    "openenv": "osfleet.openenv.cli:openenv",
    "mcp": "osfleet.mcp.cli:mcp",
    "e2b": "osfleet.e2b.cli:e2b",
    "cua": "osfleet.cua.cli:cua",
}
# Which extra brings a package a command imports (everything else comes with the "host" extra).
EXTRA_OF = {
    "mcp": "mcp",
    "gymnasium": "client",
    "numpy": "client",
    "openenv": "sdk",
    "pulumi": "infra",
    "pulumi_aws": "infra",
    "pulumi_kubernetes": "infra",
    "locust": "loadtest",
    "matplotlib": "reports",
    "pyarrow": "parquet",
    "e2b": "e2b",
    "connectrpc": "e2b",
    "protobuf": "e2b",
}


class LazyGroup(click.Group):
    """The root group: commands are listed from ``COMMANDS`` and imported when asked for.

    ``commands`` still answers what click's own ``Group.commands`` does (every command, loaded) for the tools that
    walk a click tree instead of calling ``list_commands`` (documentation generators, checks of the docs): reading
    it imports every command this install has; running one command imports only that one.
    """

    @property  # type: ignore[override]
    def commands(self) -> dict[str, click.Command]:
        ctx = click.Context(self)
        loaded = {name: self.get_command(ctx, name) for name in self.list_commands(ctx)}
        return {name: command for name, command in loaded.items() if command is not None}

    @commands.setter
    def commands(self, value: dict[str, click.Command]) -> None:
        self._added = dict(value)  # click.Group.__init__ assigns the commands given to it

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        name = name or cmd.name
        assert name, "a command added to the root needs a name"
        self._added[name] = cmd

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*COMMANDS, *sorted(name for name in self._added if name not in COMMANDS)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = COMMANDS.get(cmd_name)
        if spec is None:  # one added with cli.add_command
            return self._added.get(cmd_name)
        module, attribute = spec.split(":")
        try:
            loaded = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").split(".")[0]
            if not missing or missing == "osfleet":
                raise
            return _not_installed(cmd_name, missing)
        command = getattr(loaded, attribute)
        assert isinstance(command, click.Command)
        return command

    def invoke(self, ctx: click.Context) -> object:
        """A command that imports a package this install lacks (most import what they need when they run) ends
        in one line naming the extra that brings it."""
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").split(".")[0]
            if not missing or missing == "osfleet":
                raise
            click.echo(f"osfleet: error: {_needs(missing)}", err=True)
            sys.exit(1)


def _needs(package: str) -> str:
    extra = EXTRA_OF.get(package, "host")
    return f"needs the '{extra}' extra (no module {package}): pip install 'osfleet[{extra}]'"


def _not_installed(name: str, package: str) -> click.Command:
    """A stand-in for a command whose packages this install lacks: it says which extra brings them."""
    why = _needs(package)

    @click.command(name, help=f"(not installed: {why})", context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def stand_in(args: tuple[str, ...]) -> None:
        click.echo(f"osfleet: error: {why}", err=True)
        sys.exit(1)

    return stand_in


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="osfleet")
@click.option(
    "--log-level",
    type=click.Choice(logs.LEVELS, case_sensitive=False),
    envvar=logs.ENV_VAR,
    default=logs.DEFAULT_LEVEL,
    show_default=True,
    show_envvar=True,
    help="log records at this level and above go to stderr",
)
def cli(log_level: str) -> None:
    """osfleet: fleets of copy-on-write desktop VM replicas for computer-use agents."""
    logs.configure(log_level)


def main() -> None:
    interrupt_on_signals()
    cli(prog_name="osfleet")
