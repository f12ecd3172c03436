"""A hostile guest on a real replica: its files cost its own evaluation a 0 with the reason, its guest agent
(replaced by one that lies, as root in a guest could) costs an infrastructure error within the budget.

Nothing here is faked on the host side: the real ReplicaHost, runner, getters, sandbox and libvirt. The
guest's own qemu-ga is swapped for a small Python program that speaks its protocol (``FAKE_AGENT``).
"""

from __future__ import annotations

import base64
import io
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from docx import Document
from docx.oxml import OxmlElement
from docx.oxml.ns import qn
from openpyxl import Workbook

from osfleet.config import Settings
from osfleet.errors import OsfleetError
from osfleet.replicas.manager import ReplicaHost
from osfleet.tasks import runner
from osfleet.tasks.osworld_format.convert import from_osworld
from osfleet.vm.images import GoldenImage

pytestmark = [pytest.mark.vm, pytest.mark.slow]

# A guest agent that answers every file read with an empty chunk and no end of file, and says every file is
# there: what a guest with root could run instead of qemu-ga.
FAKE_AGENT = r"""
import os, re, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
ANSWERS = {  # python3-minimal has no json module: the answers are written out
    "guest-file-open": "7",
    "guest-file-read": '{"count": 0, "buf-b64": "", "eof": false}',
    "guest-exec": '{"pid": 4242}',
    # every command "prints" 4096: the getters' size probe (stat -c %s) then reads a 4 KiB file that never comes
    "guest-exec-status": '{"exited": true, "exitcode": 0, "out-data": "NDA5Ngo="}',
}
def messages(text):
    depth, quoted, escaped, start = 0, False, False, None
    for i, ch in enumerate(text):
        if quoted:
            escaped, quoted = (not escaped and ch == "\\"), quoted and (escaped or ch != '"')
            continue
        if ch == '"':
            quoted = True
        elif ch == "{":
            start = i if depth == 0 else start
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                yield text[start : i + 1], i + 1
buf = ""
while True:
    data = os.read(fd, 65536)
    if not data:
        time.sleep(0.05)
        continue
    buf += data.decode(errors="replace")
    used = 0
    for cmd, used in messages(buf):
        name = re.search(r'"execute"\s*:\s*"([^"]+)"', cmd).group(1)
        if name.startswith("guest-sync"):
            answer = re.search(r'"id"\s*:\s*(-?\d+)', cmd).group(1)
        else:
            answer = ANSWERS.get(name, "{}")
        os.write(fd, ('{"return": %s}\n' % answer).encode())
    buf = buf[used:]
"""
# Takes the agent's port from qemu-ga (which the command starting this runs under, hence the pause).
LAUNCHER = """
for d in /sys/class/virtio-ports/*; do [ "$(cat "$d/name")" = org.qemu.guest_agent.0 ] && p="/dev/${d##*/}"; done
sleep 1
kill $(pidof qemu-ga)
exec python3 /run/fake-ga.py "$p"
"""


def xlsx(cells: dict[str, str]) -> bytes:
    wb = Workbook()
    ws = wb.active
    assert ws is not None
    for ref, value in cells.items():
        ws[ref] = value
    buf = io.BytesIO()
    wb.save(buf)
    return buf.getvalue()


def docx(span: int | None) -> bytes:
    doc = Document()
    table = doc.add_table(rows=1, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "a", "b"
    if span:
        grid = OxmlElement("w:gridSpan")
        grid.set(qn("w:val"), str(span))
        table.rows[0].cells[0]._tc.get_or_add_tcPr().append(grid)
    buf = io.BytesIO()
    doc.save(buf)
    return buf.getvalue()


def task(name: str, result: bytes, expected: bytes, ext: str, func: str, options: dict[str, Any]) -> dict[str, Any]:
    r64, e64 = base64.b64encode(result).decode(), base64.b64encode(expected).decode()
    put = f"echo {r64} | base64 -d > /home/user/r.{ext} && echo {e64} | base64 -d > /home/user/e.{ext}"
    return {
        "id": f"hostile-{name}",
        "instruction": "Nothing to do.",
        "config": [{"type": "execute", "parameters": {"command": ["bash", "-c", put]}}],
        "evaluator": {
            "func": func,
            "options": options,
            "result": {"type": "vm_file", "path": f"/home/user/r.{ext}", "dest": f"r.{ext}"},
            "expected": {"type": "vm_file", "path": f"/home/user/e.{ext}", "dest": f"e.{ext}"},
        },
    }


@pytest.fixture
def host(golden: GoldenImage, settings: Settings) -> Iterator[ReplicaHost]:
    h = ReplicaHost(golden, settings, mode="snapshot", auto_recover=False)
    try:
        yield h
    finally:
        try:
            h.down(h.made_here())
        finally:
            h.close()


CASES = [
    ("xlsx-far-cell", xlsx({"A1": "x", "XFD1048576": "y"}), xlsx({"A1": "x"}), "xlsx", "compare_table",
     {"rules": [{"type": "sheet_data", "sheet_idx0": "RI0", "sheet_idx1": "EI0"}]}, "too many to read"),
    ("docx-gridspan", docx(2_000_000_000), docx(None), "docx", "compare_docx_files", {}, "columns (Word allows 63)"),
]  # fmt: skip


def test_hostile_files_cost_their_own_episode_a_zero(host: ReplicaHost) -> None:
    rid = host.create().replica
    me = psutil.Process()
    for name, result, expected, ext, func, options, words in CASES:
        t = from_osworld(task(name, result, expected, ext, func, options))
        runner.apply_setup(host, rid, t)
        rss = me.memory_info().rss
        start = time.monotonic()
        evaluation = runner.evaluate(host, rid, t)
        took = time.monotonic() - start
        grew = (me.memory_info().rss - rss) / 2**20
        detail = evaluation.criteria[0].detail
        assert evaluation.reward == 0.0 and words in detail, (name, detail)
        assert took < runner.EVALUATE_BUDGET_SECONDS and grew < 200, (name, took, grew)


def test_a_lying_guest_agent_costs_an_infrastructure_error_within_the_budget(host: ReplicaHost) -> None:
    rid = host.create().replica
    script = base64.b64encode(FAKE_AGENT.encode()).decode()
    launcher = base64.b64encode(LAUNCHER.encode()).decode()
    out = host.shell(
        rid,
        f"echo {script} | base64 -d > /run/fake-ga.py && echo {launcher} | base64 -d > /run/fake-ga.sh && "
        "setsid -f sh /run/fake-ga.sh >/dev/null 2>&1 </dev/null",
        30,
        as_root=True,
    )
    assert out["exit_code"] == 0, out
    deadline = time.monotonic() + 60
    while True:  # the fake answers a file open with handle 7; the real agent would refuse /nonexistent
        try:
            if host.virt.agent(host.get(rid).domain, "guest-file-open", {"path": "/nonexistent"}) == 7:
                break
        except OsfleetError:
            pass
        assert time.monotonic() < deadline, "the fake guest agent did not take over"
        time.sleep(0.5)
    start = time.monotonic()
    with pytest.raises(OsfleetError, match="no data and no end of file"):
        host.read_file(rid, "/home/user/r.xlsx", 2**20, timeout=20)
    assert time.monotonic() - start < 20
    t = from_osworld(task("lying-agent", b"", b"", "xlsx", "compare_table", {}))
    box: list[Any] = []

    def evaluate() -> None:
        try:
            box.append(runner.evaluate(host, rid, t))
        except runner.VerifierError as exc:  # the API answers 503, kind infrastructure
            box.append(exc)

    worker = threading.Thread(target=evaluate)
    start = time.monotonic()
    worker.start()
    worker.join(runner.EVALUATE_BUDGET_SECONDS + 30)
    assert not worker.is_alive(), "the evaluation hung"
    assert isinstance(box[0], runner.VerifierError), box[0]
    assert time.monotonic() - start < runner.EVALUATE_BUDGET_SECONDS + 10
