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


# Fixtures that boot replicas or build an image: a test that asks for one is a ``vm`` test whatever it is marked.
VM_FIXTURES = frozenset({"golden", "office_image", "replica_hosts"})
TIERS = ("unit", "integration", "vm", "perf")
UNIT_CLASH = pytest.StashKey[list[str]]()
NO_TIER = pytest.StashKey[bool]()
CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: the marker added here counts
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tiers (CONTRIBUTING.md, "Tests") derived where the markers allow it: every test that boots replicas is
    ``slow`` (run by ``pytest -m slow`` and by CI) unless it is one of the few marked ``vm_smoke``, which the
    default run keeps so that it still boots, resets and forks a desktop; a test marked ``unit`` that is also
    ``vm`` or ``integration``, or asks for a fixture that boots replicas, is a mistake in its markers and fails, and
    so does a test in no tier (``slow`` alone is not one)."""
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.stash[NO_TIER] = True
        vm = item.get_closest_marker("vm") is not None
        if vm and not item.get_closest_marker("vm_smoke"):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("unit"):
            clash = [m for m in ("vm", "integration") if item.get_closest_marker(m)]
            clash += sorted(VM_FIXTURES & set(getattr(item, "fixturenames", ())))
            if clash:
                item.stash[UNIT_CLASH] = clash


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fails a test in no tier, or whose markers clash, before its fixtures run (a ``golden`` fixture would build an
    image)."""
    if item.stash.get(NO_TIER, False):
        pytest.fail(
            f"{item.name} is in no tier: mark it unit, integration, vm or perf (slow is not a tier; "
            'CONTRIBUTING.md, "Tests")',
            pytrace=False,
        )
    clash = item.stash.get(UNIT_CLASH, None)
    if clash:
        pytest.fail(f"marked unit but it is also {', '.join(clash)}: a unit test boots nothing", pytrace=False)


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
    if not request.node.get_closest_marker("unit"):
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
