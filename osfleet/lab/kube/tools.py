"""The k8s lab's binaries: built from the Go module proxy by the checkout's ``scripts/build-k8s`` once per machine
(cached under ``$OSFLEET_TOOLS``) and found through it, so the folder always matches the checkout's pins."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from osfleet.checkout import project_dir, run_build_script
from osfleet.errors import CommandFailedError

PARTS = ("cluster", "provider")


def _script() -> Path:
    return project_dir() / "scripts" / "build-k8s"


def bin_dir(part: str) -> Path:
    """The folder the part's binaries are (or will be) installed in."""
    done = subprocess.run([str(_script()), "--print-bin", part], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        why = (done.stderr.strip() or "?").splitlines()[-1]
        raise CommandFailedError(f"scripts/build-k8s --print-bin {part}: {why}")
    return Path(done.stdout.strip())


def built(part: str) -> bool:
    binary = "pulumi-resource-kubernetes" if part == "provider" else "osfleet-k8s"
    return (bin_dir(part) / binary).is_file()


def build(part: str, say: Callable[[str], None]) -> Path:
    """Build ``part`` (cluster or provider) unless built; its progress lines go to ``say``. Interrupted, the build's
    process group is ended (its Go compilers with it)."""
    if built(part):
        return bin_dir(part)
    run_build_script("build-k8s", [part], say)
    return bin_dir(part)
