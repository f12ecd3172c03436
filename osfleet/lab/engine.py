"""The Pulumi engine built on this machine (scripts/build-pulumi) and the stacks of the project's program.

Programs run through the Automation API as inline programs: the engine (the real ``pulumi`` binary) reaches
the program's language runtime inside this process (``pulumi up --client``). The stand-alone Python language
host is not built here (its Go module is not served by this machine's module proxy). State is a local file
backend under ``$OSFLEET_HOME/pulumi``; secrets use the passphrase file ``scripts/setup`` made.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from osfleet.config import Settings
from osfleet.errors import ConfigError, MissingToolError

PROJECT = "osfleet"
STACKS = ("lab", "onprem", "aws", "k8s")


def sdk_version() -> str:
    """The Python SDK's version; the engine is built at the same one."""
    return importlib.metadata.version("pulumi")


def engine_root(settings: Settings | None = None) -> Path:
    """Folder holding ``bin/pulumi`` (as scripts/build-pulumi installs it)."""
    s = settings or Settings.from_env()
    tools = Path(os.environ.get("OSFLEET_TOOLS", str(s.home / "tools")))
    return tools / f"pulumi-v{sdk_version()}"


def engine_version(root: Path | None = None) -> str:
    """``pulumi vX.Y.Z`` from the real binary."""
    binary = (root or engine_root()) / "bin" / "pulumi"
    if not binary.exists():
        raise MissingToolError("pulumi", None, where=f"{binary.parent} (run scripts/build-pulumi)")
    out = subprocess.run([str(binary), "version"], capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        raise ConfigError(f"{binary} version failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return f"pulumi {out.stdout.strip()}"


def project_dir() -> Path:
    """The checkout holding Pulumi.yaml and infra/ ($OSFLEET_PROJECT, else the one osfleet is installed from)."""
    candidates = [Path(p) for p in [os.environ.get("OSFLEET_PROJECT", "")] if p]
    candidates.append(Path(__file__).resolve().parents[2])
    for c in candidates:
        if (c / "Pulumi.yaml").is_file() and (c / "infra" / "osfleet_infra").is_dir():
            return c
    raise ConfigError("no Pulumi project (Pulumi.yaml + infra/) found; set OSFLEET_PROJECT to the osfleet checkout")


def engine_env(settings: Settings | None = None) -> dict[str, str]:
    """Environment of an offline engine: local state, passphrase secrets, no update checks or plugin downloads."""
    s = settings or Settings.from_env()
    state = s.home / "pulumi"
    passphrase = state / "passphrase"
    if not passphrase.is_file():
        raise ConfigError(f"no Pulumi passphrase file {passphrase} (scripts/setup makes it)")
    for d in (state / "state", state / "home"):
        d.mkdir(parents=True, exist_ok=True)
    venv = Path(sys.executable).parent.parent
    path = os.pathsep.join([str(engine_root(s) / "bin"), str(venv / "bin"), os.environ.get("PATH", "")])
    return {
        "PULUMI_BACKEND_URL": f"file://{state / 'state'}",
        "PULUMI_HOME": str(state / "home"),
        "PULUMI_CONFIG_PASSPHRASE_FILE": str(passphrase),
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_RUNTIME_VIRTUALENV": str(venv),
        # The dynamic-provider process imports the pickled providers from the program's package.
        "PYTHONPATH": os.pathsep.join(p for p in [str(project_dir() / "infra"), os.environ.get("PYTHONPATH", "")] if p),
        "PATH": path,
    }


def stack(name: str, settings: Settings | None = None, work_dir: Path | None = None) -> Any:
    """The Automation API stack ``name`` of the project, created on first use, with the inline program.

    ``work_dir`` (default: the checkout) is where the engine reads and writes ``Pulumi.<stack>.yaml``; a
    benchmark passes a folder of its own so it never touches the checkout's stack files.
    """
    from pulumi import automation as auto

    if work_dir is None and name not in STACKS:
        raise ConfigError(f"unknown stack {name!r}; one of {', '.join(STACKS)}")
    root = engine_root(settings)
    engine_version(root)
    env = engine_env(settings)
    project = project_dir()
    infra = str(project / "infra")
    if infra not in sys.path:
        sys.path.insert(0, infra)
    os.environ.update(env)  # the inline program and the engine see the same environment
    from osfleet_infra.program import run

    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        # The program is inline: the folder only holds the project's name and runtime and the stack file.
        (work_dir / "Pulumi.yaml").write_text(f"name: {PROJECT}\nruntime: python\n")
    opts = auto.LocalWorkspaceOptions(
        work_dir=str(work_dir or project),
        pulumi_home=env["PULUMI_HOME"],
        env_vars=env,
        secrets_provider="passphrase",
        pulumi_command=auto.PulumiCommand(root=str(root), version=None, skip_version_check=True),
    )
    return call(auto.create_or_select_stack, stack_name=name, project_name=PROJECT, program=run, opts=opts)


_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception)): (.+)$")
_GENERIC = ("update failed", "preview failed", "destroy failed", "an unhandled error occurred", "one or more errors")


def engine_error(exc: Exception) -> str:
    """The one line of an engine failure a user can act on (the resource's or the program's own error)."""
    parts = [str(getattr(exc, attr, "") or "") for attr in ("stdout", "stderr")] + [str(exc)]
    text = "\n".join(p for p in parts if p)
    # A dynamic provider's failure arrives as a Python traceback: its last line names the error and says why.
    raised = [(ln.strip(), m) for ln in text.splitlines() if (m := _EXCEPTION_LINE.match(ln.strip()))]
    if raised:  # osfleet's own errors read as sentences; anything else keeps its type for the bug report
        line, m = raised[-1]
        return m.group(2) if line.startswith("osfleet.") else f"{m.group(1)}: {m.group(2)}"
    found = []
    for line in text.splitlines():
        s = line.strip().removeprefix("stderr:").strip()
        if s.startswith("error:"):
            msg = s.removeprefix("error:").strip()
            if msg and not any(g in msg.lower() for g in _GENERIC):
                found.append(msg)
    if found:
        return found[0]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__


class EngineError(ConfigError):
    """A failed preview/up/destroy, reduced to its one actionable line."""


def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run an Automation API call; engine failures become an ``EngineError`` with one line."""
    from pulumi.automation.errors import CommandError

    try:
        return fn(*args, **kwargs)
    except CommandError as exc:
        raise EngineError(engine_error(exc)) from None


def stack_files(name: str, settings: Settings | None = None) -> list[Path]:
    """The file backend's files of stack ``name`` (checkpoint, its backups and update history)."""
    base = (settings or Settings.from_env()).home / "pulumi" / "state" / ".pulumi"
    found = sorted((base / "stacks" / PROJECT).glob(f"{name}.json*"))
    found += [d for d in (base / "backups" / PROJECT / name, base / "history" / PROJECT / name) if d.exists()]
    return found


def purge_stack_files(name: str, settings: Settings | None = None) -> int:
    """Remove what the engine keeps of a removed throwaway stack (backups, history); return how many."""
    import shutil

    files = stack_files(name, settings)
    for f in files:
        shutil.rmtree(f) if f.is_dir() else f.unlink()
    return len(files)
