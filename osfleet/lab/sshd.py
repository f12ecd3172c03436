"""The lab's SSH: one lab key for root, and an sshd per host inside its namespace, key auth only."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from osfleet.errors import CommandFailedError
from osfleet.lab.proc import SSHD, alive, run
from osfleet.lab.state import LabHost

SSH_PORT = 22
PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it; systemd's tmpfiles makes it elsewhere


def make_key(path: Path) -> None:
    """The lab key (ed25519, no passphrase), readable by root only."""
    if not path.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "osfleet-lab", "-f", str(path)], "making the lab key")


def sshd_config(host: LabHost, authorized_keys: Path, host_key: Path) -> str:
    """sshd configuration: listens on the host's address only, root by key only, the host's osfleet env."""
    env = " ".join(f"{k}={v}" for k, v in host.env.items())
    return "\n".join(
        [
            f"ListenAddress {host.addr}:{SSH_PORT}",
            f"HostKey {host_key}",
            f"PidFile {host.dir}/sshd.pid",
            f"AuthorizedKeysFile {authorized_keys}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes yes",
            "PrintMotd no",
            "MaxStartups 32:30:64",
            "MaxSessions 32",
            f"SetEnv {env}",
            "Subsystem sftp internal-sftp",
            "",
        ]
    )


def start(host: LabHost, public_key: Path) -> tuple[int, str]:
    """Start the host's sshd in its namespace; return its pid and its host-key line for known_hosts."""
    d = Path(host.dir)
    host_key = d / "ssh_host_ed25519_key"
    if not host_key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", str(host_key)], "making a host key")
    authorized = d / "authorized_keys"
    authorized.write_text(public_key.read_text())
    authorized.chmod(0o600)
    config = d / "sshd_config"
    config.write_text(sshd_config(host, authorized, host_key))
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    run([SSHD, "-t", "-f", str(config)], f"checking sshd configuration of {host.name}")
    pidfile = d / "sshd.pid"
    pidfile.unlink(missing_ok=True)
    run(
        ["ip", "netns", "exec", host.netns, SSHD, "-f", str(config), "-E", str(d / "sshd.log")],
        f"starting sshd of {host.name}",
    )
    pid = _wait_pid(pidfile, host.name)
    wait_listening(host.addr, SSH_PORT, 10.0, f"sshd of {host.name}")
    key_type, key_b64 = Path(str(host_key) + ".pub").read_text().split()[:2]
    return pid, f"{host.addr} {key_type} {key_b64}"


def _wait_pid(pidfile: Path, name: str, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pidfile.exists():
            text = pidfile.read_text().strip()
            if text.isdigit() and alive(int(text)):
                return int(text)
        time.sleep(0.05)
    raise CommandFailedError(f"sshd of {name} did not start (see {pidfile.parent / 'sshd.log'})")


def wait_listening(addr: str, port: int, timeout: float, what: str) -> None:
    """Block until ``addr:port`` accepts a TCP connection (from this machine, over the veth link)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((addr, port), timeout=1.0):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise CommandFailedError(f"{what} does not answer on {addr}:{port}: {exc.strerror or exc}") from None
            time.sleep(0.1)


def write_known_hosts(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines))
    os.chmod(path, 0o644)
