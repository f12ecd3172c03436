"""Facts about the machine a measurement was taken on, attached to every result."""

from __future__ import annotations

import platform
import sys
import time
from typing import Any

import psutil


def describe(accel: str | None = None) -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "cpus": psutil.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        "accelerator": {"kvm": "KVM", "qemu": "TCG"}.get(accel or "", accel),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["osfleet", *sys.argv[1:]]) if sys.argv and sys.argv[0].endswith("osfleet") else None,
    }
