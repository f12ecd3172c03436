"""Python dynamic providers that act on hosts over SSH through the project's ``Host`` wrapper.

Each spells out ``diff``: which inputs force a replacement (a different host, a different image) and which
are updated in place (a new warm-pool size restarts only the agent). Errors leave as ``OsfleetError``s
whose one-line message the engine shows next to the resource.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shlex
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from osfleet.errors import CommandFailedError, ImageInUseError
from osfleet.imaging.host import Host
from osfleet.vm.host_tune import ksm_for_tenancy, ksm_writes
from osfleet_infra.remote import CONN_KEYS, host_of

q = shlex.quote
SYSCTL_FILE = "/etc/sysctl.d/90-osfleet.conf"
# What a large fleet needs from the kernel: many QEMU processes and their mappings.
FLEET_SYSCTLS = {"vm.max_map_count": "1048576", "kernel.pid_max": "4194304", "fs.inotify.max_user_instances": "8192"}
AGENT_START_SECONDS = 300.0


def _diff(olds: dict[str, Any], news: dict[str, Any], keys: list[str], replace_keys: tuple[str, ...]) -> DiffResult:
    changes = [k for k in keys if olds.get(k) != news.get(k)]
    return DiffResult(
        changes=bool(changes), replaces=[k for k in changes if k in replace_keys], delete_before_replace=True
    )


# --- KvmHost: prepare a host ---------------------------------------------------------------------------------


class HostPrepProvider(ResourceProvider):
    """Packages, daemons, /dev/kvm, kernel settings, image store and the osfleet command on one host."""

    KEYS = [*CONN_KEYS, "packages", "home", "osfleet_bin", "osfleet_pip_spec", "tune_kernel", "tenancy"]

    def create(self, props: dict[str, Any]) -> CreateResult:
        with host_of(props) as host:
            outs = dict(props)
            outs.update(_prepare(host, props))
        return CreateResult(id_=f"{props['addr']}:{props['home']}", outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return _diff(olds, news, self.KEYS, (*CONN_KEYS, "home"))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        with host_of(news) as host:
            outs = dict(news)
            outs.update(_prepare(host, news))
            if olds.get("made_sysctl_file") and not news["tune_kernel"]:
                host.run(f"rm -f {SYSCTL_FILE}")
                outs["made_sysctl_file"] = False
            else:
                outs["made_sysctl_file"] = bool(olds.get("made_sysctl_file") or outs.get("made_sysctl_file"))
        return UpdateResult(outs=outs)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        """Remove what create made: the sysctl file and the empty store/home folders (packages and the shared
        daemons stay: other software on the host may use them)."""
        with host_of(props) as host:
            if props.get("made_sysctl_file"):
                host.run(f"rm -f {SYSCTL_FILE}", what="removing the fleet sysctls")
            home = str(props["home"])
            host.probe(f"rmdir {q(home + '/images')} 2>/dev/null")
            if props.get("made_home"):
                host.probe(f"rmdir {q(home)} 2>/dev/null")


def prep_steps(packages: list[str], tune_kernel: bool, home: str, tenancy: str = "multi") -> list[tuple[str, str]]:
    """The host preparation as (what, shell command) steps, each idempotent: run over SSH by ``KvmHost`` and
    as cloud-init ``runcmd`` on EC2, so both prepare a host the same way. KSM as ``osfleet host tune`` would
    set it for ``tenancy`` (``osfleet.vm.host_tune``'s rule: on only when every replica serves one user)."""
    pk = " ".join(q(p) for p in packages)
    steps = [
        (
            "installing packages",
            f"missing=$(for p in {pk}; do dpkg-query -W -f='${{Status}}' \"$p\" 2>/dev/null | grep -q 'ok installed' "
            '|| echo "$p"; done); [ -z "$missing" ] || { apt-get update -q && DEBIAN_FRONTEND=noninteractive '
            "apt-get install -y -q --no-install-recommends $missing; }",
        ),
        (
            "giving /dev/kvm to group kvm",
            'if [ -c /dev/kvm ] && [ "$(stat -c %G:%a /dev/kvm)" != kvm:660 ]; then '
            "chgrp kvm /dev/kvm && chmod 0660 /dev/kvm; fi",
        ),
        (
            "starting libvirtd",
            "if [ -d /run/systemd/system ]; then systemctl enable --now virtlogd libvirtd; "
            "else pgrep -x virtlogd >/dev/null || virtlogd -d; pgrep -x libvirtd >/dev/null || libvirtd -d; fi; "
            "for i in $(seq 1 60); do virsh -c qemu:///system version >/dev/null 2>&1 && exit 0; sleep 0.5; done; "
            "virsh -c qemu:///system version",
        ),
    ]
    if tune_kernel:
        body = "".join(f"{k} = {v}\\n" for k, v in FLEET_SYSCTLS.items())
        wanted, why = ksm_for_tenancy("single" if tenancy == "single" else "multi")
        ksm = "; ".join(
            f"[ -w /sys/kernel/mm/ksm/{k} ] && echo {v} > /sys/kernel/mm/ksm/{k}" for k, v in ksm_writes(wanted)
        )
        steps.append(
            (
                f"applying the fleet sysctls; KSM {why.split(':')[0]}",
                f"printf '# written by osfleet (KvmHost)\\n{body}' > {SYSCTL_FILE} "
                f"&& sysctl -q -p {SYSCTL_FILE}; {ksm}; true",
            )
        )
    steps.append(("creating the image store", f"mkdir -p {q(home + '/images')}"))
    return steps


def _prepare(host: Host, props: dict[str, Any]) -> dict[str, Any]:
    home = str(props["home"])
    made_home = not host.exists(home)
    made_sysctl = bool(props["tune_kernel"]) and not host.exists(SYSCTL_FILE)
    # A fresh cloud host may still be running its own preparation (cloud-init holds the apt lock).
    host.run("if command -v cloud-init >/dev/null; then cloud-init status --wait >/dev/null || true; fi", timeout=1800)
    steps = prep_steps(list(props["packages"]), bool(props["tune_kernel"]), home, str(props.get("tenancy") or "multi"))
    for what, command in steps:
        host.run(command, timeout=1800, what=what)
    bin_ = str(props["osfleet_bin"])
    spec = str(props.get("osfleet_pip_spec") or "")
    if spec and not host.probe(f"{q(bin_)} --version"):
        venv = str(Path(bin_).parent.parent)
        host.run(
            f"python3 -m venv {q(venv)} && {q(venv)}/bin/pip install -q {q(spec)}",
            timeout=1800,
            what=f"installing osfleet into {venv}",
        )
    version = host.run(f"{q(bin_)} --version", what="checking the osfleet command").strip()
    # What the capacity outputs divide by the measured per-replica footprint.
    vcpus = int(host.run("nproc").strip())
    mem_kib = int(host.run("awk '/^MemTotal:/ {print $2}' /proc/meminfo").strip())
    return {
        "made_home": made_home,
        "made_sysctl_file": made_sysctl,
        "osfleet_version": version,
        "vcpus": vcpus,
        "memory_gib": round(mem_kib / 2**20, 2),
    }


# --- GoldenImage: build once here, publish to every host -----------------------------------------------------


class ImageBuildProvider(ResourceProvider):
    """The golden image of a recipe, built on this machine (a cache hit when the recipe hash is known).

    Delete keeps the build: the build folder is this machine's content-addressed cache, shared by every
    stack and by ``osfleet image build``, and the image can take many minutes to rebuild.
    """

    def create(self, props: dict[str, Any]) -> CreateResult:
        from invoke import Context

        from osfleet.imaging import builder
        from osfleet.vm.images import load

        files = builder.build(Host(Context(), echo=False), Path(props["recipe"]), props.get("build_dir") or None)
        image = load(Path(files.manifest))
        if image.manifest["recipe_hash"] != props["recipe_hash"]:
            raise CommandFailedError(f"built {image.name} but the program expected golden-{props['recipe_hash']}")
        return CreateResult(
            id_=image.name,
            outs={
                **props,
                "name": image.name,
                "manifest": files.manifest,
                "disk_sha256": image.manifest["disk_sha256"],
            },
        )

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return _diff(olds, news, ["recipe", "recipe_hash", "build_dir"], ("recipe_hash", "build_dir"))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs={**olds, **news})  # same recipe hash: the recipe file moved, the image did not

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        return None


class ImagePublishProvider(ResourceProvider):
    """One golden image in one host's read-only store, checksum-checked (``osfleet.imaging.publisher``)."""

    KEYS = [*CONN_KEYS, "name", "manifest", "disk_sha256", "store"]

    def create(self, props: dict[str, Any]) -> CreateResult:
        from osfleet.imaging.publisher import publish
        from osfleet.vm.images import load

        image = load(Path(props["manifest"]))
        with host_of(props) as host:
            disk = publish(host, image, store=str(props["store"]))
        return CreateResult(id_=f"{props['addr']}:{disk}", outs={**props, "disk": disk})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return _diff(olds, news, self.KEYS, tuple(self.KEYS))

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        """Remove this image's files from the store, unless a process (a replica's QEMU) still holds it."""
        from osfleet.imaging.publisher import pids_using

        stem = f"{props['store']}/{props['name']}"
        with host_of(props) as host:
            users = pids_using(host, f"{stem}.qcow2") if host.exists(f"{stem}.qcow2") else []
            if users:
                raise ImageInUseError(
                    f"{stem}.qcow2 on {props['addr']} is in use by pid(s) {', '.join(map(str, users))}; "
                    "stop its replicas first"
                )
            host.run(
                f"rm -f {q(stem)}.json {q(stem)}.qcow2 {q(stem)}.vmlinuz {q(stem)}.initrd", what="removing the image"
            )


# --- TLS between the gateway (or any client) and the agents: a CA per stack, a certificate per agent -----------


def _trust(cert_pem: str, trusted: bool) -> None:
    """The CA's certificate (public) among those a shell with ``osfleet infra env`` trusts (``tls.trust_bundle``)
    while the stack exists. A convenience for that shell only: a failure to write it never fails the deploy."""
    from osfleet.config import Settings
    from osfleet.tls import trust_stack_ca

    if cert_pem:
        with contextlib.suppress(OSError):
            trust_stack_ca(Settings.from_env().home, cert_pem, trusted)


class TokenProvider(ResourceProvider):
    """A random bearer token made once (``secrets.token_urlsafe``) and kept only in the stack's state, encrypted as
    a secret: the ``k8s`` stack's agents' token when ``osfleet:agentToken`` is not set."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        import secrets

        token = secrets.token_urlsafe(32)
        return CreateResult(id_=hashlib.sha256(token.encode()).hexdigest()[:16], outs={**props, "token": token})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return DiffResult(changes=False, replaces=[], delete_before_replace=False)


class CaProvider(ResourceProvider):
    """A small CA made by the stack (``osfleet.tls.make_ca``): its key lives only in the stack's state, encrypted
    as a secret (``additional_secret_outputs``). Outside the state only its public certificate, in this machine's
    bundle for ``osfleet infra env`` (removed on delete). It may sign for the DNS names in ``dns_names`` alone
    (a name constraint: none when empty; addresses are not constrained), so its place in that bundle vouches for
    no web site. Renewed (replaced, and every certificate with it) by an ``up`` within ``RENEW_DAYS`` of its end,
    and replaced when the stack's DNS names change."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        from osfleet.tls import make_ca

        ca = make_ca(str(props["common_name"]), dns_names=[str(n) for n in props.get("dns_names") or []])
        _trust(ca.cert_pem, True)
        return CreateResult(
            id_=_fingerprint(ca.cert_pem), outs={**props, "cert_pem": ca.cert_pem, "key_pem": ca.key_pem}
        )

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        _trust(str(props.get("cert_pem", "")), False)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        from osfleet.tls import needs_renewal

        renew = needs_renewal(str(olds.get("cert_pem", "")))
        names_changed = list(olds.get("dns_names") or []) != list(news.get("dns_names") or [])
        changed = olds.get("common_name") != news.get("common_name") or renew or names_changed
        changed = changed or "dns_names" not in olds  # a CA made before name constraints: made anew, constrained
        return DiffResult(changes=changed, replaces=["cert_pem"] if changed else [], delete_before_replace=False)


class CertProvider(ResourceProvider):
    """A server certificate for an agent's addresses, signed by the stack's CA (``osfleet.tls.issue``). Issued
    again (an update, which restarts the agent onto it) when the addresses or the CA change, or by an ``up``
    within ``RENEW_DAYS`` of its end."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = self._issue(props)
        return CreateResult(id_=_fingerprint(outs["cert_pem"]), outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        from osfleet.tls import needs_renewal

        changed = (
            list(olds.get("names") or []) != list(news.get("names") or [])
            or olds.get("ca_cert_pem") != news.get("ca_cert_pem")
            or needs_renewal(str(olds.get("cert_pem", "")))
        )
        return DiffResult(changes=changed, replaces=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=self._issue(news))

    @staticmethod
    def _issue(props: dict[str, Any]) -> dict[str, Any]:
        from osfleet.tls import KeyPair, issue

        names = [str(n) for n in props["names"]]
        leaf = issue(KeyPair(str(props["ca_cert_pem"]), str(props["ca_key_pem"])), names)
        # The CA's key is an input only: it is not kept in this resource's outputs.
        return {"names": names, "ca_cert_pem": props["ca_cert_pem"], "cert_pem": leaf.cert_pem, "key_pem": leaf.key_pem}


def _fingerprint(cert_pem: str) -> str:
    import hashlib

    return hashlib.sha256(cert_pem.encode()).hexdigest()[:32]


# --- HostAgent: `osfleet host serve` as a supervised service ------------------------------------------------


class AgentProvider(ResourceProvider):
    """The host agent under a small restart-loop supervisor (setsid + pid file), or a systemd unit's
    equivalent where none runs; over HTTPS with the certificate the stack made for it (files 0600 in the agent's
    folder); healthy on ``/health``, verified against the stack's CA, before create or update returns."""

    KEYS = [
        *CONN_KEYS,
        "home",
        "name_prefix",
        "osfleet_bin",
        "bind",
        "url_host",
        "agent_port",
        "warm",
        "mode",
        "image",
        "token",
        "tls_cert",
        "tls_key",
        "ca_cert",
        "tenancy",
    ]
    REPLACE = (*CONN_KEYS, "home", "name_prefix")

    def create(self, props: dict[str, Any]) -> CreateResult:
        props = _ints(props)
        with host_of(props) as host:
            try:
                _start_agent(host, props)
            except BaseException:
                # A failed create is not recorded in the state, so nothing would ever delete it: undo it here.
                _stop_agent(host, props)
                host.probe(f"rm -rf {q(_agent_dir(props))}")
                raise
        return CreateResult(id_=f"{props['addr']}:{props['agent_port']}", outs={**props, "url": _url(props)})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return _diff(olds, news, self.KEYS, self.REPLACE)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        """Restart only the agent with its new settings (its replicas' records stay in its home)."""
        olds, news = _ints(olds), _ints(news)
        with host_of(news) as host:
            _stop_agent(host, olds)
            _start_agent(host, news)
        return UpdateResult(outs={**news, "url": _url(news)})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        """Stop the agent, then remove its replicas, saved states and its folder."""
        props = _ints(props)
        with host_of(props) as host:
            _stop_agent(host, props)
            host.run(
                f"{_env(props)} {q(props['osfleet_bin'])} replicas down --all --states --force",
                timeout=600,
                what="removing the agent's replicas",
            )
            host.run(f"rm -rf {q(_agent_dir(props))}", what="removing the agent's folder")


def _ints(props: dict[str, Any]) -> dict[str, Any]:
    """Numbers come back from the engine as floats (8080.0); the agent's command line needs whole numbers."""
    return {**props, **{k: int(props[k]) for k in ("port", "agent_port", "warm") if k in props}}


def _agent_dir(props: dict[str, Any]) -> str:
    return f"{props['home']}/agent"


def _tls(props: dict[str, Any]) -> bool:
    return bool(props.get("tls_cert"))


def _url(props: dict[str, Any]) -> str:
    host = str(props.get("url_host") or props["bind"])
    host = f"[{host}]" if ":" in host else host
    return f"{'https' if _tls(props) else 'http'}://{host}:{props['agent_port']}"


def _env(props: dict[str, Any]) -> str:
    return (
        f"OSFLEET_HOME={q(str(props['home']))} OSFLEET_NAME_PREFIX={q(str(props['name_prefix']))} "
        f"OSFLEET_TENANCY={q(str(props.get('tenancy') or 'multi'))}"
    )


def _supervisor(props: dict[str, Any]) -> str:
    """A restart loop: the agent runs again 2 s after any exit; SIGTERM stops the agent and the loop."""
    d = _agent_dir(props)
    serve = " ".join(
        q(str(a))
        for a in [
            props["osfleet_bin"], "host", "serve", "--bind", props["bind"], "--port", props["agent_port"],
            "--warm", props["warm"], "--mode", props["mode"], "--image", props["image"],
            "--token-file", f"{d}/token",
            *(["--tls-cert", f"{d}/tls.crt", "--tls-key", f"{d}/tls.key"] if _tls(props) else []),
        ]
    )  # fmt: skip
    return f"""#!/bin/sh
# osfleet host agent supervisor (written by Pulumi HostAgent); stop it with SIGTERM to its pid.
export {_env(props)}
echo $$ > {q(d)}/supervisor.pid
child=
trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; wait "$child"; rm -f {q(d)}/supervisor.pid; exit 0' TERM INT
while true; do
  {serve} &
  child=$!
  wait "$child"
  echo "$(date -u +%FT%TZ) osfleet host serve exited with status $?; restarting in 2 s" >&2
  sleep 2
done
"""


def _start_agent(host: Host, props: dict[str, Any]) -> None:
    d = _agent_dir(props)
    host.run(f"mkdir -p {q(d)} && chmod 0700 {q(d)}", what="creating the agent folder")
    host.write_file(f"{d}/token", str(props["token"]) + "\n", 0o600)
    if _tls(props):
        host.write_file(f"{d}/tls.crt", str(props["tls_cert"]), 0o600)
        host.write_file(f"{d}/tls.key", str(props["tls_key"]), 0o600)
    host.write_file(f"{d}/supervise.sh", _supervisor(props), 0o700)
    host.run(
        f"setsid sh {q(d)}/supervise.sh >> {q(d)}/agent.log 2>&1 < /dev/null &",
        what="starting the host agent",
    )
    _wait_healthy(host, props)


def _wait_healthy(host: Host, props: dict[str, Any]) -> None:
    """Poll ``/health`` from this machine (the caller's side) until it answers 200, verifying the agent's
    certificate against the stack's CA (what a gateway will do)."""
    from osfleet.tls import client_context

    url = _url(props) + "/health"
    ctx = client_context(ca_pem=str(props["ca_cert"])) if _tls(props) else None
    deadline = time.monotonic() + AGENT_START_SECONDS
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
                if resp.status == 200:
                    json.load(resp)
                    return
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            last = str(getattr(exc, "reason", exc))
        time.sleep(1.0)
    tail = host.run(f"tail -n 3 {q(_agent_dir(props))}/agent.log || true").strip().splitlines()
    raise CommandFailedError(
        f"host agent on {props['addr']} not healthy at {url} after {AGENT_START_SECONDS:.0f} s ({last})"
        + (f"; log: {tail[-1]}" if tail else "")
    )


def _stop_agent(host: Host, props: dict[str, Any]) -> None:
    """Stop the supervisor recorded in the pid file (only if that pid still runs our script) and its agent."""
    d = _agent_dir(props)
    host.run(
        f"p=$(cat {q(d)}/supervisor.pid 2>/dev/null) || exit 0; "
        f'tr "\\0" " " < /proc/$p/cmdline 2>/dev/null | grep -qF {q(d + "/supervise.sh")} || exit 0; '
        'kill -TERM "$p"; for i in $(seq 1 600); do kill -0 "$p" 2>/dev/null || exit 0; sleep 0.1; done; '
        'echo "supervisor $p did not stop" >&2; exit 1',
        timeout=90,
        what="stopping the host agent",
    )
