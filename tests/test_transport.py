"""Transport: TLS on the listeners and between the gateway and its hosts, with certificates made here by
``osfleet.tls``; and forwarded headers believed only from configured proxies.

Everything runs on loopback without VMs: the host agent is the real app over ``tests.fakes.FakeHost``, the
gateway the real one, each served by a real uvicorn (in a thread, or ``osfleet fleet serve`` as a process)."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import os
import signal
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from click.testing import CliRunner
from fastapi import FastAPI, Request

from osfleet.api.app import create_app
from osfleet.bench.load import run_locust
from osfleet.cli import cli
from osfleet.client import Fleet, FleetError
from osfleet.config import AgentConfig
from osfleet.errors import ConfigError
from osfleet.fleet.app import create_gateway
from osfleet.fleet.hosts import HostEntry
from osfleet.tls import KeyPair, Listener, issue, listener, make_ca
from tests.conftest import VENV_BIN, free_port
from tests.fakes import FakeHost

HOST_TOKEN = "host-token-123"
GATEWAY_TOKEN = "gateway-token-456"


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA every certificate below (but ``other_*``) is signed by
    host: tuple[Path, Path]  # cert, key for 127.0.0.1 and localhost
    wrong_name: tuple[Path, Path]  # signed by the CA, for 127.0.0.2 only
    other_ca: Path  # a CA nobody here uses
    other_key: Path  # a key that belongs to no certificate here


def _write(folder: Path, name: str, pair: KeyPair) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    cert.write_text(pair.cert_pem)
    key.write_text(pair.key_pem)
    key.chmod(0o600)
    return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, other = make_ca("osfleet test CA"), make_ca("someone else's CA")
    ca_file, _ = _write(d, "ca", ca)
    other_ca, other_key = _write(d, "other-ca", other)
    return Pki(
        ca=ca_file,
        host=_write(d, "host", issue(ca, ["127.0.0.1", "localhost"])),
        wrong_name=_write(d, "wrong", issue(ca, ["127.0.0.2"])),
        other_ca=other_ca,
        other_key=_write(d, "stray", issue(other, ["127.0.0.1"]))[1],
    )


class Served:
    """An ASGI app under a real uvicorn in a thread, listening as ``listener`` says (or uvicorn's defaults)."""

    def __init__(self, app: Any, listener: Listener | None) -> None:
        self.port = free_port()
        opts = listener.uvicorn_options() if listener is not None else {}
        self.url = (listener or Listener()).url("127.0.0.1", self.port)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error", **opts))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(20)


def host_app(home: Path, osgym_allowed: tuple[str, ...] = ()) -> Any:
    return create_app(AgentConfig(token=HOST_TOKEN, osgym_allowed_ips=osgym_allowed), lambda: FakeHost(home))


def tls(pki: Pki, pair: tuple[Path, Path] | None = None) -> Listener:
    cert, key = pair or pki.host
    return listener(cert, key)


# --- the listener's options ----------------------------------------------------------------------------------
def _expired(folder: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(1).not_valid_before(now - dt.timedelta(days=30)).not_valid_after(now - dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    from osfleet.tls import _cert_pem, _key_pem

    return _write(folder, "expired", KeyPair(_cert_pem(cert), _key_pem(key)))


@pytest.mark.unit
def test_the_tls_options_refuse_what_would_fail_later_with_one_line(pki: Pki, tmp_path: Path) -> None:
    cert, key = pki.host
    (tmp_path / "empty.pem").write_text("")
    (tmp_path / "junk.pem").write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    old_cert, old_key = _expired(tmp_path)
    cases = [
        ((cert, None), "--tls-cert and --tls-key go together"),
        ((None, key), "--tls-cert and --tls-key go together"),
        ((tmp_path / "missing.pem", key), f"--tls-cert {tmp_path}/missing.pem: no such file"),
        ((cert, tmp_path), f"--tls-key {tmp_path}: is a folder"),
        ((tmp_path / "empty.pem", key), "empty.pem: is empty"),
        ((tmp_path / "junk.pem", key), "junk.pem: not a PEM certificate"),
        ((cert, cert), "not an unencrypted PEM private key"),
        ((cert, pki.other_key), f"--tls-key {pki.other_key} is not the key of the certificate in --tls-cert {cert}"),
        ((old_cert, old_key), "expired on"),
    ]
    for (c, k), message in cases:
        with pytest.raises(ConfigError) as err:
            listener(c, k)
        assert message in str(err.value) and "\n" not in str(err.value)
    for bad in ("not-an-ip", "10.0.0.0/33", "0.0.0.0/0", "*"):
        with pytest.raises(ConfigError, match="--trusted-proxy"):
            listener(None, None, [bad])
    assert listener(None, None, ["10.0.0.7", "10.1.0.0/16", "::1"]).trusted_proxies == (
        "10.0.0.7",
        "10.1.0.0/16",
        "::1",
    )


@pytest.mark.unit
@pytest.mark.parametrize("command", [["host", "serve"], ["fleet", "serve", "--host", "h=https://127.0.0.1:1"]])
def test_the_servers_say_what_is_wrong_with_a_pair_before_starting(pki: Pki, command: list[str]) -> None:
    cert, _ = pki.host
    result = CliRunner().invoke(cli, [*command, "--tls-cert", str(cert), "--tls-key", str(pki.other_key)])
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"osfleet: error: --tls-key {pki.other_key} is not the key of the certificate in --tls-cert {cert}"
    )


# --- TLS end to end --------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_a_host_agent_over_https_serves_a_client_that_verifies_it(pki: Pki, tmp_path: Path) -> None:
    with Served(host_app(tmp_path), tls(pki)) as host:
        assert host.url.startswith("https://")
        with Fleet(host.url, HOST_TOKEN, verify=pki.ca) as fleet:
            assert fleet.health()["status"] == "ok"
            lease = fleet.lease(holder="tls-test")
            lease.release()
        # Nothing in the clear, nothing unverified: plain HTTP to the TLS port, and the system's CAs, both fail.
        with pytest.raises((OSError, http.client.HTTPException)):  # uvicorn drops the connection
            urllib.request.urlopen(f"http://127.0.0.1:{host.port}/health", timeout=5)
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(f"{host.url}/health", timeout=5)


@pytest.mark.unit
def test_a_gateway_over_https_reaches_an_https_host_verified_against_its_ca(pki: Pki, tmp_path: Path) -> None:
    with Served(host_app(tmp_path), tls(pki)) as host:
        entry = HostEntry(name="h1", url=host.url, token=HOST_TOKEN, ca_file=pki.ca)
        with (
            Served(create_gateway(GATEWAY_TOKEN, [entry]), tls(pki)) as gw,
            Fleet(gw.url, GATEWAY_TOKEN, verify=pki.ca) as fleet,
        ):
            health = fleet.health()
            assert health["hosts"] == {"h1": {"healthy": True, "reason": "ok"}}
            lease = fleet.lease(holder="tls-test")
            assert lease.replica_id.startswith("h1.")
            step = lease.step([{"type": "wait", "seconds": 0}], observe=False)
            assert step.results and not step.done
            lease.release()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("ca", "cert", "reason"),
    [
        ("other_ca", "host", "the host's certificate is not trusted (unable to get local issuer certificate)"),
        ("ca", "wrong_name", "the host's certificate is not trusted (IP address mismatch"),
        (None, "host", "the host's certificate is not trusted (unable to get local issuer certificate)"),
    ],
)
def test_a_host_the_gateway_cannot_verify_is_refused_with_the_reason(
    pki: Pki, tmp_path: Path, ca: str | None, cert: str, reason: str
) -> None:
    """A CA that did not sign the host's certificate, a certificate for another address, or no CA file at all
    (the system's CAs do not know the private CA): the host is never called, and /health says why."""
    pair = pki.host if cert == "host" else pki.wrong_name
    with Served(host_app(tmp_path), tls(pki, pair)) as host:
        ca_file = getattr(pki, ca) if ca else None
        entry = HostEntry(name="h1", url=host.url, token=HOST_TOKEN, ca_file=ca_file)
        with Served(create_gateway(GATEWAY_TOKEN, [entry]), None) as gw:
            deadline = time.monotonic() + 15  # drained after two failed polls, 2 s apart
            while True:
                state = _get(f"{gw.url}/health", {"Authorization": f"Bearer {GATEWAY_TOKEN}"})[1]["hosts"]["h1"]
                if state["healthy"] is False and "TLS" in state["reason"] or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert state["healthy"] is False
            assert state["reason"].startswith("host h1 is not answering its health checks (TLS: ")
            assert reason in state["reason"]


@pytest.mark.unit
def test_a_client_with_the_wrong_ca_gets_one_clear_error_at_once(pki: Pki, tmp_path: Path) -> None:
    with Served(host_app(tmp_path), tls(pki)) as host:
        started = time.monotonic()
        with Fleet(host.url, HOST_TOKEN, verify=pki.other_ca) as fleet, pytest.raises(FleetError) as err:
            fleet.health()
        assert time.monotonic() - started < 3  # not retried: a setting to fix, not a passing failure
        assert err.value.kind == "tls"
        assert "TLS: the server's certificate is not trusted (unable to get local issuer certificate)" in str(err.value)
        with pytest.raises(ValueError, match="CA file /nonexistent/ca.pem: no such file"):
            Fleet(host.url, HOST_TOKEN, verify="/nonexistent/ca.pem")


@pytest.mark.system
def test_fleet_serve_listens_over_https_and_verifies_its_hosts_from_the_command_line(pki: Pki, tmp_path: Path) -> None:
    (tmp_path / "host-token").write_text(HOST_TOKEN)
    (tmp_path / "gw-token").write_text(GATEWAY_TOKEN)
    cert, key = pki.host
    with Served(host_app(tmp_path / "home"), tls(pki)) as host:
        port = free_port()
        log = tmp_path / "gateway.log"
        argv = [
            str(VENV_BIN / "osfleet"), "fleet", "serve", "--port", str(port), "--host", f"h1={host.url}",
            "--hosts-token-file", str(tmp_path / "host-token"), "--token-file", str(tmp_path / "gw-token"),
            "--hosts-ca-file", str(pki.ca), "--tls-cert", str(cert), "--tls-key", str(key),
        ]  # fmt: skip
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            ctx = ssl.create_default_context(cafile=str(pki.ca))
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, log.read_text()[-500:]
                try:
                    ask = urllib.request.Request(
                        f"https://127.0.0.1:{port}/health", headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"}
                    )
                    with urllib.request.urlopen(ask, timeout=3, context=ctx) as r:
                        body = json.load(r)
                        break
                except (OSError, urllib.error.URLError):
                    assert time.monotonic() < deadline, log.read_text()[-500:]
                    time.sleep(0.3)
            assert body["hosts"]["h1"]["healthy"] is True
            assert f"osfleet fleet gateway on https://127.0.0.1:{port}" in log.read_text()
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)


@pytest.mark.system
@pytest.mark.slow
def test_locust_scenarios_verify_an_https_host_against_the_ca_file(pki: Pki, tmp_path: Path) -> None:
    """The trajectories scenario (users and the host sampler) with ``--ca-file`` leases over TLS; without it the
    system's CAs refuse the private CA and every request fails."""
    with Served(host_app(tmp_path / "home"), tls(pki)) as host:
        runs = {}
        for name, extra in (("with-ca", ["--ca-file", str(pki.ca)]), ("without", [])):
            run_dir = tmp_path / name
            run_dir.mkdir()
            env_ca = os.environ.pop("OSFLEET_CA_FILE", None)
            try:
                run_locust("trajectories", host.url, HOST_TOKEN, run_dir, 1, "6s", extra)
            finally:
                if env_ca is not None:
                    os.environ["OSFLEET_CA_FILE"] = env_ca
            runs[name] = run_dir
    rows = {
        r.split(",")[1]: r.split(",") for r in (runs["with-ca"] / "trajectories_stats.csv").read_text().splitlines()
    }
    assert int(rows["lease"][2]) > 0 and rows["lease"][3] == "0", rows["lease"]  # requests, failures
    samples = [json.loads(x) for x in (runs["with-ca"] / "samples.jsonl").read_text().splitlines()]
    assert samples and not any("error" in s for s in samples)
    failed = (runs["without"] / "trajectories_failures.csv").read_text()
    assert "CERTIFICATE_VERIFY_FAILED" in failed
    samples = [json.loads(x) for x in (runs["without"] / "samples.jsonl").read_text().splitlines()]
    assert samples and all("CERTIFICATE_VERIFY_FAILED" in s["error"] for s in samples)


# --- forwarded headers -----------------------------------------------------------------------------------------
def echo_app() -> FastAPI:
    app = FastAPI()

    @app.get("/peer")
    def peer(request: Request) -> dict[str, Any]:
        return {"client": request.client.host if request.client else None, "scheme": request.url.scheme}

    return app


def _get(url: str, headers: dict[str, str]) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.load(exc)


FORGED = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"}


@pytest.mark.integration  # over a second: kept out of the unit tier's 2 minutes
def test_a_forged_x_forwarded_for_from_an_untrusted_peer_changes_nothing(tmp_path: Path) -> None:
    """What every check of an address reads (the OSGym allow-list, OSGym callers, loopback-only /metrics) is the
    peer's own address unless the peer is a configured proxy. uvicorn alone would believe loopback."""
    seen = {}
    for name, how in (("ours", Listener()), ("proxied", listener(None, None, ["127.0.0.1"])), ("uvicorn", None)):
        with Served(echo_app(), how) as s:
            seen[name] = _get(f"{s.url}/peer", FORGED)[1]
    assert seen["ours"] == {"client": "127.0.0.1", "scheme": "http"}
    assert seen["proxied"] == {"client": "203.0.113.9", "scheme": "https"}  # from a configured proxy: believed
    assert seen["uvicorn"]["client"] == "203.0.113.9"  # the default this replaces

    allowed = ("203.0.113.9",)
    with Served(host_app(tmp_path / "a", allowed), Listener()) as s:
        status, body = _get(f"{s.url}/screenshot?vmId=1", FORGED)
        assert status == 401 and body["kind"] == "unauthorized"  # the forged address is not in the allow-list's eyes
    with Served(host_app(tmp_path / "b", allowed), listener(None, None, ["127.0.0.1"])) as s:
        status, _ = _get(f"{s.url}/screenshot?vmId=1", FORGED)
        assert status != 401  # through a trusted proxy the client's address counts


@pytest.mark.unit
def test_host_cas_are_checked_when_the_gateway_starts(pki: Pki, tmp_path: Path) -> None:
    from osfleet.fleet.hosts import load_hosts

    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"[{{name: h1, url: 'http://10.0.0.5:8080', token: t, ca_file: {pki.ca}}}]")
    with pytest.raises(ConfigError, match="host 1: .*ca_file is for https URLs; http://10.0.0.5:8080 is plain HTTP"):
        load_hosts(hosts)
    hosts.write_text(f"[{{name: h1, url: 'https://10.0.0.5:8080', token: t, ca_file: {pki.ca}}}]")
    assert load_hosts(hosts)[0].ca_file == pki.ca
    (tmp_path / "token").write_text("t")
    base = ["fleet", "serve", "--hosts-token-file", str(tmp_path / "token")]
    for argv, message in [
        ([*base, "--host", "h1=http://10.0.0.5:8080", "--hosts-ca-file", str(pki.ca)], "every host here is plain HTTP"),
        ([*base, "--host", "h1=https://10.0.0.5:8080", "--hosts-ca-file", str(tmp_path / "token")],
         f"host h1: CA file {tmp_path}/token: not a PEM certificate"),
        ([*base, "--host", "h1=https://10.0.0.5:8080", "--hosts-ca-file", str(tmp_path / "no.pem")],
         f"host h1: CA file {tmp_path}/no.pem: no such file"),
    ]:  # fmt: skip
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == 1 and message in result.output and result.output.count("\n") == 1, result.output
