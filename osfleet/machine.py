"""Facts about the machine a measurement was taken on, attached to every result."""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any


def describe(accel: str | None = None) -> dict[str, Any]:
    mem_kib = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kib = int(line.split()[1])
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "accelerator": {"kvm": "KVM", "qemu": "TCG"}.get(accel or "", accel),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["osfleet", *sys.argv[1:]]) if sys.argv and sys.argv[0].endswith("osfleet") else None,
    }
