"""The source checkout osfleet runs from, for the tools that need more than the installed package: the Pulumi
program (``infra/``), the build scripts (``scripts/``, run here by the commands that need a tool on its first use),
the sources a wheel is built from."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from osfleet.errors import CommandFailedError, ConfigError


def project_dir() -> Path:
    """The checkout holding Pulumi.yaml and infra/ ($OSFLEET_PROJECT, else the one osfleet is installed from)."""
    candidates = [Path(p) for p in [os.environ.get("OSFLEET_PROJECT", "")] if p]
    candidates.append(Path(__file__).resolve().parents[1])
    for c in candidates:
        if (c / "Pulumi.yaml").is_file() and (c / "infra" / "osfleet_infra").is_dir():
            return c
    raise ConfigError("no Pulumi project (Pulumi.yaml + infra/) found; set OSFLEET_PROJECT to the osfleet checkout")


def run_build_script(
    script: str, args: list[str], say: Callable[[str], None], env: dict[str, str] | None = None
) -> None:
    """Run the checkout's ``scripts/<script> ARGS`` (a tool built on first use: the Pulumi engine, the Kubernetes
    binaries), each line it prints going to ``say`` as it comes, so a build of minutes shows its progress.

    Interrupted (Ctrl-C, SIGTERM), the script's whole process group is ended, its compilers with it, and waited
    for; a failure raises ``CommandFailedError`` naming the script (its own last lines, said above, tell why)."""
    with subprocess.Popen(
        [str(project_dir() / "scripts" / script), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, process_group=0, env={**os.environ, **(env or {})},
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                say(line.rstrip("\n"))
            proc.wait()
        except BaseException:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            raise
    if proc.returncode != 0:
        raise CommandFailedError(f"scripts/{script} {' '.join(args)} failed (exit {proc.returncode}); its log is above")
