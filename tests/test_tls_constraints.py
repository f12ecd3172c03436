"""A stack's CA is trusted by every shell that evaluated ``osfleet infra env`` (``SSL_CERT_FILE``), so it may vouch
only for the stack's own names: a critical DNS name constraint (``osfleet.tls.make_ca``). Checked with real TLS
handshakes on loopback, verified by Python's ``ssl`` (OpenSSL) trusting that CA alone."""

from __future__ import annotations

import socket
import ssl
import sys
import threading
from pathlib import Path

import pytest

from osfleet.tls import KeyPair, dns_names_of, issue, make_ca
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "infra"))
from osfleet_infra.providers import CaProvider  # noqa: E402

pytestmark = pytest.mark.unit


def handshake(tmp: Path, ca: KeyPair, leaf: KeyPair, server_hostname: str) -> str:
    """``"ok"``, or OpenSSL's verification message for a client that trusts ``ca`` and asks for ``server_hostname``."""
    for name, pem in (("ca.pem", ca.cert_pem), ("cert.pem", leaf.cert_pem), ("key.pem", leaf.key_pem)):
        (tmp / name).write_text(pem)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp / "cert.pem", tmp / "key.pem")
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def serve() -> None:
            conn, _ = listener.accept()
            try:
                server_ctx.wrap_socket(conn, server_side=True).close()
            except (ssl.SSLError, OSError):
                conn.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        client_ctx = ssl.create_default_context(cafile=str(tmp / "ca.pem"))
        try:
            conn = socket.create_connection(listener.getsockname())
            with client_ctx.wrap_socket(conn, server_hostname=server_hostname):
                return "ok"
        except ssl.SSLCertVerificationError as exc:
            return str(exc.verify_message)
        finally:
            thread.join(10)


def test_a_ca_without_dns_names_vouches_for_addresses_and_no_site(tmp_path: Path) -> None:
    ca = make_ca("stack CA", dns_names=[])
    assert handshake(tmp_path, ca, issue(ca, ["127.0.0.1"]), "127.0.0.1") == "ok"
    assert handshake(tmp_path, ca, issue(ca, ["example.com"]), "example.com") == "permitted subtree violation"


def test_a_ca_vouches_for_its_stacks_dns_names_only(tmp_path: Path) -> None:
    names = ["osfleet-gateway.osfleet.svc", "127.0.0.1"]
    ca = make_ca("k8s CA", dns_names=dns_names_of(names))
    assert handshake(tmp_path, ca, issue(ca, names), "osfleet-gateway.osfleet.svc") == "ok"
    assert handshake(tmp_path, ca, issue(ca, ["www.example.org"]), "www.example.org") == "permitted subtree violation"


def test_an_unconstrained_ca_signs_any_name(tmp_path: Path) -> None:
    ca = make_ca("lab CA")  # the k8s lab's own, never in a shell's trust
    assert handshake(tmp_path, ca, issue(ca, ["example.com"]), "example.com") == "ok"


def test_a_stacks_ca_is_made_anew_when_it_predates_constraints_or_its_names_change(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path))  # the CA it makes is recorded there, not in this machine's
    ca = CaProvider().create({"common_name": "t", "dns_names": ["a.example"]}).outs
    assert CaProvider().diff("id", ca, {"common_name": "t", "dns_names": ["a.example"]}).changes is False
    assert CaProvider().diff("id", ca, {"common_name": "t", "dns_names": ["b.example"]}).changes is True
    old = {k: v for k, v in ca.items() if k != "dns_names"}
    assert CaProvider().diff("id", old, {"common_name": "t", "dns_names": []}).changes is True
