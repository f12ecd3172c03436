"""The source checkout osfleet runs from, for the tools that need more than the installed package: the Pulumi
program (``infra/``), the build scripts (``scripts/``), the sources a wheel is built from."""

from __future__ import annotations

import os
from pathlib import Path

from osfleet.errors import ConfigError


def project_dir() -> Path:
    """The checkout holding Pulumi.yaml and infra/ ($OSFLEET_PROJECT, else the one osfleet is installed from)."""
    candidates = [Path(p) for p in [os.environ.get("OSFLEET_PROJECT", "")] if p]
    candidates.append(Path(__file__).resolve().parents[1])
    for c in candidates:
        if (c / "Pulumi.yaml").is_file() and (c / "infra" / "osfleet_infra").is_dir():
            return c
    raise ConfigError("no Pulumi project (Pulumi.yaml + infra/) found; set OSFLEET_PROJECT to the osfleet checkout")
