"""Typing into a real guest whose vCPU gets almost no CPU (SCHED_IDLE while busy loops run): the text arrives
whole, and osfleet's count of keyboard bytes agrees with QEMU's to the byte (extended keys and shift included)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from osfleet.config import Settings
from osfleet.replicas.actions import shell
from osfleet.replicas.input import Input, key_for_char
from osfleet.replicas.manager import ReplicaHost
from osfleet.vm.images import GoldenImage

pytestmark = pytest.mark.vm

WORD = "Starved_Guest-Types:{Every}~Key|"


def test_a_starved_guest_gets_every_key_and_the_byte_count_matches_qemus(
    golden: GoldenImage, settings: Settings, no_leftovers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("osfleet.replicas.input.KEY_GAP_SECONDS", 0.0)  # as fast as the monitor takes them
    with ReplicaHost(golden, settings, warm=0, auto_recover=False, spares=False) as host:
        burners: list[subprocess.Popen[bytes]] = []
        try:
            rid = host.create("snapshot").replica
            domain = host.get(rid).domain
            vcpu = host.virt.qmp(domain, "query-cpus-fast")[0]["thread-id"]
            keys = Input(host.virt, domain, golden.screen)
            keys.click(200, 200)  # the terminal
            time.sleep(1)
            counted, sent = keys._keyboard_irqs(), keys.keyboard.sent  # QEMU's and ours, before typing
            burners = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(os.cpu_count() or 2)]
            os.sched_setscheduler(vcpu, os.SCHED_IDLE, os.sched_param(0))
            keys.type_text("printf '%s\\n' '" + WORD * 6 + "ab")
            keys.hotkey(["left"])  # extended keys: two bytes a transition
            keys.type_text("X")
            keys.hotkey(["end"])
            keys.type_text("' > ~/typed.txt\n")
        finally:
            for b in burners:
                b.kill()
                b.wait()
            if burners:
                os.sched_setscheduler(vcpu, os.SCHED_OTHER, os.sched_param(0))
        try:
            for _ in range(60):
                out = shell(host.virt, domain, "cat ~/typed.txt 2>/dev/null", 10)["stdout"]
                if out:
                    break
                time.sleep(0.5)
            assert out == WORD * 6 + "aXb\n"
            typed = "printf '%s\\n' '" + WORD * 6 + "ab" + "X" + "' > ~/typed.txt\n"
            ours = sum(4 if key_for_char(c)[1] else 2 for c in typed) + 2 * 4  # two extended keys
            assert keys.keyboard.sent - sent == ours == keys._keyboard_irqs() - counted  # type: ignore[operator]
        finally:
            host.down()
