"""Every exit path is clean: SIGTERM and SIGHUP run the same clean-up as Ctrl-C, a second signal does not cut
it short, the servers shut down gracefully on SIGHUP, and a benchmark stopped mid-run leaves nothing behind.

The VM tests run the real ``osfleet`` command in a process of its own and signal it as a supervisor would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from osfleet.config import Settings
from tests.conftest import REPO, VENV_BIN, free_port

OSFLEET = str(VENV_BIN / "osfleet")


@pytest.mark.system
def test_a_second_sigterm_does_not_cut_the_clean_up_short(tmp_path: Path) -> None:
    done = tmp_path / "cleaned"
    program = f"""
import os, signal, sys, time
from osfleet.cli_support import interrupt_on_signals
interrupt_on_signals()
try:
    print("ready", flush=True)
    time.sleep(60)
except KeyboardInterrupt as exc:
    print("interrupted by", exc, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # a supervisor insisting
    os.kill(os.getpid(), signal.SIGHUP)  # and the terminal going away
    time.sleep(0.3)
    open({str(done)!r}, "w").write("yes")
    sys.exit(130)
"""
    proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "interrupted by SIGTERM" in out
    assert done.read_text() == "yes", err
    assert "the clean-up goes on" in err


def serve_gateway(tmp_path: Path) -> tuple[subprocess.Popen[str], int, Path]:
    port = free_port()
    token, host_token = tmp_path / "token", tmp_path / "host-token"
    token.write_text("exit-paths-token\n")
    host_token.write_text("exit-paths-host-token\n")  # the gateway refuses to share its token with a host
    log = tmp_path / "gateway.log"
    env = {**os.environ, "OSFLEET_HOME": str(tmp_path / "home"), "OSFLEET_LOG": "INFO"}
    cmd = [OSFLEET, "fleet", "serve", "--port", str(port), "--host", "h1=http://127.0.0.1:9"]
    cmd += ["--hosts-token-file", str(host_token), "--token-file", str(token)]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    deadline = time.monotonic() + 60
    import urllib.request

    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                break
        except OSError as exc:
            if getattr(exc, "code", None):  # answered, even with an error: it serves
                break
            time.sleep(0.2)
    return proc, port, log


@pytest.mark.system
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_fleet_serve_shuts_down_gracefully_on_sighup_as_on_sigterm(tmp_path: Path, sig: signal.Signals) -> None:
    proc, _, log = serve_gateway(tmp_path)
    try:
        proc.send_signal(sig)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "Application shutdown complete" in text, text[-2000:]  # the lifespan's shutdown ran
    assert proc.returncode == 130 and "osfleet: interrupted" in text and "Traceback" not in text


# --- a real benchmark, stopped mid-run ------------------------------------------------------------------------
def leftovers(settings: Settings) -> dict[str, list[str]]:
    """What this helper's prefix owns now: domains, replica folders, fork folders, fork RAM files, QEMUs."""
    from osfleet.vm.virt import Virt

    with Virt(settings.libvirt_uri) as v:
        domains = sorted(v.names(settings.name_prefix))
    forks = sorted(p.name for p in settings.forks_dir.iterdir()) if settings.forks_dir.exists() else []
    replicas = sorted(p.name for p in settings.replicas_dir.iterdir()) if settings.replicas_dir.exists() else []
    memory = settings.memory_dir
    fork_ram = sorted(p.name for p in memory.glob("*-f-*")) if memory is not None and memory.exists() else []
    qemus = sorted(
        str(p.info["pid"])
        for p in psutil.process_iter(["pid", "cmdline"])
        if any(f"guest={settings.name_prefix}" in a for a in (p.info["cmdline"] or []))
    )
    return {"domains": domains, "replicas": replicas, "forks": forks, "fork_ram": fork_ram, "qemu": qemus}


@pytest.fixture
def quiet_host(settings: Settings) -> Iterator[dict[str, list[str]]]:
    before = leftovers(settings)
    yield before


def run_until(cmd: list[str], marker: str, log: Path, timeout: float = 900) -> subprocess.Popen[str]:
    """Start ``cmd`` and return once ``marker`` shows in its output (the moment to interrupt it)."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    deadline = time.monotonic() + timeout
    while marker not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{' '.join(cmd[1:3])} never reached {marker!r}: {log.read_text()[-1500:]}")
        time.sleep(0.2)
    return proc


@pytest.mark.vm
@pytest.mark.slow
@pytest.mark.parametrize(
    "bench,marker",
    [
        (["bench", "reset", "--replicas", "2", "--resets", "1"], "cold: replica 1/2 ready"),
        (["bench", "fork", "--children", "3"], "[2/5] forking"),
    ],
    ids=["reset", "fork"],
)
def test_a_benchmark_stopped_by_sigterm_leaves_nothing_behind(
    golden: object, settings: Settings, quiet_host: dict[str, list[str]], tmp_path: Path, bench: list[str], marker: str
) -> None:
    log = tmp_path / "bench.log"
    proc = run_until([OSFLEET, *bench], marker, log)
    time.sleep(2)  # mid-way through the next bring-up (or the fork's save)
    proc.send_signal(signal.SIGTERM)
    proc.wait(600)
    text = log.read_text()
    assert proc.returncode == 130 and "osfleet: interrupted" in text, text[-1500:]
    assert leftovers(settings) == quiet_host, text[-1500:]
