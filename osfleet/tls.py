"""TLS and proxy trust for osfleet's listeners, and the verifying contexts its clients use, in one place.

Listeners (``host serve``, ``fleet serve``, ``openenv serve``) take ``--tls-cert F --tls-key F`` and
``--trusted-proxy IP`` through ``listener_options``, which checks them before anything starts (a missing,
unreadable, expired or mismatched pair is one line, not a traceback from inside uvicorn) and hands the command a
``Listener`` whose ``uvicorn_options()`` go straight to ``uvicorn.run``.

Why the server context is built here rather than by uvicorn's ``ssl_*`` options: uvicorn's default cipher string
(``TLSv1``) still admits CBC/SHA-1 suites under TLS 1.2. Ours allows TLS 1.2 and up, and under 1.2 only forward
secret AEAD suites (TLS 1.3's suites are OpenSSL's, all AEAD).

Why forwarded headers are off unless asked: uvicorn by default believes ``X-Forwarded-For`` from loopback, so any
process on the host (or anything tunnelled through it) could claim another address — and addresses decide the
OSGym allow-list and the loopback-only ``/metrics``. With ``--trusted-proxy`` the header is believed only from
those peers (addresses or networks, checked here because uvicorn silently treats a malformed one as a literal).

Clients never skip verification: ``client_context(ca_file)`` verifies against that CA file only (a private CA,
such as the one the infra stacks make) or, without one, against the system's CAs. There is no "insecure" switch.

Certificates: ``make_ca`` and ``issue`` make a small CA and certificates for host addresses (ECDSA P-256). The
Pulumi stacks make theirs with them, and the tests theirs; an operator may equally bring certificates of their own.
"""

from __future__ import annotations

import datetime as dt
import functools
import ipaddress
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from osfleet.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])

SERVER_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")  # Debian's ca-certificates
CA_DAYS = 3650
CERT_DAYS = 397  # what public CAs may issue at most; infra renews within RENEW_DAYS of the end
RENEW_DAYS = 30


# --- listeners -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Listener:
    """How a server listens: TLS (certificate and key files) or plain HTTP, and which peers may forward."""

    tls_cert: Path | None = None
    tls_key: Path | None = None
    trusted_proxies: tuple[str, ...] = ()

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"

    def url(self, bind: str, port: int) -> str:
        host = f"[{bind}]" if ":" in bind else bind
        return f"{self.scheme}://{host}:{port}"

    def server_context(self) -> ssl.SSLContext | None:
        if self.tls_cert is None:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers(SERVER_CIPHERS)
        ctx.load_cert_chain(self.tls_cert, self.tls_key)
        return ctx

    def uvicorn_options(self) -> dict[str, Any]:
        """Keyword arguments for ``uvicorn.run``/``uvicorn.Config``."""
        opts: dict[str, Any] = {
            "proxy_headers": bool(self.trusted_proxies),
            "forwarded_allow_ips": list(self.trusted_proxies) or None,
        }
        if self.tls_cert is not None:
            context = self.server_context()
            opts["ssl_certfile"] = str(self.tls_cert)  # uvicorn serves TLS when this is set...
            opts["ssl_keyfile"] = str(self.tls_key)
            opts["ssl_context_factory"] = lambda config, default: context  # ...with our context
        return opts


def listener(tls_cert: Path | None, tls_key: Path | None, trusted_proxies: Sequence[str] = ()) -> Listener:
    """A checked ``Listener``: both TLS files or neither, a pair that loads and matches, proxies that parse."""
    if (tls_cert is None) != (tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together: give both (or neither, for plain HTTP)")
    proxies = tuple(_proxy(p) for p in trusted_proxies)
    if tls_cert is None or tls_key is None:
        return Listener(trusted_proxies=proxies)
    check_server_pair(tls_cert, tls_key)
    return Listener(tls_cert, tls_key, proxies)


def _proxy(value: str) -> str:
    try:
        net = ipaddress.ip_network(value.strip(), strict=False)
    except ValueError:
        raise ConfigError(
            f"--trusted-proxy {value!r}: not an IP address or network (e.g. 10.0.0.7, 10.0.0.0/24)"
        ) from None
    if net.prefixlen == 0:
        raise ConfigError(f"--trusted-proxy {value}: would let every peer claim any address; name your proxies")
    return str(net.network_address) if net.num_addresses == 1 else str(net)


def check_server_pair(cert: Path, key: Path) -> None:
    """Raise a one-line ``ConfigError`` unless ``cert`` and ``key`` are readable, are PEM, belong together and
    the certificate is valid now."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    for what, path in (("--tls-cert", cert), ("--tls-key", key)):
        _readable(what, path)
    try:
        start, end = validity(cert.read_bytes())
    except ConfigError as exc:
        raise ConfigError(f"--tls-cert {cert}: {exc}") from None
    try:
        load_pem_private_key(key.read_bytes(), password=None)
    except (ValueError, TypeError):
        raise ConfigError(f"--tls-key {key}: not an unencrypted PEM private key") from None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise ConfigError(f"--tls-key {key} is not the key of the certificate in --tls-cert {cert}") from None
        raise ConfigError(f"--tls-cert {cert} / --tls-key {key}: cannot be loaded ({_ssl_reason(exc)})") from None
    now = dt.datetime.now(dt.UTC)
    if now > end:
        raise ConfigError(f"--tls-cert {cert}: expired on {end:%Y-%m-%d}; clients would refuse it")
    if now < start:
        raise ConfigError(f"--tls-cert {cert}: not valid before {start:%Y-%m-%d %H:%M} UTC")


def listener_options(fn: F) -> F:
    """``--tls-cert``, ``--tls-key`` and ``--trusted-proxy`` for a server command, passed to it checked as one
    ``listener: Listener`` argument. Put it right above the command's ``def`` (under ``friendly``)."""

    @functools.wraps(fn)
    def wrapper(
        *args: Any, tls_cert: Path | None, tls_key: Path | None, trusted_proxy: tuple[str, ...], **kw: Any
    ) -> Any:
        return fn(*args, listener=listener(tls_cert, tls_key, trusted_proxy), **kw)

    options = [
        click.option(
            "--tls-cert",
            type=click.Path(path_type=Path, dir_okay=False),
            default=None,
            help="serve HTTPS with this PEM certificate (chain); needs --tls-key",
        ),
        click.option(
            "--tls-key", type=click.Path(path_type=Path, dir_okay=False), default=None, help="its PEM private key"
        ),
        click.option(
            "--trusted-proxy",
            multiple=True,
            metavar="IP",
            help="believe X-Forwarded-For/-Proto only from this proxy address or network (repeatable; default: none)",
        ),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]


# --- clients -------------------------------------------------------------------------------------------------
def client_context(ca_file: Path | str | None = None, *, ca_pem: str | None = None) -> ssl.SSLContext:
    """A context that verifies servers (certificate chain and host name): against ``ca_file`` (or the PEM text
    ``ca_pem``) alone when given, else the system's CAs."""
    if ca_pem is not None:
        try:
            return ssl.create_default_context(cadata=ca_pem)
        except ssl.SSLError as exc:
            raise ConfigError(f"not a PEM CA certificate ({_ssl_reason(exc)})") from None
    if ca_file is None:
        return ssl.create_default_context()
    path = Path(ca_file)
    _readable("CA file", path)
    try:
        ctx = ssl.create_default_context(cafile=str(path))
    except ssl.SSLError as exc:
        raise ConfigError(f"CA file {path}: not a PEM certificate ({_ssl_reason(exc)})") from None
    if not ctx.get_ca_certs():
        raise ConfigError(f"CA file {path}: holds no CA certificate")
    return ctx


def _readable(what: str, path: Path) -> None:
    try:
        with path.open("rb") as f:
            head = f.read(1)
    except FileNotFoundError:
        raise ConfigError(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path}: is a folder, not a PEM file") from None
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read it ({exc.strerror})") from None
    if not head:
        raise ConfigError(f"{what} {path}: is empty")


def _ssl_reason(exc: ssl.SSLError) -> str:
    """OpenSSL's reason code in words (``KEY_VALUES_MISMATCH`` -> "key values mismatch")."""
    return str(exc.reason or exc.strerror or exc).lower().replace("_", " ")


def describe_tls_error(exc: BaseException) -> str | None:
    """A short reason when ``exc`` is a certificate or handshake failure, else None (callers keep their own)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS: the host's certificate is not trusted ({exc.verify_message})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake failed ({_ssl_reason(exc)})"
    return None


# --- certificates --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM private key (unencrypted: keep it a secret, mode 0600)."""

    cert_pem: str
    key_pem: str


# The permitted DNS subtree of a CA that may name no host by DNS at all (a reserved name, RFC 2606).
NO_DNS_NAMES = "osfleet.invalid"


def make_ca(common_name: str, days: int = CA_DAYS, dns_names: Sequence[str] | None = None) -> KeyPair:
    """A self-signed CA that may sign server certificates only (path length 0).

    ``dns_names``: the only DNS names its certificates may carry (a critical name constraint; none at all when the
    list is empty). A stack's CA sits in the bundle ``osfleet infra env`` exports as ``SSL_CERT_FILE``: constrained,
    its key, if it ever leaked, could not vouch for any web site in that shell, only for the stack's own names and
    addresses. None: unconstrained (a CA that no shell trusts, such as the k8s lab's)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .add_extension(ski, critical=False)
    )
    if dns_names is not None:
        permitted = [x509.DNSName(n) for n in dict.fromkeys(dns_names)] or [x509.DNSName(NO_DNS_NAMES)]
        constraints = x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=None)
        builder = builder.add_extension(constraints, critical=True)
    return KeyPair(_cert_pem(builder.sign(key, hashes.SHA256())), _key_pem(key))


def issue(
    ca: KeyPair,
    names: Sequence[str],
    days: int = CERT_DAYS,
    *,
    common_name: str | None = None,
    groups: Sequence[str] = (),
    server: bool = True,
    client: bool = False,
) -> KeyPair:
    """A certificate signed by ``ca``: for a server at ``names`` (IP addresses and DNS names, in subjectAltName),
    and/or for a client (``client``) named ``common_name`` in ``groups`` (the subject's O=, as Kubernetes reads
    a client certificate's user and groups)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if server and not names:
        raise ConfigError("a server certificate needs at least one address or DNS name")
    if not server and not client:
        raise ConfigError("a certificate is for a server, a client or both")
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.encode())
    ca_key = serialization.load_pem_private_key(ca.key_pem.encode(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ConfigError("the CA key is not an EC key made by osfleet.tls.make_ca")
    key = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = []
    for n in dict.fromkeys(names):
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            alt.append(x509.DNSName(n))
    subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    # A server certificate for an address gets a common name that is no host name (OpenSSL checks a host-name-like
    # common name against a CA's DNS name constraints when no DNS name is in subjectAltName).
    subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name or _server_common_name(names[0])))
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(_cert_pem(cert), _key_pem(key))


def _server_common_name(name: str) -> str:
    try:
        return f"osfleet {ipaddress.ip_address(name)}"
    except ValueError:
        return name


def dns_names_of(names: Sequence[str]) -> list[str]:
    """The DNS names among host names and addresses (what a constrained CA must permit), sorted, once each."""
    out = set()
    for n in names:
        try:
            ipaddress.ip_address(n)
        except ValueError:
            out.add(n)
    return sorted(out)


def validity(cert_pem: bytes | str) -> tuple[dt.datetime, dt.datetime]:
    """(not before, not after) of the first certificate in ``cert_pem``, in UTC."""
    from cryptography import x509

    data = cert_pem.encode() if isinstance(cert_pem, str) else cert_pem
    try:
        cert = x509.load_pem_x509_certificate(data)
    except ValueError as exc:
        raise ConfigError(f"not a PEM certificate ({str(exc).splitlines()[0]})") from None
    return cert.not_valid_before_utc, cert.not_valid_after_utc


def needs_renewal(cert_pem: str, days: int = RENEW_DAYS) -> bool:
    """Whether ``cert_pem`` ends within ``days`` (or is not a certificate at all)."""
    try:
        _, end = validity(cert_pem)
    except ConfigError:
        return True
    return end - dt.datetime.now(dt.UTC) < dt.timedelta(days=days)


def _cert_pem(cert: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    return str(cert.public_bytes(serialization.Encoding.PEM).decode())


def _key_pem(key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return str(pem.decode())


__all__ = [
    "KeyPair",
    "Listener",
    "client_context",
    "describe_tls_error",
    "issue",
    "listener",
    "listener_options",
    "dns_names_of",
    "make_ca",
    "needs_renewal",
    "validity",
]


# --- the CAs of stacks deployed from this machine, trusted by a shell that evaluated ``osfleet infra env`` -------
def trust_bundle(home: Path) -> Path:
    """The file ``osfleet infra env`` exports as ``SSL_CERT_FILE``: the system's CAs and those of the stacks
    deployed from this machine, so that in that shell Python, curl and Go verify the agents' HTTPS as they verify
    any site (a stack's CA exists from its first ``pulumi up`` until its ``destroy``)."""
    return home / "pulumi" / "trusted-cas.pem"


def trust_stack_ca(home: Path, cert_pem: str, trusted: bool = True) -> None:
    """Add (``trusted``) or remove one stack CA's certificate, then rewrite the bundle (atomically)."""
    import hashlib

    folder = home / "pulumi" / "stack-cas"
    folder.mkdir(parents=True, exist_ok=True)
    entry = folder / f"{hashlib.sha256(cert_pem.encode()).hexdigest()[:16]}.pem"
    if trusted:
        entry.write_text(cert_pem)
    else:
        entry.unlink(missing_ok=True)
    write_trust_bundle(home)


def write_trust_bundle(home: Path) -> Path:
    """The bundle made anew from the system's CAs and the stack CAs recorded here; returns its path."""
    bundle = trust_bundle(home)
    bundle.parent.mkdir(parents=True, exist_ok=True)
    parts = [SYSTEM_CA_BUNDLE.read_text()] if SYSTEM_CA_BUNDLE.is_file() else []
    folder = home / "pulumi" / "stack-cas"
    parts += [p.read_text() for p in sorted(folder.glob("*.pem"))] if folder.is_dir() else []
    tmp = bundle.with_name(f".{bundle.name}.tmp")
    tmp.write_text("".join(part if part.endswith("\n") else part + "\n" for part in parts))
    tmp.replace(bundle)
    return bundle
