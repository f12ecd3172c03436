"""The k8s lab's binaries: built from the Go module proxy by the checkout's ``scripts/build-k8s`` once per machine
(cached under ``$OSFLEET_TOOLS``) and found through it, so the folder always matches the checkout's pins."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from osfleet.checkout import project_dir
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
    proc = subprocess.Popen(
        [str(_script()), part], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, process_group=0,
        env={**os.environ},
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            say(line.rstrip("\n"))
        proc.wait()
    except BaseException:
        import signal

        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        raise
    if proc.returncode != 0:
        raise CommandFailedError(f"scripts/build-k8s {part} failed (exit {proc.returncode}); its log is named above")
    return bin_dir(part)
