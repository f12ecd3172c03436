"""Bring the k8s lab up and take it down: a real cluster on this machine.

``up`` starts, each as a process of this machine inside the lab's network namespace (``state.py``): etcd, the
API server, the controller manager and the scheduler; containerd (with runc and the CNI bridge) and a kubelet
that registers this machine as node ``osfleet-node``, labelled for KVM, whose pods reach the machine's libvirtd
through its socket; kube-proxy (Services, NodePorts), CoreDNS (cluster DNS on the node's address) and, for
``--kwok-nodes N``, kwok playing the kubelet of N simulated nodes. Every binary comes from
``scripts/build-k8s`` (built from the Go module proxy once per machine).

``down`` removes all of it whatever state ``up`` reached: the processes (components, containers and their
shims), the node's replica domains, every mount under the lab's folder, the kubelet's cgroups, the namespace
(and with it the cluster's links, routes and iptables rules), the kernel settings the kubelet changed, the
files. ``leftovers`` counts what of that still exists (all zero after ``down``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from osfleet.config import Settings
from osfleet.errors import CommandFailedError, ConfigError, OsfleetError
from osfleet.lab import net
from osfleet.lab.kube import configs
from osfleet.lab.kube.state import (
    CGROUP_ROOT,
    KUBELET_SYSCTLS,
    KVM_LABEL,
    NAME_PREFIX,
    NETNS,
    NODE_NAME,
    KubeLabState,
    load,
    save,
    state_path,
)
from osfleet.lab.proc import alive, run, stop

Say = Callable[[str], None]
VETH_HOST, VETH_NS = f"{NETNS}-h", f"{NETNS}-n"
CGROUP_FS = Path("/sys/fs/cgroup")
START_TIMEOUT = 180.0  # seconds for one component to answer (the API server takes ~20 s on a busy machine)
KWOK_NAME = "kwok-node-{}"
# Stopped in this order by down: what would restart or recreate others first.
STOP_ORDER = ("kwok", "coredns", "kube-proxy", "kubelet", "kube-controller-manager", "kube-scheduler",
              "containerd", "kube-apiserver", "etcd")  # fmt: skip


# --- up ---------------------------------------------------------------------------------------------------------
def up(kwok_nodes: int, kwok_kvm: bool, root: Path, tools: Path, say: Say) -> KubeLabState:
    """Start the cluster (the binaries in ``tools``); on any failure or interrupt remove what was made, re-raise."""
    existing = load(root)
    if existing is not None and running(existing):
        raise ConfigError(f"a k8s lab is already up ({state_path(root)}); run 'osfleet lab k8s down' first")
    if existing is not None:
        say("k8s lab: the lab recorded here has no process running (a restart or a killed run left it); clearing it")
        down(root, say)
    if NETNS in _namespaces() or _mounts_under(root):
        raise ConfigError("leftovers of an earlier k8s lab exist; run 'osfleet lab k8s down'")
    if not (tools / "osfleet-k8s").exists():
        raise ConfigError(f"no cluster binaries in {tools}; run scripts/build-k8s")
    root.mkdir(parents=True, exist_ok=True)
    subnet = net.pick_subnet()
    s = KubeLabState(root=str(root), subnet=str(subnet), tools=str(tools), kwok_nodes=kwok_nodes, kwok_kvm=kwok_kvm)
    s.sysctls = {k: p.read_text().strip() for k in KUBELET_SYSCTLS if (p := Path(f"/proc/sys/{k}")).exists()}
    save(s)  # first, so that a failed or interrupted up is found by down
    started = time.monotonic()
    try:
        a = s.addresses
        net.create_host_link(NETNS, VETH_HOST, VETH_NS, a.host, a.node, 30)
        say(f"k8s lab: namespace {NETNS}, node {NODE_NAME} at {a.node} ({a.host} on this machine), pods {a.pods}, "
            f"services {a.services}")  # fmt: skip
        _write_files(s)
        _make_cgroups()
        _start_control_plane(s, say)
        _start_node(s, say)
        if kwok_nodes:
            _start_kwok(s, kwok_nodes, kwok_kvm, say)
        _prepare_node_store(s, say)
        s.ready = True
        save(s)
    except BaseException:
        say("k8s lab: up failed; removing what it made")
        down(root, say)
        raise
    say(f"k8s lab up in {time.monotonic() - started:.0f} s: {1 + kwok_nodes} nodes; KUBECONFIG={s.kubeconfig}")
    return s


def _write_files(s: KubeLabState) -> None:
    d = s.dir
    configs.write_pki(s)
    configs.write_kubeconfigs(s)
    for sub in ("etcd", "containerd", "kubelet", "cni/conf", "cni/ipam", "logs", "coredns"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "etcd").chmod(0o700)
    (d / "resolv.conf").write_text("# the k8s lab's pods resolve cluster names only (CoreDNS on the node)\n")
    (d / "kubelet" / "config.yaml").write_text(configs.kubelet_config(s))
    (d / "kube-proxy.yaml").write_text(configs.kube_proxy_config(s))
    (d / "containerd" / "config.toml").write_text(configs.containerd_config(s, pause_reference(s)))
    (d / "cni" / "conf" / "10-osfleet.conflist").write_text(configs.cni_config(s))
    (d / "coredns" / "Corefile").write_text(configs.corefile(s))
    (d / "rbac.yaml").write_text(configs.RBAC)


def pause_reference(s: KubeLabState) -> str:
    return f"localhost/pause:{Path(s.tools).parent.name}"


def _start_control_plane(s: KubeLabState, say: Say) -> None:
    d, a, pki = s.dir, s.addresses, s.dir / "pki"
    _start(s, "etcd", [
        "--name=osfleet-lab", f"--data-dir={d / 'etcd'}",
        "--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
        "--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
        "--initial-cluster=osfleet-lab=http://127.0.0.1:2380", f"--listen-metrics-urls=http://{a.node}:2381",
        # A throwaway lab on a shared disk: no fsync per write (etcd's latency there starves the API server).
        "--unsafe-no-fsync", "--log-level=warn",
    ], say)  # fmt: skip
    _wait_http(s, "etcd", f"http://{a.node}:2381/health", say)
    _start(s, "kube-apiserver", [
        "--etcd-servers=http://127.0.0.1:2379", "--bind-address=0.0.0.0", "--secure-port=6443",
        f"--advertise-address={a.node}", f"--service-cluster-ip-range={a.services}",
        f"--client-ca-file={pki / 'ca.crt'}", f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}", "--kubelet-preferred-address-types=InternalIP",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'service-account.pub'}",
        f"--service-account-signing-key-file={pki / 'service-account.key'}",
        "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true", "--profiling=false", "--v=1",
    ], say)  # fmt: skip
    _wait_http(s, "kube-apiserver", f"{s.api_url}/readyz", say)
    kubectl(s, ["apply", "-f", str(s.dir / "rbac.yaml")])
    common = ["--leader-elect=false", f"--bind-address={a.node}", "--profiling=false", "--v=1"]
    cm = d / "controller-manager.kubeconfig"
    _start(s, "kube-controller-manager", [
        f"--kubeconfig={cm}", f"--authentication-kubeconfig={cm}", f"--authorization-kubeconfig={cm}",
        f"--root-ca-file={pki / 'ca.crt'}", f"--service-account-private-key-file={pki / 'service-account.key'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
        "--use-service-account-credentials=true", f"--service-cluster-ip-range={a.services}", *common,
    ], say)  # fmt: skip
    sch = d / "scheduler.kubeconfig"
    _start(s, "kube-scheduler", [
        f"--kubeconfig={sch}", f"--authentication-kubeconfig={sch}", f"--authorization-kubeconfig={sch}", *common,
    ], say)  # fmt: skip
    _wait_http(s, "kube-controller-manager", f"https://{a.node}:10257/healthz", say, verify=False)
    _wait_http(s, "kube-scheduler", f"https://{a.node}:10259/healthz", say, verify=False)


def _start_node(s: KubeLabState, say: Say) -> None:
    d, a = s.dir, s.addresses
    _start(s, "containerd", [f"--config={d / 'containerd' / 'config.toml'}", "--log-level=warn"], say)
    _wait(s, lambda: s.containerd_socket.exists() and _ctr_ok(s), "containerd answers", say, ("containerd",))
    archive = d / "containerd" / "pause.oci.tar"
    _pause_archive(s, archive)
    ctr(s, ["images", "import", "--no-unpack=false", str(archive)], timeout=120)
    label = f"{KVM_LABEL[0]}={KVM_LABEL[1]}"
    _start(s, "kubelet", [
        f"--config={d / 'kubelet' / 'config.yaml'}", f"--kubeconfig={d / 'kubelet.kubeconfig'}",
        f"--root-dir={d / 'kubelet'}", f"--cert-dir={d / 'kubelet' / 'pki'}", f"--hostname-override={NODE_NAME}",
        f"--node-ip={a.node}", f"--node-labels={label},osfleet.io/lab=k8s", "--v=1",
    ], say)  # fmt: skip
    _wait(s, lambda: _ready_nodes(s) >= 1, f"node {NODE_NAME} Ready", say, ("kubelet", "containerd"))
    _start(s, "kube-proxy", [f"--config={d / 'kube-proxy.yaml'}", "--v=1"], say)
    _wait_http(s, "kube-proxy", f"http://{a.node}:10256/healthz", say)
    _start(s, "coredns", ["-conf", str(d / "coredns" / "Corefile")], say)
    _wait_http(s, "coredns", f"http://{a.node}:8181/ready", say)


def _start_kwok(s: KubeLabState, n: int, kvm: bool, say: Say) -> None:
    stages = Path(s.tools).parent / "kwok-stages.yaml"
    _start(s, "kwok", [f"--kubeconfig={s.dir / 'kwok.kubeconfig'}", f"--config={stages}", *configs.KWOK_ARGS], say)
    nodes = {"apiVersion": "v1", "kind": "List",
             "items": [configs.kwok_node(KWOK_NAME.format(i), i, kvm) for i in range(1, n + 1)]}  # fmt: skip
    (s.dir / "kwok-nodes.json").write_text(json.dumps(nodes))
    kubectl(s, ["apply", "-f", str(s.dir / "kwok-nodes.json")], timeout=300)
    _wait(s, lambda: _ready_nodes(s) >= 1 + n, f"{n} kwok nodes Ready", say, ("kwok",), START_TIMEOUT + n)


def _prepare_node_store(s: KubeLabState, say: Say) -> None:
    """The node as a prepared KVM host: its store holds the newest golden image (hard links: read-only files)."""
    from osfleet.vm.images import find_image

    try:
        image = find_image(None, Settings.from_env())
    except OsfleetError as exc:
        say(f"k8s lab: no golden image for the node's store yet ({exc}); publish one with "
            f"'OSFLEET_HOME={s.node_home} osfleet image publish'")  # fmt: skip
        return
    store = s.node_home / "images"
    store.mkdir(parents=True, exist_ok=True)
    for src in (image.disk, image.kernel, image.initrd):
        dst = store / src.name
        try:
            os.link(src, dst)
        except OSError:
            shutil.copyfile(src, dst)
            dst.chmod(0o444)
    meta = dict(image.manifest) | {"published_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                   "published_to": NODE_NAME}  # fmt: skip
    (store / f"{image.name}.json").write_text(json.dumps(meta, indent=2) + "\n")
    s.memory_dir.mkdir(parents=True, exist_ok=True)
    say(f"k8s lab: node store {s.node_home} holds {image.name}")


# --- processes --------------------------------------------------------------------------------------------------
def _env(s: KubeLabState) -> dict[str, str]:
    return {
        "PATH": f"{s.tools}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(s.dir),
        "LANG": "C.UTF-8",
    }


def _start(s: KubeLabState, name: str, args: list[str], say: Say) -> None:
    """Start ``name`` in the lab's namespace as a daemon of its own (it outlives this command), logging to a file."""
    log = s.dir / "logs" / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{NETNS}", "--", str(Path(s.tools) / name), *args],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=_env(s), cwd=s.dir, start_new_session=True,
        )  # fmt: skip
    s.pids[name] = proc.pid  # nsenter execs the component: the same process
    save(s)
    say(f"k8s lab: started {name} (pid {proc.pid}, log {log})")


def _check_alive(s: KubeLabState, name: str) -> None:
    pid = s.pids.get(name)
    if pid and not alive(pid):
        tail = (s.dir / "logs" / f"{name}.log").read_text(errors="replace").strip().splitlines()[-3:]
        raise CommandFailedError(f"k8s lab: {name} exited: {' | '.join(t.strip()[:200] for t in tail) or 'no output'}")


def _wait(
    s: KubeLabState, ok: Callable[[], bool], what: str, say: Say, watch: tuple[str, ...], timeout: float = START_TIMEOUT
) -> None:
    """Poll ``ok`` until true; fail at once with its log's last lines when a ``watch``ed component exits."""
    start = time.monotonic()
    last = start
    while True:
        for name in watch:
            _check_alive(s, name)
        try:
            if ok():
                say(f"k8s lab: {what} after {time.monotonic() - start:.1f} s")
                return
        except (OSError, OsfleetError, ValueError):
            pass
        now = time.monotonic()
        if now - start > timeout:
            raise CommandFailedError(f"k8s lab: {what}: not within {timeout:.0f} s")
        if now - last > 15:
            say(f"k8s lab: waiting for {what} ({now - start:.0f} s)")
            last = now
        time.sleep(0.5)


def _wait_http(s: KubeLabState, name: str, url: str, say: Say, verify: bool = True) -> None:
    ctx = _client_ssl(s, verify) if url.startswith("https") else None

    def ok() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=5, context=ctx) as r:  # noqa: S310 (our own lab's address)
                return bool(r.status == 200)
        except urllib.error.HTTPError:
            return False

    _wait(s, ok, f"{name} answers", say, (name,))


def _client_ssl(s: KubeLabState, verify: bool = True) -> ssl.SSLContext:
    pki = s.dir / "pki"
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if not verify:  # a component's self-signed serving certificate (controller manager, scheduler): health only
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return ctx


def kubectl(s: KubeLabState, args: list[str], timeout: float = 60) -> str:
    """kubectl (the cluster's own build) as the lab's admin."""
    return run([str(Path(s.tools) / "kubectl"), f"--kubeconfig={s.kubeconfig}", *args], f"kubectl {args[0]}", timeout)


def ctr(s: KubeLabState, args: list[str], timeout: float = 60) -> str:
    """containerd's ctr on the lab's containerd, in Kubernetes' namespace."""
    return run([str(Path(s.tools) / "ctr"), f"--address={s.containerd_socket}", "--namespace=k8s.io", *args],
               f"ctr {args[0]} {args[1] if len(args) > 1 else ''}".strip(), timeout)  # fmt: skip


def _ctr_ok(s: KubeLabState) -> bool:
    try:
        ctr(s, ["version"], timeout=10)
        return True
    except OsfleetError:
        return False


def _ready_nodes(s: KubeLabState) -> int:
    out = json.loads(kubectl(s, ["get", "nodes", "-o", "json"]))
    ready = 0
    for node in out.get("items", []):
        conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        ready += conds.get("Ready") == "True"
    return ready


def _pause_archive(s: KubeLabState, archive: Path) -> None:
    """The pod sandbox image: Kubernetes' own pause.c (built by scripts/build-k8s) in a one-file OCI image."""
    import tempfile

    from osfleet.imaging import oci

    with tempfile.TemporaryDirectory(prefix="pause-", dir=s.dir) as tmp:
        rootfs, layout = Path(tmp) / "rootfs", Path(tmp) / "layout"
        rootfs.mkdir()
        shutil.copy(Path(s.tools) / "pause", rootfs / "pause")
        layer = oci.write_layer(rootfs, layout / "blobs" / "sha256")
        config = oci.image_config([layer], {}, ["/pause"], {})
        config["config"]["Entrypoint"] = ["/pause"]
        oci.write_layout(layout, [layer], config, pause_reference(s), {})
        oci.write_archive(layout, archive)


# --- down -------------------------------------------------------------------------------------------------------
def down(root: Path, say: Say, libvirt_uri: str | None = None) -> dict[str, int]:
    """Remove everything of the k8s lab; return counts by kind. Works from the state file and, for what a crashed
    ``up`` made before recording it, by name (namespace, cgroup root, mounts under the folder, shim sockets)."""
    s = load(root) if state_path(root).exists() else None
    removed = {"processes": 0, "containers": 0, "domains": 0, "mounts": 0, "cgroups": 0, "namespaces": 0,
               "sysctls": 0, "folders": 0}  # fmt: skip
    if s is not None:
        for name in STOP_ORDER:
            pid = s.pids.get(name)
            if pid and alive(pid) and _is_ours(pid, s):
                if name == "containerd":  # its containers first (they and their shims outlive it)
                    removed["containers"] += _kill_containers(root)
                removed["processes"] += len(stop([pid], grace=10.0))
    removed["containers"] += _kill_containers(root)
    if NETNS in _namespaces():
        pids = net.namespace_pids(NETNS)
        removed["processes"] += len(stop(pids)) if pids else 0
    removed["domains"] += _destroy_domains(libvirt_uri, say)
    removed["mounts"] += _unmount_under(root)
    removed["cgroups"] += _remove_cgroups()
    with contextlib.suppress(OsfleetError):
        if VETH_HOST in _links():
            net.delete_link(VETH_HOST)
    if NETNS in _namespaces():
        net.delete_namespace(NETNS)
        removed["namespaces"] += 1
    if s is not None:
        removed["sysctls"] += _restore_sysctls(s.sysctls)
    memory = Path("/dev/shm/osfleet-k8s")
    if memory.exists():
        shutil.rmtree(memory, ignore_errors=True)
    if root.exists():
        shutil.rmtree(root)
        removed["folders"] += 1
    say("k8s lab: down: " + (", ".join(f"{v} {k}" for k, v in removed.items() if v) or "nothing to remove"))
    return removed


def running(s: KubeLabState) -> bool:
    """True while any of the lab's recorded processes still runs.

    Processes do not outlive a restart or a killed run, while the state file, the namespace, mounts and cgroups
    may: such a lab is a leftover that ``up`` clears, not a lab in use that it must refuse to replace.
    """
    return any(pid and alive(pid) and _is_ours(pid, s) for pid in s.pids.values())


def _is_ours(pid: int, s: KubeLabState) -> bool:
    """The recorded pid still runs one of the lab's binaries (pids are reused)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return exe.startswith(s.tools)


def _cgroup_dirs() -> Iterator[Path]:
    """Each v1 hierarchy's folder of the lab (the kubelet's cgroup root)."""
    for h in sorted(CGROUP_FS.iterdir()) if CGROUP_FS.is_dir() else []:
        d = h / CGROUP_ROOT
        if d.is_dir():
            yield d


def _make_cgroups() -> None:
    """The kubelet's cgroup root in every v1 hierarchy (it must exist; cpuset's needs its CPUs and nodes set)."""
    for h in sorted(CGROUP_FS.iterdir()):
        if not h.is_dir() or h.name == "unified" or not (h / "cgroup.procs").exists():
            continue
        d = h / CGROUP_ROOT
        d.mkdir(exist_ok=True)
        for f in ("cpuset.cpus", "cpuset.mems"):
            if (d / f).exists() and not (d / f).read_text().strip():
                (d / f).write_text((h / f).read_text())


def _kill_containers(root: Path) -> int:
    """SIGKILL every process in the lab's cgroups (pods' containers) and the lab containerd's shims."""
    pids: set[int] = set()
    for d in _cgroup_dirs():
        for procs in d.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    sock = str(root / "containerd" / "containerd.sock")
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(OSError):
                cmd = (p / "cmdline").read_bytes().split(b"\0")
                if cmd and cmd[0].endswith(b"containerd-shim-runc-v2") and sock.encode() in cmd:
                    pids.add(int(p.name))
    pids.discard(os.getpid())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return len(pids)


def _remove_cgroups() -> int:
    count = 0
    for d in _cgroup_dirs():
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                sub.rmdir()
                count += 1
        with contextlib.suppress(OSError):
            d.rmdir()
            count += 1
    return count


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root).rstrip("/") + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix) or point == str(root):
            points.append(point)
    return points


def _unmount_under(root: Path) -> int:
    """Unmount everything under the lab's folder (pods' volumes, container root filesystems, network namespace
    files, the kubelet's own bind mount), deepest first, lazily when busy."""
    count = 0
    for _ in range(5):
        points = sorted(set(_mounts_under(root)), key=lambda p: p.count("/"), reverse=True)
        if not points:
            break
        for p in points:
            done = subprocess.run(["umount", p], capture_output=True, check=False)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", p], capture_output=True, check=False)
            count += 1
    return count


def _destroy_domains(libvirt_uri: str | None, say: Say) -> int:
    """The node's replicas (its host agent's prefix): QEMU runs under the machine's libvirtd, outside the pods."""
    from osfleet.vm.virt import Virt

    count = 0
    try:
        with Virt(libvirt_uri or Settings.from_env().libvirt_uri) as virt:
            for name in virt.names(NAME_PREFIX):
                if virt.destroy(name):
                    count += 1
                    say(f"k8s lab: destroyed domain {name}")
    except OsfleetError as exc:
        raise OsfleetError(f"k8s lab down could not remove the node's replica domains: {exc}") from None
    return count


def _restore_sysctls(saved: dict[str, str]) -> int:
    count = 0
    for key, value in saved.items():
        path = Path(f"/proc/sys/{key}")
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value)
                count += 1
    return count


def _namespaces() -> list[str]:
    out = run(["ip", "-j", "netns", "list"], "listing network namespaces").strip()
    return [n["name"] for n in json.loads(out or "[]")]


def _links() -> list[str]:
    out = run(["ip", "-j", "link", "show"], "listing links").strip()
    return [li["ifname"] for li in json.loads(out or "[]")]


def leftovers(root: Path) -> dict[str, int]:
    """What of a k8s lab exists on this machine now, by kind (all zero after ``down``)."""
    s = load(root) if state_path(root).exists() else None
    tools = s.tools if s else None
    procs = 0
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(OSError):
                exe = os.readlink(p / "exe")
                cmd = (p / "cmdline").read_bytes()
                procs += bool((tools and exe.startswith(tools)) or str(root / "containerd").encode() in cmd)
    return {
        "processes": procs,
        "namespaces": int(NETNS in _namespaces()),
        "links": int(VETH_HOST in _links()),
        "mounts": len(_mounts_under(root)),
        "cgroups": len(list(_cgroup_dirs())),
        "files": int(root.exists()),
    }
