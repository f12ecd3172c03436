"""``osfleet infra env``: after ``eval "$(.venv/bin/osfleet infra env)"`` the plain ``pulumi`` works in the
project's root with this machine's engine, our language host, the file backend and the passphrase; the
lines are POSIX ``export``s a shell can eval twice without growing PATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from osfleet.config import Settings
from osfleet.lab.engine import engine_root, sdk_version
from tests.conftest import REPO, VENV_BIN

pytestmark = pytest.mark.system


def _shell(script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", script], cwd=REPO, env=env or dict(os.environ), capture_output=True, text=True, timeout=120
    )


def test_the_lines_are_exports_of_the_engine_the_backend_and_no_downloads() -> None:
    out = subprocess.run([str(VENV_BIN / "osfleet"), "infra", "env"], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines and all(line.startswith("export ") for line in lines)
    env = dict(line.removeprefix("export ").split("=", 1) for line in lines)
    home = Settings.from_env().home
    assert env["PULUMI_BACKEND_URL"] == f"file://{home}/pulumi/state"
    assert env["PULUMI_CONFIG_PASSPHRASE_FILE"] == f"{home}/pulumi/passphrase"
    assert env["PULUMI_HOME"] == f"{home}/pulumi/home"
    assert env["PULUMI_SKIP_UPDATE_CHECK"] == env["PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION"] == "true"
    if not os.environ.get("DBUS_SESSION_BUS_ADDRESS"):  # the engine's keyring lookup must not start a bus
        assert env["DBUS_SESSION_BUS_ADDRESS"] == "disabled:"
    assert env["PATH"].split(":")[0] == str(engine_root() / "bin")
    assert Path(env["OSFLEET_PYTHON"]).parent == Path(sys.executable).parent


def test_after_eval_the_plain_cli_and_our_language_host_are_found_and_pulumi_runs_in_the_root() -> None:
    osf = VENV_BIN / "osfleet"
    done = _shell(
        f'eval "$({osf} infra env)" && eval "$({osf} infra env)" && '
        "command -v pulumi && command -v pulumi-language-python && pulumi version && "
        'echo "PATH=$PATH" && pulumi stack ls --non-interactive && pulumi about --non-interactive'
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    bin_dir = str(engine_root() / "bin")
    assert out[0] == f"{bin_dir}/pulumi" and out[1] == f"{bin_dir}/pulumi-language-python"
    assert out[2] == f"v{sdk_version()}"
    path = next(x for x in out if x.startswith("PATH=")).removeprefix("PATH=").split(":")
    assert path.count(bin_dir) == 1  # evaluated twice, listed once
    assert "This project is written in python" in done.stdout and "osfleet.lab.language_host" in done.stdout
    # no "using pulumi-language-python from $PATH" either; "no current stack" is only a fresh checkout's state
    warnings = [
        line for line in done.stderr.lower().splitlines() if "warning" in line and "no current stack" not in line
    ]
    assert not warnings, done.stderr


def test_a_machine_without_set_up_is_told_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "OSFLEET_HOME": str(tmp_path)}
    done = subprocess.run([str(VENV_BIN / "osfleet"), "infra", "env"], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "scripts/" in done.stderr


def test_a_stack_ca_is_trusted_by_the_shell_from_its_up_to_its_destroy(tmp_path: Path) -> None:
    """``SSL_CERT_FILE`` names a bundle of the system's CAs and the stack CAs made here: an agent certificate the
    stack's CA signed verifies against it (as OpenSSL's clients verify), and no longer once the CA is deleted."""
    from osfleet.tls import SYSTEM_CA_BUNDLE, issue, make_ca, trust_stack_ca, write_trust_bundle

    ca = make_ca("osfleet test CA")
    agent = tmp_path / "agent.pem"
    agent.write_text(issue(ca, ["127.0.0.1"]).cert_pem)
    bundle = write_trust_bundle(tmp_path)

    def verifies() -> bool:
        done = subprocess.run(["openssl", "verify", "-CAfile", str(bundle), str(agent)], capture_output=True)
        return done.returncode == 0

    assert not verifies()
    trust_stack_ca(tmp_path, ca.cert_pem)
    assert verifies()
    assert not SYSTEM_CA_BUNDLE.is_file() or bundle.read_text().startswith(SYSTEM_CA_BUNDLE.read_text())
    trust_stack_ca(tmp_path, ca.cert_pem, trusted=False)
    assert not verifies()


def test_infra_env_exports_the_bundle_as_ssl_cert_file() -> None:
    out = subprocess.run([str(VENV_BIN / "osfleet"), "infra", "env"], capture_output=True, text=True, check=True)
    env = dict(line.removeprefix("export ").split("=", 1) for line in out.stdout.splitlines())
    home = Settings.from_env().home
    assert env["SSL_CERT_FILE"] == str(home / "pulumi" / "trusted-cas.pem")
    assert Path(env["SSL_CERT_FILE"]).is_file()
