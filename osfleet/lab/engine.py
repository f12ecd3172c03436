"""The Pulumi engine built on this machine (scripts/build-pulumi) and the stacks of the project's program.

The plain ``pulumi`` CLI runs the project's program through osfleet's Python language host
(``osfleet.lab.language_host``, installed next to the engine): ``engine_env()`` is the environment it needs
(``osfleet infra env`` prints it for a user's shell) and ``run_cli()`` runs it in the project's root, as a
user would. ``stack()`` keeps the Automation API's inline programs for throwaway stacks in folders of their
own (``osfleet bench infra``, tests). State is a local file backend under ``$OSFLEET_HOME/pulumi``; secrets
use the passphrase file ``scripts/setup`` made.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from osfleet.checkout import project_dir as project_dir  # where it always was importable
from osfleet.checkout import run_build_script
from osfleet.config import Settings
from osfleet.errors import ConfigError, MissingToolError, OsfleetError
from osfleet.lab.kube import tools

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


BUILD_TIME = "5-12 minutes on 2 cores"  # docs/benchmarks/2026-12-01-deployment.md: 322 s idle, 726 s on a busy machine


def ensure_engine(settings: Settings | None = None, say: Callable[[str], None] | None = None) -> Path:
    """The engine's root (``engine_root``), built first when this machine has none: the commands that drive Pulumi
    build it on their first use (``scripts/build-pulumi``, from the Go module proxy, once per machine and version)
    instead of every set-up, which neither the quick start nor an agent's episode needs. Progress lines go to
    ``say`` (default: stderr)."""
    s = settings or Settings.from_env()
    passphrase_file(s)  # a machine set-up never ran on is told so before minutes of building
    root = engine_root(s)
    if not (root / "bin" / "pulumi").exists():
        speak = say or (lambda line: print(line, file=sys.stderr, flush=True))
        speak(f"osfleet: building the Pulumi engine v{sdk_version()} on its first use on this machine "
              f"(scripts/build-pulumi, {BUILD_TIME}; once per machine)")  # fmt: skip
        run_build_script("build-pulumi", [], speak, env={"OSFLEET_HOME": str(s.home)})
    engine_version(root)
    return root


def engine_version(root: Path | None = None) -> str:
    """``pulumi vX.Y.Z`` from the real binary."""
    binary = (root or engine_root()) / "bin" / "pulumi"
    if not binary.exists():
        raise MissingToolError("pulumi", None, where=f"{binary.parent} (run scripts/build-pulumi)")
    out = subprocess.run([str(binary), "version"], capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        raise ConfigError(f"{binary} version failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return f"pulumi {out.stdout.strip()}"


NO_SESSION_BUS = "disabled:"


def session_bus_env() -> dict[str, str]:
    """Where no D-Bus session bus is set, one that cannot be reached.

    The engine asks the desktop's keyring (go-keyring, over the session bus) for its passphrase; with no bus
    address set, godbus starts a session bus of its own with ``dbus-launch``, a daemon that outlives the
    command: each preview, up or destroy left one behind (51 after one test run). An unreachable address makes
    that lookup fail at once, and the engine goes on with the passphrase file. A user's own bus is kept."""
    return {} if os.environ.get("DBUS_SESSION_BUS_ADDRESS") else {"DBUS_SESSION_BUS_ADDRESS": NO_SESSION_BUS}


def passphrase_file(settings: Settings) -> Path:
    """The file of the engine's secrets passphrase, which scripts/setup makes (never committed)."""
    passphrase = settings.home / "pulumi" / "passphrase"
    if not passphrase.is_file():
        raise ConfigError(f"no Pulumi passphrase file {passphrase} (scripts/setup makes it)")
    return passphrase


def engine_env(settings: Settings | None = None, path: str | None = None) -> dict[str, str]:
    """Environment of the plain ``pulumi`` CLI here: the engine and our language host first on ``PATH``,
    local state, passphrase secrets, no update checks or plugin downloads, and the osfleet Python that the
    language host shim runs with (``OSFLEET_PYTHON``). ``path``: the ``PATH`` to put the engine in front of
    (default: this process's)."""
    s = settings or Settings.from_env()
    state = s.home / "pulumi"
    passphrase = passphrase_file(s)
    for d in (state / "state", state / "home"):
        d.mkdir(parents=True, exist_ok=True)
    first = [str(engine_root(s) / "bin"), *kubernetes_bins()]
    rest = [p for p in (os.environ.get("PATH", "") if path is None else path).split(os.pathsep) if p and p not in first]
    return {
        "PATH": os.pathsep.join([*first, *rest]),
        **kubeconfig_env(s),
        "OSFLEET_HOME": str(s.home),
        "OSFLEET_PYTHON": sys.executable,
        "PULUMI_HOME": str(state / "home"),
        "PULUMI_BACKEND_URL": f"file://{state / 'state'}",
        "PULUMI_CONFIG_PASSPHRASE_FILE": str(passphrase),
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        **session_bus_env(),
    }


def kubernetes_bins() -> list[str]:
    """Where scripts/build-k8s puts kubectl and the pulumi-kubernetes provider plugin (built or not yet), for the
    engine to find the provider on PATH as Pulumi documents; empty without a checkout to ask."""
    try:
        return [str(tools.bin_dir("kubectl")), str(tools.bin_dir("provider"))]
    except (ConfigError, OsfleetError, OSError):
        return []


def kubeconfig_env(settings: Settings) -> dict[str, str]:
    """``KUBECONFIG`` of this machine's k8s lab (``osfleet lab k8s up``), unless the caller already names one."""
    if os.environ.get("KUBECONFIG"):
        return {}
    from osfleet.lab.kube.state import lab_root

    return {"KUBECONFIG": str(lab_root(settings) / "admin.kubeconfig")}


def _inline_env(settings: Settings | None = None) -> dict[str, str]:
    """``engine_env`` plus what an inline program's dynamic providers need: no Pulumi.yaml of the project
    names their virtualenv, and they import the pickled providers from the program's package."""
    venv = Path(sys.executable).parent.parent
    return {
        **engine_env(settings),
        "PULUMI_RUNTIME_VIRTUALENV": str(venv),
        "PYTHONPATH": os.pathsep.join(p for p in [str(project_dir() / "infra"), os.environ.get("PYTHONPATH", "")] if p),
    }


def run_cli(
    args: list[str],
    settings: Settings | None = None,
    capture: bool = False,
    stdin: str | None = None,
    echo: Callable[[str], None] | None = None,
    timeout: float | None = None,
    cwd: Path | None = None,
) -> str:
    """``pulumi ARGS`` in the project's root (or ``cwd``) with ``engine_env``, as a user types it.

    Its output is returned when ``capture``, else each line goes to ``echo`` (default: stderr) as it comes.
    A failure raises ``EngineError`` with the one line a user can act on. The engine is built on first use."""
    root = ensure_engine(settings, echo)
    env = {**os.environ, **engine_env(settings)}
    cmd = [str(root / "bin" / "pulumi"), *args]
    say = echo or (lambda line: print(line, file=sys.stderr, flush=True))
    proc = subprocess.Popen(
        cmd,
        cwd=cwd or project_dir(),
        env=env,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if not capture else subprocess.PIPE,
        text=True,
        process_group=0,  # a terminal's Ctrl-C reaches us only; _interrupt passes it on once
    )
    lines: list[str] = []
    try:
        if capture:
            out, err = proc.communicate(stdin, timeout=timeout)
            lines = (out or "").splitlines() + (err or "").splitlines()
        else:
            if stdin is not None and proc.stdin is not None:
                proc.stdin.write(stdin)
                proc.stdin.close()
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                say(line.rstrip("\n"))
            proc.wait(timeout=timeout)
            out = "\n".join(lines)
    except BaseException:  # Ctrl-C, SIGTERM, a timeout: the engine is interrupted as Ctrl-C would, then waited for
        _interrupt(proc)
        raise
    if proc.returncode != 0:
        raise EngineError(engine_error(subprocess.CalledProcessError(proc.returncode, cmd, "\n".join(lines))))
    return out


def _interrupt(proc: subprocess.Popen[str]) -> None:
    """What a user's Ctrl-C does to ``pulumi``: it cancels and records what it did; a second one, 60 s later,
    terminates it."""
    import signal

    for sig, wait in ((signal.SIGINT, 60.0), (signal.SIGINT, 30.0)):
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def stack(name: str, settings: Settings | None = None, work_dir: Path | None = None) -> Any:
    """The Automation API stack ``name`` of the project, created on first use, with the inline program.

    ``work_dir`` (default: the checkout) is where the engine reads and writes ``Pulumi.<stack>.yaml``; a
    benchmark passes a folder of its own so it never touches the checkout's stack files.
    """
    from pulumi import automation as auto

    if work_dir is None and name not in STACKS:
        raise ConfigError(f"unknown stack {name!r}; one of {', '.join(STACKS)}")
    root = ensure_engine(settings)
    env = _inline_env(settings)
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
