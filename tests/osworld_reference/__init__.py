"""The differential check of osfleet's OSWorld metrics against OSWorld's own functions.

``Reference`` runs ``reference.py`` in the reference virtualenv (``scripts/setup-osworld-reference``) as one
long-lived child process and asks it to score; tests compare its answers with osfleet's on the same files.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SETUP = HERE.parent.parent / "scripts" / "setup-osworld-reference"


def reference_python() -> Path:
    """The reference environment's python, installed on first use (a few minutes, once per machine; its progress
    goes to stderr), as scripts/setup no longer does."""
    out = subprocess.run([str(SETUP), "--print-python"], stdout=subprocess.PIPE, text=True, check=True, timeout=1800)
    return Path(out.stdout.strip())


class ReferenceError(RuntimeError):
    """OSWorld's function raised instead of scoring (its behaviour on that input)."""


class StandInCalled(RuntimeError):
    """OSWorld's function used a package that is not installed here: the reference could not run it."""


class Reference:
    """OSWorld's metric functions in a child process of the reference environment."""

    def __init__(self, python: Path | None = None, shims: tuple[str, ...] = (), source: Path | None = None) -> None:
        """``shims``: imports to satisfy with ``shim_<name>.py`` of this folder instead of an empty stand-in;
        ``source``: a folder with OSWorld's ``desktop_env/`` to load instead of the release's (its main branch)."""
        python = python or reference_python()
        if not python.exists():
            raise FileNotFoundError(f"{python}: scripts/setup-osworld-reference did not install it")
        env = {
            **os.environ,
            "PYTHONPATH": "",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OSWORLD_REFERENCE_SHIMS": ",".join(shims),
            "OSWORLD_REFERENCE_SOURCE": str(source or ""),
        }
        # OSWorld's functions write beside themselves (vscode.compare_zip_files leaves temp.pdf in the working
        # directory): give the child a folder of its own.
        self._workdir = tempfile.TemporaryDirectory(prefix="osworld-reference-")
        self._proc = subprocess.Popen(
            [str(python), str(HERE / "reference.py")],
            cwd=self._workdir.name,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def score(self, module: str, func: str, *args: Any, **kwargs: Any) -> float:
        """OSWorld's ``metrics.<module>.<func>(*args, **kwargs)``; raises ``ReferenceError`` when it raised,
        ``StandInCalled`` when it needed a package this machine lacks."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps({"module": module, "func": func, "args": args, "kwargs": kwargs}) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the reference process exited ({self._proc.wait()})")
        answer = json.loads(line)
        if "stand_in" in answer:
            raise StandInCalled(f"{module}.{func} used stand-ins: {', '.join(answer['stand_in'])}")
        if "error" in answer:
            raise ReferenceError(answer["error"])
        return float(answer["score"])

    def close(self) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        self._proc.wait(timeout=30)
        if self._proc.stdout:
            self._proc.stdout.close()
        self._workdir.cleanup()
