"""``osfleet bench fork``: fork a replica mid-task N ways, then check the children against their parent.

What is checked, on real replicas:
- ``same_state``: every child's screen equals the parent's screen at the moment it was paused for the
  fork (pixel-identical, or differing only inside ``differing_area``, which the JSON names), and a file
  the parent wrote just before the fork is in every child, while the parent's typed text is on screen.
- ``diverged``: two children given different input (typed text, a file) end in different states, and
  neither input shows in the other child or in the parent (no cross-talk).
- a child of a child (``nested``) starts with the same file, and every saved fork is gone once its last
  child is retired (``fork_states_left``); ``leaks`` lists domains, fork folders and RAM files left after.

- ``random_differs``: 16 bytes of /dev/urandom differ in every child (the new VM generation ID reseeded
  each child's kernel RNG: children are otherwise exact copies of the parent).

Timings: ``fork_p50_s``/``fork_p95_s`` are each child's own bring-up (from its record to a running guest
with the parent's state: its domain started unless a ready slot had it, the device state loaded;
``child_stages_p50_ms`` splits it); ``save_s`` is how long saving the parent took (a live migration: it
stood still for ``parent_paused_s`` of it); ``total_s`` is from the fork request until every child was
ready, and ``first_child_ready_s`` from the request until the first child was. The host keeps
``--children`` slots started for the next fork (``ready_slots_used``; ``--no-ready`` for none).
"""

from __future__ import annotations

import secrets
import shlex
import time
from collections.abc import Callable
from typing import Any

from PIL import Image, ImageChops

from osfleet.config import ReplicaShape, Settings
from osfleet.errors import OsfleetError, as_osfleet
from osfleet.measure.host_facts import describe
from osfleet.measure.stats import distribution, percentile
from osfleet.replicas.forks import SCREEN
from osfleet.replicas.input import Input
from osfleet.replicas.manager import ReplicaHost
from osfleet.vm.images import GoldenImage

Say = Callable[[str], None]
MARKER_PATH = "/var/tmp/osfleet-fork-marker"
BRANCH_PATH = "/var/tmp/osfleet-fork-branch"
TERMINAL_XY = (200, 200)  # over the desktop's terminal: twm gives it the keyboard focus
SCREEN_WAIT_SECONDS = 20.0


def run(
    image: GoldenImage, children: int, settings: Settings | None = None, say: Say = print, ready: bool = True
) -> dict[str, Any]:
    """The fork bench; ``ready``: the host keeps ``children`` slots started for the next fork (as ``host
    serve`` does with OSFLEET_FORK_READY). A failure part-way still returns what was measured, with the
    failure named (``failure``), and everything this run made is removed."""
    if children < 2:
        raise OsfleetError("--children must be at least 2 (two children are needed to show that they diverge)")
    settings = settings or Settings.from_env()
    result: dict[str, Any] = {"benchmark": "fork", "image": image.name, "children": children}
    made: list[str] = []  # every replica this run made, to tear down and to check for leaks
    host: ReplicaHost | None = None
    try:
        host = ReplicaHost(
            image,
            settings,
            ReplicaShape(),
            mode="snapshot",
            auto_recover=False,
            say=say,
            fork_ready=children if ready else 0,
        )
        result["accelerator"] = host.accel
        host.saved()
        say("[1/5] a parent replica, mid-task: a file written, text typed into its terminal")
        parent = host.create().replica
        made.append(parent)
        marker = secrets.token_hex(8)
        _shell(host, parent, f"echo {marker} > {MARKER_PATH}")
        _type(host, parent, "echo typed-before-fork")
        host.settle()  # the parent's spare and the next fork's slots, as they would be mid-episode

        say(f"[2/5] forking it {children} ways")
        forked = host.fork(parent, children)
        kids = [c.record.id for c in forked.children]
        made += kids
        seconds = [c.seconds for c in forked.children]
        stages: dict[str, list[float]] = {}
        for c in forked.children:
            for name, sec in c.stages.items():
                stages.setdefault(name, []).append(sec)
        result.update(
            children_ready=sum(1 for c in forked.children if c.record.state.value in ("ready", "leased")),
            memory_mode=forked.memory_mode,
            fork_p50_s=distribution(seconds)["p50"],
            fork_p95_s=distribution(seconds)["p95"],
            child_stages_p50_ms={k: round(percentile(v, 50) * 1000, 1) for k, v in stages.items()},
            ready_slots_used=min(children, int(host.forks.load(forked.fork_id).meta.get("ready_slots", 0))),
            save_s=forked.save_seconds,
            parent_paused_s=forked.paused_seconds,
            total_s=forked.total_seconds,
            first_child_ready_s=forked.save_seconds + min(seconds),
        )
        with Image.open(settings.forks_dir / forked.fork_id / SCREEN) as img:
            at_fork = img.convert("RGB")

        say("[3/5] same state: screens against the parent's at the fork, and the file")
        areas, files_ok = [], True
        for rid in kids:
            areas.append(ImageChops.difference(at_fork, host.virt.screenshot(host.get(rid).domain)).getbbox())
            files_ok &= _read(host, rid, MARKER_PATH) == marker
        identical = sum(1 for a in areas if a is None)
        differing = _union([a for a in areas if a is not None])
        result.update(
            same_state=len(areas) == children and files_ok and _small(differing, at_fork),
            screens_identical=identical,
            differing_area=list(differing) if differing else None,
            file_in_every_child=files_ok,
        )

        say("[4/5] diverging: different input in two children; then a child of a child")
        a, b = kids[0], kids[1]
        before = {rid: host.virt.screenshot(host.get(rid).domain) for rid in (parent, a, b)}
        _shell(host, a, f"echo A > {BRANCH_PATH}")
        _shell(host, b, f"echo B > {BRANCH_PATH}")
        _type(host, a, " branch-a")
        after_a = host.virt.screenshot(host.get(a).domain)
        time.sleep(1.0)  # had the typing leaked into b or the parent, it would show by now
        b_untouched = not ImageChops.difference(before[b], host.virt.screenshot(host.get(b).domain)).getbbox()
        parent_untouched = (
            _read(host, parent, BRANCH_PATH) == ""
            and not ImageChops.difference(before[parent], host.virt.screenshot(host.get(parent).domain)).getbbox()
        )
        result["diverged"] = (
            _read(host, a, BRANCH_PATH) == "A"
            and _read(host, b, BRANCH_PATH) == "B"
            and ImageChops.difference(after_a, before[a]).getbbox() is not None
            and b_untouched
            and parent_untouched
        )
        result["no_cross_talk"] = b_untouched and parent_untouched
        urandom = "head -c 16 /dev/urandom | od -An -tx1"
        result["random_differs"] = len({_shell(host, rid, urandom).strip() for rid in kids}) == len(kids)
        nested = host.fork(b, 1)
        grandchild = nested.children[0].record.id
        made.append(grandchild)
        result["nested_fork_ok"] = (
            _read(host, grandchild, MARKER_PATH) == marker and _read(host, grandchild, BRANCH_PATH) == "B"
        )
        result["nested_total_s"] = nested.total_seconds

        say("[5/5] retiring the children: every saved fork must go with its last child")
        host.down([grandchild, *kids])
        result["fork_states_left"] = len(host.fork_states())
    except Exception as exc:  # what was measured is still reported, with the failure named (exit code 1)
        result["failure"] = str(as_osfleet(exc, "the fork benchmark"))
        say(f"fork bench failed: {result['failure']}")
    finally:
        if host is not None:
            try:
                host.down(
                    host.made_here()
                )  # all it made, one an interrupt caught halfway included; never an adopted one
            finally:
                host.close()
    result["machine"] = describe(result.get("accelerator"))
    result["leaks"] = _leaks(settings, made)
    return result


def _shell(host: ReplicaHost, rid: str, command: str) -> str:
    out = host.shell(rid, command, 30, as_root=True)
    if out["exit_code"] != 0:
        raise OsfleetError(f"{rid}: {command!r} failed: {out['stderr'].strip()[:200]}")
    return str(out["stdout"])


def _read(host: ReplicaHost, rid: str, path: str) -> str:
    return _shell(host, rid, f"cat {shlex.quote(path)} 2>/dev/null || true").strip()


def _type(host: ReplicaHost, rid: str, text: str) -> None:
    """Type into the terminal and wait until the screen shows it (so the fork saves a changed screen)."""
    domain = host.get(rid).domain
    keys = Input(host.virt, domain, host.image.screen)
    keys.move(*TERMINAL_XY)
    time.sleep(0.3)
    before = host.virt.screenshot(domain)
    keys.type_text(text)
    deadline = time.monotonic() + SCREEN_WAIT_SECONDS
    last_change = None
    while time.monotonic() < deadline:
        now = host.virt.screenshot(domain)
        if ImageChops.difference(before, now).getbbox():
            if last_change is not None and not ImageChops.difference(last_change, now).getbbox():
                return  # the text is drawn and the screen is still again
            last_change = now
        time.sleep(0.3)
    raise OsfleetError(f"{rid}: typed text did not show on the screen within {SCREEN_WAIT_SECONDS:.0f} s")


def _union(boxes: list[tuple[int, int, int, int]]) -> tuple[int, int, int, int] | None:
    if not boxes:
        return None
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def _small(area: tuple[int, int, int, int] | None, screen: Image.Image) -> bool:
    """Differences allowed only in a small area (a clock or a blinking cursor): at most 2 % of the screen."""
    if area is None:
        return True
    w, h = area[2] - area[0], area[3] - area[1]
    return w * h <= 0.02 * screen.width * screen.height


def _leaks(settings: Settings, made: list[str]) -> dict[str, int]:
    """What this run left behind: its replicas' domains and folders, fork templates, forks, RAM files."""
    from osfleet.vm.virt import Virt

    with Virt(settings.libvirt_uri) as virt:
        domains = sum(len(virt.names(f"{settings.name_prefix}{rid}-")) for rid in made)
        domains += len(virt.names(f"{settings.template_prefix}f-"))
    folders = sum(1 for rid in made if (settings.replicas_dir / rid).exists())
    forks = len(list(settings.forks_dir.iterdir())) if settings.forks_dir.exists() else 0
    ram = (
        len(list(settings.memory_dir.glob("*-f-*.ram"))) if settings.memory_dir and settings.memory_dir.exists() else 0
    )
    return {"domains": domains, "replica_folders": folders, "fork_folders": forks, "fork_ram_files": ram}
