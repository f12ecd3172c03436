"""Bring a lab up, list it, take it down: the operations behind ``osfleet lab``."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from osfleet.config import Settings
from osfleet.errors import ConfigError, OsfleetError
from osfleet.lab import net, sshd
from osfleet.lab.proc import alive, stop
from osfleet.lab.state import NETNS_PREFIX, LabHost, LabState, load, save, state_path

Say = Callable[[str], None]


def lab_root(settings: Settings | None = None) -> Path:
    """The lab's folder on this machine (state file, key, each host's folder and OSFLEET_HOME)."""
    return (settings or Settings.from_env()).home / "lab"


def _host(index: int, subnet: net.ipaddress.IPv4Network, root: Path) -> LabHost:
    name = f"lab{index}"
    host_addr, addr, plen = net.link_addresses(subnet, index)
    d = root / name
    return LabHost(
        name=name,
        netns=f"{NETNS_PREFIX}{index}",
        veth_host=f"{NETNS_PREFIX}{index}-h",
        veth_ns=f"{NETNS_PREFIX}{index}-n",
        host_addr=host_addr,
        addr=addr,
        prefix_len=plen,
        dir=str(d),
        home=str(d / "home"),
        name_prefix=f"osfleet-{name}-",
    )


def up(hosts: int, root: Path, say: Say) -> LabState:
    """Make ``hosts`` lab hosts; on any failure remove everything made so far and re-raise."""
    if not 1 <= hosts <= net.MAX_HOSTS:
        raise ConfigError(f"--hosts must be between 1 and {net.MAX_HOSTS}")
    existing = load(root)
    if existing is not None and running(existing):
        raise ConfigError(
            f"a lab of {len(existing.hosts)} hosts is already up ({state_path(root)}); run 'osfleet lab down' first"
        )
    if existing is not None:
        say("lab: the lab recorded here has no host running (a restart or a killed run left it); clearing it first")
        down(root, say)
    if net.lab_namespaces() or net.lab_links():
        raise ConfigError("leftovers of an earlier lab exist (osfl-lab* namespaces or links); run 'osfleet lab down'")
    subnet = net.pick_subnet()
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    key = root / "id_lab"
    state = LabState(root=str(root), subnet=str(subnet), key=str(key), known_hosts=str(root / "known_hosts"))
    save(state)  # first, so a failed or interrupted up is still found by down
    try:
        sshd.make_key(key)
        known: list[str] = []
        for i in range(1, hosts + 1):
            h = _host(i, subnet, root)
            say(f"lab: {h.name}: namespace {h.netns}, {h.addr}/{h.prefix_len} via {h.veth_host} ({h.host_addr})")
            Path(h.home).mkdir(parents=True, exist_ok=True)
            state.hosts.append(h)
            save(state)
            net.create_host_link(h.netns, h.veth_host, h.veth_ns, h.host_addr, h.addr, h.prefix_len)
            pid, known_line = sshd.start(h, Path(str(key) + ".pub"))
            state.hosts[-1] = LabHost(**{**h.__dict__, "sshd_pid": pid})
            known.append(known_line)
            save(state)
            say(f"lab: {h.name}: sshd {pid} on {h.addr}:{sshd.SSH_PORT}, OSFLEET_HOME={h.home}, prefix {h.name_prefix}")
        sshd.write_known_hosts(Path(state.known_hosts), known)
    except BaseException:
        say("lab: up failed; removing what it made")
        down(root, say)
        raise
    return state


def down(root: Path, say: Say, libvirt_uri: str | None = None) -> dict[str, int]:
    """Remove every process, replica domain, namespace, link and file of the lab; return counts by kind.

    Works from the state file and, for what a crashed ``up`` made before recording it, by name prefix.
    """
    state = load(root) if state_path(root).exists() else None
    removed = {"processes": 0, "domains": 0, "namespaces": 0, "links": 0, "folders": 0}
    for ns in net.lab_namespaces():
        pids = net.namespace_pids(ns)
        if pids:
            removed["processes"] += len(stop(pids))
            say(f"lab: stopped {len(pids)} process(es) in {ns}")
    for h in state.hosts if state else []:
        if h.sshd_pid and alive(h.sshd_pid) and _is_our_sshd(h):
            removed["processes"] += len(stop([h.sshd_pid]))
    prefixes = [h.name_prefix for h in state.hosts] if state else []
    if prefixes:
        removed["domains"] += _destroy_domains(prefixes, libvirt_uri, say)
    # The host end first: deleting it removes its peer, so no namespace deletion races a vanishing link.
    for link in net.lab_links():
        net.delete_link(link)
        removed["links"] += 1
    for ns in net.lab_namespaces():
        net.delete_namespace(ns)
        removed["namespaces"] += 1
    if root.exists():
        shutil.rmtree(root)
        removed["folders"] += 1
    say(
        "lab: down: "
        + ", ".join(f"{v} {k}" for k, v in removed.items() if v)
        + ("" if any(removed.values()) else "nothing to remove")
    )
    return removed


def running(state: LabState) -> bool:
    """True while any host of the lab still runs its sshd.

    Processes do not outlive a restart or a killed run, while the state file, namespaces and links do: such a lab
    is a leftover that ``up`` clears, not a lab in use that it must refuse to replace.
    """
    return any(h.sshd_pid and alive(h.sshd_pid) and _is_our_sshd(h) for h in state.hosts)


def _is_our_sshd(h: LabHost) -> bool:
    """True when the pid recorded for the host still runs our sshd (pids are reused).

    A listening sshd retitles itself ("sshd: /usr/sbin/sshd -f <config> ... [listener]"), one string in place of its
    arguments, so the config path is looked for inside the command line, not among its arguments.
    """
    try:
        cmdline = Path(f"/proc/{h.sshd_pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return str(Path(h.dir) / "sshd_config").encode() in cmdline


def _destroy_domains(prefixes: list[str], libvirt_uri: str | None, say: Say) -> int:
    """Destroy the lab hosts' replica domains (their overlays go with the hosts' folders)."""
    from osfleet.vm.virt import Virt

    count = 0
    try:
        with Virt(libvirt_uri or Settings.from_env().libvirt_uri) as virt:
            for prefix in prefixes:
                for name in virt.names(prefix):
                    if virt.destroy(name):
                        count += 1
                        say(f"lab: destroyed domain {name}")
    except OsfleetError as exc:
        raise OsfleetError(f"lab down could not remove the lab's replica domains: {exc}") from None
    return count


def leftovers(root: Path, libvirt_uri: str | None = None) -> dict[str, int]:
    """What of a lab exists on this machine now, by kind (all zero after ``down``)."""
    from osfleet.vm.virt import Virt

    state = load(root) if state_path(root).exists() else None
    namespaces = net.lab_namespaces()
    procs = sum(len(net.namespace_pids(ns)) for ns in namespaces)
    with Virt(libvirt_uri or Settings.from_env().libvirt_uri) as virt:
        domains = len(virt.names("osfleet-lab"))
    return {
        "namespaces": len(namespaces),
        "links": len(net.lab_links()),
        "processes": procs,
        "domains": domains,
        "files": 1 if root.exists() else 0,
        "state_hosts": len(state.hosts) if state else 0,
    }


def status(state: LabState) -> list[dict[str, object]]:
    """Each host with whether its sshd still runs, for ``lab ls``."""
    return [
        {
            **h.__dict__,
            "ssh": f"root@{h.addr}",
            "sshd_running": bool(h.sshd_pid and alive(h.sshd_pid) and _is_our_sshd(h)),
        }
        for h in state.hosts
    ]
