"""Shared fixtures: a real sshd on loopback for Fabric tasks, and the golden image built through it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from fabric import Connection

from osfleet.cli_support import interrupt_on_signals
from osfleet.config import NAME_PREFIX, Settings
from osfleet.errors import ImageNotFoundError
from osfleet.vm.images import GoldenImage, load

if TYPE_CHECKING:
    from osfleet.bench.load import LocalAgent
    from osfleet.replicas.manager import ReplicaHost

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sshd:
    """An sshd of the test's own on 127.0.0.1 with throwaway host and client keys."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = free_port()
        self.client_key = directory / "client_key"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        host_key = self.dir / "host_key"
        for key in (host_key, self.client_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        auth = self.dir / "authorized_keys"
        auth.write_text(Path(f"{self.client_key}.pub").read_text())
        auth.chmod(0o600)
        config = self.dir / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nAuthorizedKeysFile {auth}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nStrictModes no\nPidFile none\nSubsystem sftp internal-sftp\n"
            "SetEnv OSFLEET_TEST_SSH=1\n"
        )
        Path("/run/sshd").mkdir(exist_ok=True)
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        self.proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(config)], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError("test sshd did not start")

    def connection(self) -> Connection:
        return Connection(
            "127.0.0.1",
            user="root",
            port=self.port,
            connect_timeout=10,
            connect_kwargs={
                "key_filename": str(self.client_key),
                "look_for_keys": False,
                "allow_agent": False,
            },
        )

    def fab(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run a golden_images Fabric task against this sshd, as a user would from the command line."""
        cmd = [
            str(VENV_BIN / "fab"),
            "-r",
            str(REPO / "golden_images"),
            "-H",
            f"root@127.0.0.1:{self.port}",
            "-i",
            str(self.client_key),
            *args,
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


# A shell starts a background job (``pytest ... &``) with SIGINT ignored, and that disposition is inherited by
# every command a test starts: a test that presses Ctrl-C on one (SIGINT) would see it ignored. The tests play
# a person at a terminal, so their commands start with SIGINT handled as Python does by default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# A run ended with SIGTERM (a CI timeout, ``kill``) or a hang-up would die without tearing fixtures down,
# leaving their replicas, tmpfs mounts and servers behind; as an interrupt (the CLI's own handling), pytest stops
# and runs every finalizer first, and a second SIGTERM does not cut that short.
if threading.current_thread() is threading.main_thread():
    interrupt_on_signals()


# The tiers (CONTRIBUTING.md, "Tests"). ``unit`` and ``integration`` are the default run (pyproject's addopts):
# in-process, no VM, no image, no process started. ``system`` starts processes (servers and command lines,
# namespaces, the jail, browsers, tool builds, Pulumi's engine); ``vm`` boots replicas; ``perf`` compares timings.
TIERS = ("unit", "integration", "system", "vm", "perf")
IN_PROCESS = frozenset({"unit", "integration"})
# Fixtures that boot replicas or build an image: only a ``system`` or ``vm`` test may ask for one.
VM_FIXTURES = frozenset({"golden", "office_image", "replica_hosts"})
# Every test that boots replicas runs on one xdist worker, one after another: they share the machine's libvirt,
# its saved states and the ``no_leftovers`` count of domains, and two TCG guests at once starve each other.
VM_GROUP = "vm"
TIER_ERROR = pytest.StashKey[str]()
CALL_FAILED = pytest.StashKey[bool]()
PROCESS_GUARD = pytest.StashKey["ProcessGuard"]()


def tiers_of(item: pytest.Item) -> list[str]:
    """The tier markers a test has, its file's ``pytestmark`` and class's included: ``-m`` selects on all of them,
    so a test in a file of ``integration`` tests cannot be ``system`` by its own marker alone (it fails as in two
    tiers; such a file marks each test instead)."""
    return [tier for tier in TIERS if item.get_closest_marker(tier) is not None]


def tier_error(item: pytest.Item) -> str | None:
    """What is wrong with a test's markers, or None: no tier, two tiers, a default-run test that asks for a fixture
    that builds an image or boots replicas or is marked ``slow``, a ``heavy`` test that is not ``vm`` or
    ``system``."""
    tiers = tiers_of(item)
    if not tiers:
        return (
            f"{item.name} is in no tier: mark it unit, integration, system, vm or perf (slow is not a tier; "
            'CONTRIBUTING.md, "Tests")'
        )
    tier = tiers[0]
    clash = tiers[1:]
    if tier in IN_PROCESS:
        clash += sorted(VM_FIXTURES & set(getattr(item, "fixturenames", ())))
        clash += ["slow"] if item.get_closest_marker("slow") else []
    if clash:
        return (
            f"marked {tier} but it is also {', '.join(clash)}: a test is in one tier, and the default run "
            "(unit, integration) boots nothing, builds no image and holds no slow test"
        )
    if item.get_closest_marker("heavy") and tier not in ("system", "vm"):
        return f"marked heavy but it is {tier}: heavy is a slow system or vm test"
    return None


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects and before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Checks each test's tier (a mistake fails the test before its fixtures run: a ``golden`` fixture would build
    an image) and puts every ``vm`` test in one xdist group."""
    for item in items:
        error = tier_error(item)
        if error:
            item.stash[TIER_ERROR] = error
        elif tiers_of(item)[0] == "vm":  # whatever group its file names: vm tests share the machine's libvirt
            item.add_marker(pytest.mark.xdist_group(VM_GROUP))


class ProcessGuard:
    """Refuses to start a process while a ``unit`` or ``integration`` test runs (its fixtures included), from any
    thread: the attempt raises where it was made and is remembered, so the test fails at teardown even if the
    code that tried swallowed the error. The default run then never waits on a server, a browser or a tool, and
    what a test needs that does start processes is said by its ``system`` marker."""

    # Every way CPython starts a process: subprocess (and asyncio's, which uses it), os.fork (multiprocessing's
    # fork), posix_spawn, os.system, and multiprocessing's forkserver and spawn helpers.
    PATCHED = (
        (subprocess.Popen, "_execute_child"),
        (os, "fork"),
        (os, "forkpty"),
        (os, "posix_spawn"),
        (os, "posix_spawnp"),
        (os, "system"),
    )

    def __init__(self, item: pytest.Item, tier: str) -> None:
        self.item, self.tier = item, tier
        self.attempts: list[str] = []
        self.saved: list[tuple[object, str, object]] = []

    def refuse(self, what: str) -> RuntimeError:
        self.attempts.append(what)
        return RuntimeError(
            f"{self.item.name} is marked {self.tier} but started a process ({what}): the default run is in-process; "
            "mark it system"
        )

    def install(self) -> None:
        import multiprocessing.util

        def popen_child(popen: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
            words = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
            raise self.refuse(str(words[0]) if words else "?")

        def named(name: str) -> Callable[..., Any]:
            def refused(*args: Any, **kw: Any) -> Any:
                raise self.refuse(f"os.{name}({str(args[0]) if args else ''})")

            return refused

        targets = [(subprocess.Popen, "_execute_child", popen_child)]
        targets += [(os, name, named(name)) for owner, name in self.PATCHED if owner is os and hasattr(os, name)]
        targets.append((multiprocessing.util, "spawnv_passfds", named("spawnv_passfds")))
        for owner, name, replacement in targets:
            self.saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, replacement)

    def remove(self) -> None:
        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)
        self.saved.clear()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fails a test whose tier is wrong before its fixtures run; starts the process guard of a default-run test
    before its fixtures, so a fixture's server in a subprocess counts too."""
    error = item.stash.get(TIER_ERROR, None)
    if error:
        pytest.fail(error, pytrace=False)
    tier = tiers_of(item)[0]
    if tier in IN_PROCESS:
        guard = ProcessGuard(item, tier)
        guard.install()
        item.stash[PROCESS_GUARD] = guard


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    try:
        return (yield)
    finally:
        guard = item.stash.get(PROCESS_GUARD, None)
        if guard is not None:
            guard.remove()
            del item.stash[PROCESS_GUARD]
            if guard.attempts and not item.stash.get(CALL_FAILED, False):  # a failed test already says why
                pytest.fail(guard.refuse(guard.attempts[0]).args[0], pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[CALL_FAILED] = report.failed
    return report


@pytest.fixture(autouse=True)
def _unit_tests_start_no_vm(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A ``unit`` test may not open libvirt on a real hypervisor (so it cannot start a VM): the attempt raises in
    whatever thread made it, and the test fails at teardown even if that thread swallowed the error. libvirt's
    ``test:///`` driver stays allowed."""
    if tiers_of(request.node)[:1] != ["unit"]:
        yield
        return
    import libvirt

    attempts: list[str] = []
    real_open = libvirt.open

    def guarded_open(uri: str | None = None) -> Any:
        if uri and uri.startswith("test:"):
            return real_open(uri)
        attempts.append(str(uri))
        raise RuntimeError(f"a unit test opened libvirt at {uri!r}: mark it vm (or integration), not unit")

    monkeypatch.setattr(libvirt, "open", guarded_open)
    yield
    if attempts and not request.node.stash.get(CALL_FAILED, False):  # a failed test already says why
        pytest.fail(f"marked unit but opened libvirt at {', '.join(attempts)}: mark it vm (or integration)")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings.from_env()


@pytest.fixture(scope="session")
def golden(sshd: Sshd, settings: Settings) -> GoldenImage:
    """The default golden image, built over SSH by the Fabric task (a cache hit once built on this machine)."""
    from osfleet.imaging import builder
    from osfleet.imaging.host import Host

    with sshd.connection() as c:
        files = builder.build(Host(c), builder.DEFAULT_RECIPE, str(settings.build_dir))
    return load(Path(files.manifest))


@pytest.fixture(scope="session")
def office_image(sshd: Sshd, settings: Settings) -> GoldenImage:
    """The office recipe's image (the osworld suite's desktop), built where ``tasks validate --suite osworld``
    finds it when it is not yet (about 10 minutes once per machine; a cache hit after)."""
    from osfleet.imaging import builder
    from osfleet.imaging.host import Host
    from osfleet.tasks.suites import SUITE_BUILD_DIR, SUITE_RECIPE, suite_image

    try:
        return suite_image("osworld", settings)
    except ImageNotFoundError:
        with sshd.connection() as c:
            builder.build(
                Host(c), builder.DEFAULT_RECIPE.parent / SUITE_RECIPE["osworld"], str(settings.home / SUITE_BUILD_DIR)
            )
    return suite_image("osworld", settings)


# OSWorld's own task files (the benchmark's 369 tasks): data, never in the repository; scripts/fetch-osworld-tasks
# puts them here (its --print-dir) from a named public source, checked against a pinned digest.
OSWORLD_TASKS = Settings.from_env().home / "data" / "osworld"


@pytest.fixture(scope="session")
def osworld_tasks() -> Path:
    """The folder of OSWorld's task files (``test_all.json``, ``examples/<domain>/<id>.json``); a test that needs
    them is skipped, naming the script, on a machine where they were never fetched."""
    if not (OSWORLD_TASKS / ".digest").is_file():
        pytest.skip(f"OSWorld's task files are not on this machine ({OSWORLD_TASKS}): scripts/fetch-osworld-tasks")
    return OSWORLD_TASKS


@pytest.fixture
def no_leftovers(settings: Settings) -> Iterator[None]:
    """Fail the test if it leaves an osfleet domain or scratch file behind."""
    from osfleet.vm.virt import Virt

    def state() -> tuple[list[str], list[str]]:
        with Virt(settings.libvirt_uri) as v:  # lab hosts have their own prefix and their own tests
            names = [n for n in v.names(NAME_PREFIX) if not n.startswith(f"{NAME_PREFIX}lab")]
        scratch = sorted(p.name for p in settings.scratch_dir.glob("*")) if settings.scratch_dir.exists() else []
        return names, scratch

    before = state()
    yield
    assert state() == before, "the test left domains or scratch files behind"


@pytest.fixture
def replica_hosts(golden: GoldenImage, settings: Settings, no_leftovers: None) -> Iterator[Callable[..., ReplicaHost]]:
    """``make(**options)``: a ReplicaHost of the golden image; every replica it made is torn down after."""
    from osfleet.replicas.manager import ReplicaHost

    made: list[tuple[ReplicaHost, set[str]]] = []

    def make(**options: Any) -> ReplicaHost:
        h = ReplicaHost(golden, settings, **{"mode": "snapshot", "auto_recover": False, **options})
        made.append((h, {r.id for r in h.replicas()}))
        return h

    yield make
    for h, before in made:
        try:
            h.stop_background()
            h.down([r.id for r in h.replicas() if r.id not in before])
        finally:
            h.close()


@pytest.fixture
def served() -> Iterator[Callable[..., str]]:
    """``served(app, **uvicorn_options)``: ``app`` under a real uvicorn on loopback in a thread; returns its
    ``http://127.0.0.1:PORT`` URL. Every server is stopped after the test."""
    import uvicorn

    running: list[tuple[uvicorn.Server, threading.Thread]] = []

    def serve(app: Any, **options: Any) -> str:
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", **options))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        running.append((server, thread))
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        return f"http://127.0.0.1:{port}"

    yield serve
    for server, _ in running:
        server.should_exit = True
    for _, thread in running:
        thread.join(20)


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """A headless Debian chromium driven by Playwright (no browser download), with a fresh profile."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/setup installs Debian's chromium")
    from playwright.sync_api import sync_playwright  # the dev extra

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # a fresh profile per test
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()
    shutil.rmtree(tmp_path / "chromium-profile", ignore_errors=True)


@contextmanager
def local_agent(image: GoldenImage, folder: Path, warm: int) -> Iterator[tuple[LocalAgent, Path]]:
    """A host agent of ``image`` in a subprocess (no recording) with ``warm`` ready replicas, and its token's file;
    stopped (its replicas torn down) on the way out."""
    from osfleet.bench.load import LocalAgent

    os.environ["OSFLEET_RECORD"] = "0"
    agent = LocalAgent(warm, folder / "agent.log", image.name)
    try:
        agent.wait_ready(warm, 600)
        token = folder / "token"
        token.write_text(agent.token + "\n")
        yield agent, token
    finally:
        agent.stop()
