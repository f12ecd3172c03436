"""``osfleet host tune``: host settings that make replicas denser. Today: KSM (kernel same-page merging).

KSM lets ``ksmd`` scan memory that QEMU marks mergeable (guest RAM) and back identical pages with one
copy-on-write page. Clones of one saved state write many identical pages after a restore (the same
kernel and X server doing the same things), so it merges a lot of what template memory leaves private
(measured: 12 full-stream replicas 3.7 GiB -> 0.85 GiB in 40 s at the rates below, ksmd ~3 % of a core).

The trade-off (why it is a setting, not a default of every host): merged pages are shared between
replicas, and writing to a merged page takes measurably longer (the copy-on-write fault). A guest can
therefore learn whether another guest on the host holds a page with given contents (a memory
deduplication side channel; e.g. CVE-2015-2877 class attacks, "Flip Feng Shui" rowhammer on merged
pages). When all replicas on a host work for one user (an RL run), that reveals nothing they do not
already share. When replicas belong to different users (``OSFLEET_TENANCY=multi``), ``tune`` keeps KSM
off and unmerges what was merged. Template memory itself shares only the template's pages, which hold
the same public golden state for every clone (see ``osfleet.replicas.template_memory``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osfleet.config import Settings, Tenancy
from osfleet.errors import OsfleetError

KSM_DIR = Path("/sys/kernel/mm/ksm")
# Measured here: ~3 % of one core for ksmd, merging a dozen fresh replicas within a minute.
KSM_PAGES_TO_SCAN = 1000
KSM_SLEEP_MILLISECONDS = 20
PAGE_BYTES = 4096


@dataclass(frozen=True)
class KsmSettings:
    run: int  # 0 off, 1 on, 2 off and unmerge everything merged
    pages_to_scan: int = KSM_PAGES_TO_SCAN
    sleep_millisecs: int = KSM_SLEEP_MILLISECONDS


def ksm_status(ksm_dir: Path = KSM_DIR) -> dict[str, Any]:
    """KSM's state and what it saves now (``saved_bytes``: pages_sharing x page size)."""
    if not (ksm_dir / "run").exists():
        return {"available": False}

    def read(name: str) -> int | None:
        try:
            return int((ksm_dir / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    sharing = read("pages_sharing") or 0
    return {
        "available": True,
        "run": read("run"),
        "pages_to_scan": read("pages_to_scan"),
        "sleep_millisecs": read("sleep_millisecs"),
        "pages_shared": read("pages_shared"),
        "pages_sharing": sharing,
        "saved_bytes": sharing * PAGE_BYTES,
    }


def wanted_ksm(settings: Settings, enable: bool | None = None) -> tuple[KsmSettings, str]:
    """What KSM should be on this host, and why. ``enable`` None: on unless the host is multi-tenant."""
    return ksm_for_tenancy(settings.tenancy, enable)


def ksm_for_tenancy(tenancy: Tenancy, enable: bool | None = None) -> tuple[KsmSettings, str]:
    """The rule itself, for this host (``tune``) and for hosts prepared from elsewhere (the infra stacks)."""
    if tenancy == "multi":
        if enable:
            raise OsfleetError(
                "KSM stays off when replicas belong to different users (OSFLEET_TENANCY=multi): merged pages "
                "leak which contents other tenants hold"
            )
        return KsmSettings(run=2), "off and unmerged: replicas belong to different users (OSFLEET_TENANCY=multi)"
    if enable is False:
        return KsmSettings(run=2), "off and unmerged, as asked"
    return KsmSettings(run=1), (
        f"on, {KSM_PAGES_TO_SCAN} pages every {KSM_SLEEP_MILLISECONDS} ms: all replicas serve one user "
        "(OSFLEET_TENANCY=single)"
    )


def ksm_writes(wanted: KsmSettings) -> list[tuple[str, int]]:
    """(file under the KSM folder, value) in the order they are written: scan rates before switching it on."""
    rates = [("pages_to_scan", wanted.pages_to_scan), ("sleep_millisecs", wanted.sleep_millisecs)]
    return [*(rates if wanted.run == 1 else []), ("run", wanted.run)]


def apply_ksm(wanted: KsmSettings, ksm_dir: Path = KSM_DIR) -> dict[str, Any]:
    """Write KSM's settings (root); returns the status afterwards."""
    if not (ksm_dir / "run").exists():
        raise OsfleetError(f"this kernel has no KSM ({ksm_dir} is missing)")
    try:
        for name, value in ksm_writes(wanted):
            (ksm_dir / name).write_text(f"{value}\n")
    except OSError as exc:
        raise OsfleetError(f"cannot set KSM in {ksm_dir}: {exc.strerror} (run as root)") from None
    return ksm_status(ksm_dir)


def tune(settings: Settings, ksm: bool | None = None, ksm_dir: Path = KSM_DIR) -> dict[str, Any]:
    """Apply osfleet's host settings; returns what was set and why."""
    wanted, why = wanted_ksm(settings, ksm)
    return {"ksm": apply_ksm(wanted, ksm_dir), "ksm_reason": why, "tenancy": settings.tenancy}
