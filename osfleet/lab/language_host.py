"""``pulumi-language-python``: osfleet's Python language host for the Pulumi engine built here.

Pulumi's own host is a Go program whose module the Go proxy does not serve, so without this the plain
``pulumi`` CLI cannot run a Python program on this machine. This host speaks the same ``LanguageRuntime``
gRPC service, on the stubs the ``pulumi`` SDK ships, and behaves as Pulumi's does where users can tell:

- The engine starts the executable it finds next to itself (``scripts/build-pulumi`` writes a shim there that
  runs this module) with its own gRPC address as the last argument, and reads the port from our first line
  of stdout. Everything else we print goes to stderr, which the engine shows.
- ``Run`` starts the program in a child process (``osfleet/lab/program_runner.py``) with the Python of the
  project's virtualenv (``runtime.options.virtualenv`` in ``Pulumi.yaml``, relative to the project root), so
  the program's imports and crashes never touch the host. The child inherits our stdout/stderr, which the
  engine streams to the user. Exit code 32 means "the error was already reported" (the engine then prints
  that one line and nothing else); any other failure becomes the run's error.
- ``Cancel`` (and an engine that hangs up on ``Run``) interrupts the program with SIGINT, then kills it
  after ``CANCEL_GRACE_SECONDS``. When the engine itself goes away (our parent changes) the host stops the
  program and exits, so nothing outlives a killed ``pulumi``.
- ``InstallDependencies`` (``pulumi install``) makes the virtualenv if it is missing and installs the
  program folder's ``requirements.txt`` into it, streaming pip's output.
- ``GetRequiredPackages``/``GetRequiredPlugins`` list the Pulumi provider packages installed in the
  virtualenv (a ``pulumi-plugin.json`` with ``resource: true``, or a ``pulumi-*`` name), as Pulumi's host
  does; ``GetProgramDependencies`` and ``About`` answer from the same virtualenv (``pulumi about``).

Only pip-style virtualenvs are supported (``toolchain: pip`` or none); ``poetry``/``uv`` toolchains and
``typechecker`` are refused with a message, as is running Python *plugins* (``RunPlugin``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import empty_pb2, json_format
from pulumi.runtime.proto import language_pb2, language_pb2_grpc, plugin_pb2

log = logging.getLogger("osfleet.language_host")

RUNNER = Path(__file__).with_name("program_runner.py")
REPORTED = 32  # the program already sent its error to the engine (program_runner.REPORTED)
CANCEL_GRACE_SECONDS = 5.0
PARENT_POLL_SECONDS = 1.0
# Packages named pulumi-* that have no provider plugin (as in Pulumi's own host).
NOT_PROVIDERS = {"pulumi", "pulumi-policy", "pulumi-esc-sdk"}

# Run in the program's virtualenv: each installed distribution with its pulumi-plugin.json, if it has one.
_LIST_PACKAGES = r"""
import importlib.metadata as md, json
out = []
for d in md.distributions():
    name = (d.metadata["Name"] or "").lower().replace("_", "-")
    plugin = None
    for f in d.files or []:
        if f.name == "pulumi-plugin.json" and len(f.parts) == 2:
            try:
                plugin = json.loads(f.locate().read_text())
            except (OSError, ValueError):
                plugin = None
            break
    out.append({"name": name, "version": d.version, "plugin": plugin})
print(json.dumps(out))
"""
_PEP440 = re.compile(r"^(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.post(\d+))?(?:\.dev(\d+))?$")


class HostError(Exception):
    """A request the host cannot serve; its message goes back to the engine as the RPC's error."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Program:
    """Where a program is and which Python runs it, from the engine's ``ProgramInfo``."""

    root: Path
    directory: Path
    entry_point: str
    virtualenv: Path | None  # absolute; None: the ambient python3

    @classmethod
    def from_info(cls, info: Any) -> Program:
        options = json_format.MessageToDict(info.options) if info.HasField("options") else {}
        toolchain = options.get("toolchain", "pip")
        if toolchain != "pip":
            raise HostError(f"runtime option toolchain: {toolchain!r} is not supported by osfleet's host (only pip)")
        if options.get("typechecker"):
            raise HostError("runtime option typechecker is not supported by osfleet's language host")
        venv = options.get("virtualenv")
        if venv is not None and not isinstance(venv, str):
            raise HostError("runtime option virtualenv must be a string (a folder, relative to Pulumi.yaml)")
        root = Path(info.root_directory or info.program_directory or ".").absolute()
        return cls(
            root=root,
            directory=Path(info.program_directory or root).absolute(),
            entry_point=info.entry_point or ".",
            virtualenv=(root / venv) if venv else None,
        )

    @property
    def python(self) -> str:
        if self.virtualenv is None:
            found = shutil.which(os.environ.get("PULUMI_PYTHON_CMD", "python3"))
            if found is None:
                raise HostError("no python3 on PATH (or set runtime.options.virtualenv in Pulumi.yaml)")
            return found
        return str(self.virtualenv / "bin" / "python")

    def require_venv(self) -> None:
        if self.virtualenv is not None and not (self.virtualenv / "bin" / "python").is_file():
            raise HostError(
                f"the virtualenv {self.virtualenv} (runtime.options.virtualenv in Pulumi.yaml) does not exist; "
                "run 'pulumi install' to make it"
            )

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a command in the virtualenv, as ``activate`` would set it."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONHOME"}
        if self.virtualenv is not None:
            env["VIRTUAL_ENV"] = str(self.virtualenv)
            env["PATH"] = os.pathsep.join([str(self.virtualenv / "bin"), env.get("PATH", "")])
        return {**env, **(extra or {})}

    def output(self, *args: str, timeout: float = 120) -> str:
        """Run this Python with ``args``; its stdout, or a ``HostError`` with the last line of stderr."""
        self.require_venv()
        done = subprocess.run(
            [self.python, *args], capture_output=True, text=True, timeout=timeout, env=self.env(), check=False
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            raise HostError(f"{self.python} {' '.join(args[:3])}: {last}", grpc.StatusCode.UNKNOWN)
        return done.stdout


def plugin_version(version: str) -> str | None:
    """A Python package version as the plugin's semver (``1.2.3a4`` -> ``v1.2.3-alpha.4``), or None."""
    m = _PEP440.match(version)
    if not m:
        return None
    parts = (m.group(1).split(".") + ["0", "0"])[: max(3, len(m.group(1).split(".")))]
    out = ".".join(parts)
    if m.group(2):
        out += f"-{ {'a': 'alpha', 'b': 'beta', 'rc': 'rc'}[m.group(2)] }.{m.group(3)}"
    build = "".join(f"{k}{v}" for k, v in (("post", m.group(4)), ("dev", m.group(5))) if v)
    return f"v{out}" + (f"+{build}" if build else "")


def required_packages(program: Program) -> list[plugin_pb2.PackageDependency]:
    """The provider plugins the program's virtualenv brings (Pulumi's host reports the same)."""
    found = json.loads(program.output("-c", _LIST_PACKAGES))
    out = []
    for pkg in found:
        plugin = pkg["plugin"] or {}
        if pkg["name"] in NOT_PROVIDERS or (not plugin and not pkg["name"].startswith("pulumi-")):
            continue
        if plugin and not plugin.get("resource", False):
            continue
        version = plugin.get("version") or plugin_version(pkg["version"])
        if not version:
            continue
        out.append(
            plugin_pb2.PackageDependency(
                name=plugin.get("name") or pkg["name"].removeprefix("pulumi-"),
                version=version if version.startswith("v") else f"v{version}",
                kind="resource",
                server=plugin.get("server", ""),
            )
        )
    return out


def _stream(cmd: list[str], env: dict[str, str], cwd: Path) -> Iterator[tuple[str, bytes]]:
    """Run ``cmd``, yielding ("stdout"|"stderr", line) as they come; raises ``HostError`` on failure."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    lines: queue.Queue[tuple[str, bytes] | None] = queue.Queue()

    def pump(name: str, pipe: Any) -> None:
        for line in iter(pipe.readline, b""):
            lines.put((name, line))
        lines.put(None)

    for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
        threading.Thread(target=pump, args=(name, pipe), daemon=True).start()
    open_pipes, tail = 2, b""
    try:
        while open_pipes:  # (both pipes at their end: the command is exiting by itself)
            item = lines.get()
            if item is None:
                open_pipes -= 1
                continue
            if item[0] == "stderr" and item[1].strip():
                tail = item[1]
            yield item
    finally:  # the caller stopped listening (the engine hung up, Ctrl-C): the command goes too
        if open_pipes and proc.poll() is None:
            proc.terminate()
            proc.wait()
    if proc.wait() != 0:
        raise HostError(f"{' '.join(cmd[:4])} failed: {tail.decode(errors='replace').strip()}", grpc.StatusCode.UNKNOWN)


class Runs:
    """The program children alive now, so that Cancel and the host's own exit can stop them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen[bytes]] = set()
        self.cancelled = threading.Event()

    def add(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.add(proc)

    def remove(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.discard(proc)

    def stop_all(self) -> None:
        with self._lock:
            procs = list(self._procs)
        for p in procs:
            stop_child(p)


def stop_child(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT (the program may clean up), then SIGKILL after ``CANCEL_GRACE_SECONDS``."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=CANCEL_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except ProcessLookupError:
        pass


def _rpc(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A ``HostError`` becomes the RPC's status and message, which the engine prints as ``error: ...``."""

    def wrapper(self: LanguageHost, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except HostError as exc:
            context.abort(exc.code, str(exc))

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


class LanguageHost(language_pb2_grpc.LanguageRuntimeServicer):
    """The ``LanguageRuntime`` service for Python programs (see the module's docstring)."""

    def __init__(self, engine_address: str = "", tracing: str = "") -> None:
        self.engine_address = engine_address
        self.tracing = tracing
        self.runs = Runs()

    def Handshake(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC's names)
        self.engine_address = request.engine_address or self.engine_address
        return language_pb2.LanguageHandshakeResponse()

    def GetPluginInfo(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return plugin_pb2.PluginInfo(version=importlib.metadata.version("pulumi"))

    @_rpc
    def GetRequiredPackages(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return language_pb2.GetRequiredPackagesResponse(packages=required_packages(Program.from_info(request.info)))

    @_rpc
    def GetRequiredPlugins(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        pkgs = required_packages(Program.from_info(request.info))
        plugins = [plugin_pb2.PluginDependency(name=p.name, kind=p.kind, version=p.version) for p in pkgs]
        return language_pb2.GetRequiredPluginsResponse(plugins=plugins)

    @_rpc
    def GetProgramDependencies(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        program = Program.from_info(request.info)
        args = ["-m", "pip", "list", "--format", "json"] + (
            [] if request.transitiveDependencies else ["--not-required"]
        )
        deps = json.loads(program.output(*args))
        return language_pb2.GetProgramDependenciesResponse(
            dependencies=[language_pb2.DependencyInfo(name=d["name"], version=d["version"]) for d in deps]
        )

    @_rpc
    def About(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        program = (
            Program.from_info(request.info) if request.HasField("info") else Program(Path.cwd(), Path.cwd(), ".", None)
        )
        about = json.loads(
            program.output(
                "-c",
                "import sys, json, platform, importlib.metadata as m\n"
                "try: pip = m.version('pip')\nexcept m.PackageNotFoundError: pip = ''\n"
                "print(json.dumps([sys.executable, platform.python_version(), pip]))",
            )
        )
        return language_pb2.AboutResponse(
            executable=about[0],
            version=about[1],
            metadata={"toolchain": "pip", "toolchainVersion": about[2], "host": "osfleet.lab.language_host"},
        )

    def RuntimeOptionsPrompts(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return language_pb2.RuntimeOptionsResponse()

    def Template(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return language_pb2.TemplateResponse()  # pip projects need nothing from a template (as Pulumi's host)

    def _unsupported(self, what: str, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{what} is not supported by osfleet's Python language host")

    def RunPlugin(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._unsupported("running a Python plugin (policy pack, component provider)", context)

    def GenerateProgram(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._unsupported("generating a program (pulumi convert)", context)

    def GenerateProject(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._unsupported("generating a project (pulumi convert)", context)

    def GeneratePackage(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._unsupported("generating an SDK (pulumi package gen-sdk)", context)

    def Pack(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._unsupported("packing an SDK (pulumi package add)", context)

    def Link(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._unsupported("linking a local SDK (pulumi package add)", context)

    def InstallDependencies(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        """``pulumi install``: the virtualenv (made when missing), then ``requirements.txt``, streamed."""

        def out(text: str) -> Any:
            return language_pb2.InstallDependenciesResponse(stdout=(text + "\n").encode())

        try:
            program = Program.from_info(request.info)
            yield out("Installing dependencies...")
            venv = program.virtualenv
            if venv is not None and not (venv / "bin" / "python").is_file():
                base = shutil.which(os.environ.get("PULUMI_PYTHON_CMD", "python3")) or sys.executable
                yield out(f"Creating virtual environment {venv} ...")
                for name, line in _stream([base, "-m", "venv", str(venv)], dict(os.environ), program.root):
                    yield language_pb2.InstallDependenciesResponse(**{name: line})
                yield out("Finished creating virtual environment")
            requirements = program.directory / "requirements.txt"
            if not requirements.is_file():
                yield out(f"No {requirements}: nothing more to install")
            else:
                yield out(f"Installing {requirements} into {venv or program.python} ...")
                cmd = [program.python, "-m", "pip", "install", "-r", str(requirements)]
                for name, line in _stream(cmd, program.env(), program.directory):
                    yield language_pb2.InstallDependenciesResponse(**{name: line})
            yield out("Finished installing dependencies")
        except HostError as exc:
            context.abort(exc.code, str(exc))

    @_rpc
    def Run(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        if request.attach_debugger:
            return language_pb2.RunResponse(
                error="osfleet's language host cannot attach a debugger (--attach-debugger)"
            )
        program = Program.from_info(request.info)
        program.require_venv()
        args = [program.python, "-u", str(RUNNER)]
        for flag, value in (
            ("monitor", request.monitor_address),
            ("engine", self.engine_address),
            ("project", request.project),
            ("root_directory", str(program.root)),
            ("stack", request.stack),
            ("organization", request.organization),
            ("pwd", request.pwd),
            ("dry_run", "true" if request.dryRun else "false"),
            ("parallel", str(request.parallel)),
            ("tracing", self.tracing),
        ):
            if value:
                args += [f"--{flag}", value]
        args += ["--", request.info.entry_point or request.program or ".", *request.args]
        env = program.env(
            {
                "PULUMI_CONFIG": json.dumps(dict(request.config)),
                "PULUMI_CONFIG_SECRET_KEYS": json.dumps(list(request.configSecretKeys)),
            }
        )
        if self.runs.cancelled.is_set():
            return language_pb2.RunResponse(error="the update was cancelled")
        proc = subprocess.Popen(args, env=env, cwd=program.directory)  # stdout/stderr: ours, streamed by the engine
        self.runs.add(proc)
        hung_up = threading.Event()

        def on_done() -> None:  # the RPC ended: the engine hung up (or we answered, and this is a no-op)
            if proc.poll() is None:
                hung_up.set()
                stop_child(proc)

        context.add_callback(on_done)
        try:
            code = proc.wait()
        finally:
            self.runs.remove(proc)
        sys.stdout.flush()
        if code == 0:
            return language_pb2.RunResponse()
        if self.runs.cancelled.is_set() or hung_up.is_set():
            return language_pb2.RunResponse(error="the program was cancelled")
        if code == REPORTED:
            return language_pb2.RunResponse(bail=True)
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return language_pb2.RunResponse(error=f"the program {how}")

    def Cancel(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self.runs.cancelled.set()
        threading.Thread(target=self.runs.stop_all, name="cancel", daemon=True).start()
        return empty_pb2.Empty()


def _watch_parent(stop: Callable[[], None]) -> None:
    """Stop when the process that started us (the engine) is gone: we would be adopted by another."""
    parent = os.getppid()
    while True:
        threading.Event().wait(PARENT_POLL_SECONDS)
        if os.getppid() != parent:
            stop()
            return


def serve(engine_address: str, tracing: str = "", watch_parent: bool = True) -> None:
    """Serve on a free loopback port, print it, and serve until the engine or a signal stops us."""
    host = LanguageHost(engine_address, tracing)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="rpc"),
        options=[("grpc.max_receive_message_length", 400 * 1024 * 1024)],
    )
    language_pb2_grpc.add_LanguageRuntimeServicer_to_server(host, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    done = threading.Event()

    def stop(*_: Any) -> None:
        host.runs.stop_all()
        server.stop(grace=1)
        done.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    if watch_parent:
        threading.Thread(target=_watch_parent, args=(stop,), name="parent", daemon=True).start()
    while not done.wait(1.0):
        pass


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="pulumi-language-python", description="osfleet's Python language host")
    ap.add_argument("--tracing", default="", help="ignored (no tracing endpoint here)")
    ap.add_argument("--version", action="store_true", help="print the version and exit")
    ap.add_argument("engine", nargs="?", default="", help="the engine's gRPC address")
    args, _unknown = ap.parse_known_args(argv)
    if args.version:
        print(importlib.metadata.version("pulumi"))
        return
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="language host: %(message)s")
    serve(args.engine, args.tracing)


if __name__ == "__main__":
    main()
