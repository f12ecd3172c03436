"""The ``osfleet`` command line: a thin root that mounts each area's commands from beside its code.

Every error a user can cause ends in one line on stderr and a non-zero exit (``cli_support.friendly``);
SIGTERM and SIGHUP are turned into the same interrupt as Ctrl-C, so every command's clean-up runs whichever
way it is stopped.
"""

from __future__ import annotations

import click

from osfleet import __version__, logs
from osfleet.api.cli import host
from osfleet.bench.cli import bench
from osfleet.chaos.cli import chaos
from osfleet.cli_support import interrupt_on_signals
from osfleet.fleet.cli import fleet
from osfleet.imaging.cli import accel_cmd, disk, image
from osfleet.lab.cli import lab
from osfleet.lab.infra_cli import infra
from osfleet.openenv.cli import openenv
from osfleet.plan import plan_cmd
from osfleet.recording.cli import trajectories
from osfleet.replicas.cli import replicas
from osfleet.report.cli import report_cmd
from osfleet.tasks.cli import tasks


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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


for command in (
    image,
    disk,
    accel_cmd,
    bench,
    replicas,
    host,
    fleet,
    tasks,
    report_cmd,
    lab,
    infra,
    chaos,
    plan_cmd,
    trajectories,
    openenv,
):
    cli.add_command(command)


def main() -> None:
    interrupt_on_signals()
    cli(prog_name="osfleet")
