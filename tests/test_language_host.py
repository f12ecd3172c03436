"""osfleet's Python language host under the real engine: the plain ``pulumi`` CLI (scripts/build-pulumi), a
throwaway project in tmp with a file backend, exactly as a user types the commands.

Proves: preview/up/refresh/destroy run the program in the project's virtualenv with config and secrets; a second
preview sees no change; the program's prints reach the user; a config mistake (``pulumi.RunError``,
osfleet's own ``ConfigError``) is one line without a traceback; a bug shows the program's own frames only;
``pulumi about`` and ``pulumi install`` (a virtualenv made, a requirements file installed); a missing
virtualenv is named; Ctrl-C cancels a running program and a killed engine leaves no host or program behind.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from google.protobuf import struct_pb2
from pulumi.runtime.proto import language_pb2

from osfleet.errors import OsfleetError
from osfleet.lab import engine
from osfleet.lab.engine import ensure_engine
from osfleet.lab.language_host import HostError, Program, plugin_version

pytestmark = pytest.mark.system

PROGRAM = """
import pulumi
from pulumi.dynamic import CreateResult, Resource, ResourceProvider


class Echo(ResourceProvider):
    def create(self, props):
        return CreateResult(id_="echo-1", outs=dict(props))


class Thing(Resource):
    def __init__(self, name, value):
        super().__init__(Echo(), name, {"value": value})


cfg = pulumi.Config()
print("program says hello; dry run:", pulumi.runtime.is_dry_run())
mode = cfg.get("mode")
if mode == "runerror":
    raise pulumi.RunError("tiny:mode: a config mistake, said in one line")
if mode == "osfleet":
    from osfleet.errors import ConfigError
    raise ConfigError("tiny:mode: osfleet's own error, said in one line")
if mode == "bug":
    def helper():
        return {}["missing-key"]
    helper()
if mode == "slow":
    import time
    print("sleeping now", flush=True)
    time.sleep(300)
thing = Thing("thing", cfg.get("value") or "v0")
pulumi.export("value", thing.value)
pulumi.export("token", cfg.require_secret("token"))
"""


@pytest.fixture(scope="module")
def engine_bin() -> Path:
    try:
        bin_dir = ensure_engine() / "bin"  # built on first use (scripts/build-pulumi, once per machine)
    except OsfleetError as exc:
        pytest.fail(f"the Pulumi engine could not be built (scripts/build-pulumi): {exc}")
    if not (bin_dir / "pulumi-language-python").exists():
        pytest.fail(f"no pulumi-language-python in {bin_dir}: run scripts/build-pulumi")
    return bin_dir


class Project:
    """A one-file Pulumi project with its own file backend and passphrase, run with the plain CLI."""

    def __init__(self, root: Path, engine_bin: Path, virtualenv: str) -> None:
        self.dir = root / "project"
        self.dir.mkdir(parents=True)
        (root / "state").mkdir()
        (root / "home").mkdir()
        (self.dir / "Pulumi.yaml").write_text(
            f"name: tiny\nruntime:\n  name: python\n  options:\n    virtualenv: {virtualenv}\n"
        )
        (self.dir / "__main__.py").write_text(PROGRAM)
        self.env = {
            **os.environ,
            "PATH": f"{engine_bin}{os.pathsep}{os.environ['PATH']}",
            "PULUMI_BACKEND_URL": f"file://{root / 'state'}",
            "PULUMI_HOME": str(root / "home"),
            "PULUMI_CONFIG_PASSPHRASE": "test passphrase",
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "OSFLEET_PYTHON": sys.executable,
            **engine.session_bus_env(),
        }

    def pulumi(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["pulumi", *args, "--non-interactive"],
            cwd=self.dir,
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if check and done.returncode != 0:
            pytest.fail(f"pulumi {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["pulumi", *args, "--non-interactive"],
            cwd=self.dir,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


def _leftovers(marker: str) -> list[str]:
    """Processes of the host or the program that belong to this test's project."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if ("language_host" in cmd or "program_runner" in cmd) and marker in cmd:
                out.append(cmd)
    return out


def _host_pids(parent: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
                cmd = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"language_host" in cmd:
                found.append(int(proc.name))
    return found


@pytest.fixture
def project(tmp_path: Path, engine_bin: Path) -> Iterator[Project]:
    p = Project(tmp_path, engine_bin, sys.prefix)  # the program runs with osfleet's own virtualenv
    p.pulumi("stack", "init", "dev")
    p.pulumi("config", "set", "value", "hello")
    p.pulumi("config", "set", "--secret", "token", stdin="s3cret")
    yield p
    p.pulumi("destroy", "--yes", check=False)
    assert _leftovers(str(p.dir)) == []


def _session_buses_of(home: str) -> set[int]:
    """dbus-daemon processes started for a Pulumi command of this home (their environment names it)."""
    found = set()
    for proc in psutil.process_iter(["name", "environ"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["name"] == "dbus-daemon" and (proc.info["environ"] or {}).get("PULUMI_HOME") == home:
                found.add(proc.pid)
    return found


@pytest.mark.slow
def test_preview_up_second_preview_and_destroy_with_config_and_secrets(project: Project) -> None:
    preview = project.pulumi("preview")
    assert not _session_buses_of(project.env["PULUMI_HOME"])  # the engine's keyring lookup started no bus
    assert "program says hello; dry run: True" in preview.stdout
    assert "+ 2 to create" in preview.stdout
    up = project.pulumi("up", "--yes")
    assert "program says hello; dry run: False" in up.stdout
    assert "+ 2 created" in up.stdout
    assert project.pulumi("stack", "output", "value").stdout.strip() == "hello"
    assert project.pulumi("stack", "output", "token", "--show-secrets").stdout.strip() == "s3cret"
    assert project.pulumi("stack", "output", "token").stdout.strip() == "[secret]"
    project.pulumi("preview", "--expect-no-changes")
    assert "2 unchanged" in project.pulumi("refresh", "--yes").stdout
    project.pulumi("config", "set", "value", "changed")
    assert project.pulumi("preview", "--expect-no-changes", check=False).returncode != 0
    project.pulumi("config", "set", "value", "hello")
    destroy = project.pulumi("destroy", "--yes")
    assert "- 2 deleted" in destroy.stdout


@pytest.mark.parametrize(
    ("mode", "line"),
    [
        ("runerror", "error: tiny:mode: a config mistake, said in one line"),
        ("osfleet", "error: tiny:mode: osfleet's own error, said in one line"),
    ],
)
def test_a_config_mistake_is_one_line_without_a_traceback(project: Project, mode: str, line: str) -> None:
    project.pulumi("config", "set", "mode", mode)
    done = project.pulumi("preview", check=False)
    assert done.returncode != 0
    assert done.stdout.count(line) >= 1
    assert "Traceback" not in done.stdout + done.stderr
    assert "exited with" not in done.stdout + done.stderr  # the engine adds nothing to the program's line


def test_a_bug_in_the_program_shows_its_own_frames_only(project: Project) -> None:
    project.pulumi("config", "set", "mode", "bug")
    done = project.pulumi("up", "--yes", check=False)
    assert done.returncode != 0
    assert "the program failed with an unhandled exception" in done.stdout
    assert "KeyError: 'missing-key'" in done.stdout
    assert "in helper" in done.stdout and str(project.dir / "__main__.py") in done.stdout
    assert "program_runner" not in done.stdout and "runpy" not in done.stdout


def test_pulumi_about_names_the_virtualenv_python_and_our_host(project: Project) -> None:
    about = project.pulumi("about").stdout
    assert f"executable='{sys.executable}'" in about or f"executable='{sys.prefix}/bin/python" in about
    assert "host='osfleet.lab.language_host'" in about
    assert "language  python" in about
    deps = about.split("Dependencies:", 1)[1]  # GetProgramDependencies: the virtualenv's top-level packages
    assert "\nosfleet " in deps and "\npulumi " not in deps  # pulumi is required by osfleet, so not top-level


def test_ctrl_c_cancels_a_running_program_and_leaves_nothing(project: Project) -> None:
    project.pulumi("config", "set", "mode", "slow")
    proc = project.start("up", "--yes")
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        lines.append(line)
        if "sleeping now" in line or time.monotonic() > deadline:
            break
    assert any("sleeping now" in x for x in lines), "".join(lines)
    assert _leftovers(str(project.dir)), "the program should be running now"
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert time.monotonic() - started < 30
    assert "the program was interrupted" in rest or "canceled" in rest
    time.sleep(1)
    assert _leftovers(str(project.dir)) == []


def test_a_killed_engine_takes_the_host_and_the_program_with_it(project: Project) -> None:
    project.pulumi("config", "set", "mode", "slow")
    proc = project.start("preview")
    assert proc.stdout is not None
    for line in proc.stdout:
        if "sleeping now" in line:
            break
    hosts = _host_pids(proc.pid)
    assert hosts, "the engine should have started our host"
    proc.kill()
    proc.wait()
    proc.stdout.close()
    deadline = time.monotonic() + 20
    while _leftovers(str(project.dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _leftovers(str(project.dir)) == []


def _wheel(directory: Path, name: str = "osfleet_probe", version: str = "1.0") -> Path:
    """A minimal pure-Python wheel (installable with no index and no build backend)."""
    files = {
        f"{name}/__init__.py": b"VALUE = 42\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{p},sha256={digest(d)},{len(d)}\n" for p, d in files.items())
    record += f"{name}-{version}.dist-info/RECORD,,\n"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in files.items():
            z.writestr(p, d)
        z.writestr(f"{name}-{version}.dist-info/RECORD", record)
    return path


def test_pulumi_install_makes_the_virtualenv_and_installs_requirements(tmp_path: Path, engine_bin: Path) -> None:
    p = Project(tmp_path, engine_bin, "venv")
    missing = p.pulumi("preview", "--stack", "dev", check=False)
    assert missing.returncode != 0
    wheel = _wheel(tmp_path)
    (p.dir / "requirements.txt").write_text(f"{wheel}\n")
    done = p.pulumi("install")
    assert "Creating virtual environment" in done.stdout + done.stderr
    assert "Successfully installed osfleet-probe-1.0" in done.stdout + done.stderr
    probe = subprocess.run(
        [str(p.dir / "venv/bin/python"), "-c", "import osfleet_probe; print(osfleet_probe.VALUE)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "42"


def test_a_missing_virtualenv_is_named_with_the_fix(tmp_path: Path, engine_bin: Path) -> None:
    p = Project(tmp_path, engine_bin, "no-such-venv")
    p.pulumi("stack", "init", "dev")
    done = p.pulumi("preview", check=False)
    assert done.returncode != 0
    assert f"the virtualenv {p.dir / 'no-such-venv'}" in done.stdout + done.stderr
    assert "pulumi install" in done.stdout + done.stderr


def _info(**options: object) -> language_pb2.ProgramInfo:
    opts = struct_pb2.Struct()
    opts.update(options)
    return language_pb2.ProgramInfo(root_directory="/p", program_directory="/p/infra", entry_point=".", options=opts)


def test_program_options_resolve_the_virtualenv_against_the_root_and_refuse_other_toolchains() -> None:
    prog = Program.from_info(_info(virtualenv=".venv"))
    assert prog.virtualenv == Path("/p/.venv") and prog.directory == Path("/p/infra")
    assert prog.python == "/p/.venv/bin/python"
    assert Program.from_info(_info(virtualenv="/abs/env")).virtualenv == Path("/abs/env")
    with pytest.raises(HostError, match="toolchain"):
        Program.from_info(_info(toolchain="poetry"))
    with pytest.raises(HostError, match="typechecker"):
        Program.from_info(_info(typechecker="mypy"))


@pytest.mark.parametrize(
    ("package", "plugin"),
    [
        ("7.51.1", "v7.51.1"),
        ("4.34", "v4.34.0"),
        ("1.2.3a4", "v1.2.3-alpha.4"),
        ("1.2.3rc1", "v1.2.3-rc.1"),
        ("1.2.3.post4", "v1.2.3+post4"),
        ("not a version", None),
    ],
)
def test_package_versions_become_plugin_versions(package: str, plugin: str | None) -> None:
    assert plugin_version(package) == plugin
