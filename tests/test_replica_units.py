"""Replica records, state machine, input mapping and action validation (no VM needed)."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from pydantic import ValidationError

from osfleet.errors import OsfleetError
from osfleet.protocol.actions import ACTIONS
from osfleet.replicas.input import Input, InputError, key_for_char, qcode
from osfleet.replicas.records import InvalidTransitionError, Lease, RecordStore, ReplicaRecord, State
from osfleet.vm.domain_xml import QEMU_NS, DiskSpec, DomainSpec

pytestmark = pytest.mark.unit


def record(**kw: object) -> ReplicaRecord:
    return ReplicaRecord(id="r-00000001", image="golden-x", mode="snapshot", **kw)  # type: ignore[arg-type]


def test_lifecycle_follows_the_design() -> None:
    r = record()
    for s in (State.BOOTING, State.READY, State.LEASED, State.RESETTING, State.LEASED, State.READY):
        r.move(s)
    r.move(State.FAILED, error="qemu gone")
    assert r.error == "qemu gone"
    r.move(State.RECOVERING, error=r.error)
    r.move(State.READY)
    assert r.error is None
    r.move(State.RETIRED)
    with pytest.raises(InvalidTransitionError, match="cannot go from retired to ready"):
        r.move(State.READY)


@pytest.mark.parametrize(
    ("start", "to"),
    [
        (State.PROVISIONING, State.LEASED),
        (State.FAILED, State.READY),
        (State.BOOTING, State.LEASED),
        (State.READY, State.RECOVERING),
    ],
)
def test_forbidden_transitions(start: State, to: State) -> None:
    r = record(state=start)
    with pytest.raises(InvalidTransitionError):
        r.move(to)


def test_record_store_round_trip_and_broken_files(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    r = record(lease=Lease(id="l1", holder="agent", expires_at=1.0))
    store.save(r)
    (tmp_path / "r-broken.json").write_text("{not json")
    records, broken = store.load_all()
    assert records == [r] and broken == [tmp_path / "r-broken.json"]
    assert records[0].lease is not None and records[0].lease.expired()
    assert not list(tmp_path.glob("*.tmp-*"))
    store.delete(r.id)
    assert store.load_all()[0] == []


def test_text_maps_to_us_keys() -> None:
    assert key_for_char("a") == ("a", False)
    assert key_for_char("A") == ("a", True)
    assert key_for_char("!") == ("1", True)
    assert key_for_char("\n") == ("ret", False)
    assert key_for_char("~") == ("grave_accent", True)
    with pytest.raises(InputError, match="cannot type 'é'"):
        key_for_char("é")
    assert [qcode(k) for k in ("Ctrl", "ALT", "Enter", "f5", "s")] == ["ctrl", "alt", "ret", "f5", "s"]
    with pytest.raises(InputError, match="unknown key 'hyper'"):
        qcode("hyper")


def test_pointer_coordinates_are_checked_and_scaled() -> None:
    pointer = Input(None, "osfleet-x", (1280, 800))  # type: ignore[arg-type]
    x, y = pointer._abs(1279, 0)
    assert x["data"]["value"] == 32767 and y["data"]["value"] == 0
    with pytest.raises(InputError, match=r"\(1280, 5\) are off the 1280x800 screen"):
        pointer._abs(1280, 5)
    with pytest.raises(InputError, match="off the"):
        pointer._abs(-1, 5)


def test_actions_validate_before_reaching_the_guest() -> None:
    acts = ACTIONS.validate_python(
        [
            {"type": "click", "x": 1, "y": 2},
            {"type": "hotkey", "keys": ["ctrl", "s"]},
            {"type": "shell", "command": "ls", "timeout": 5},
        ]
    )
    assert [a.type for a in acts] == ["click", "hotkey", "shell"]
    for bad in (
        {"type": "teleport"},
        {"type": "click", "x": 1},
        {"type": "read_file", "path": "relative"},
        {"type": "wait", "seconds": 3600},
        {"type": "click", "x": 1, "y": 2, "extra": 1},
    ):
        with pytest.raises(ValidationError):
            ACTIONS.validate_python([bad])


def test_incoming_domains_wait_for_a_migration_stream() -> None:
    spec = DomainSpec(
        name="osfleet-r-1-g1",
        kernel=Path("/k"),
        initrd=Path("/i"),
        cmdline="",
        disks=(DiskSpec(Path("/d"), backing=(Path("/s"), Path("/g"))),),
        qemu_args=("-incoming", "defer"),
    )
    root = ET.fromstring(spec.to_xml())
    assert [a.get("value") for a in root.iter(f"{{{QEMU_NS}}}arg")] == ["-incoming", "defer"]
    chain = [e.get("file") for e in root.iter("source")]
    assert chain == ["/d", "/s", "/g"]


class _FlakyQmp:
    """Records input events; fails the n-th send, as a busy QEMU monitor may."""

    def __init__(self, fail_at: int) -> None:
        self.sent: list[list[dict[str, object]]] = []
        self.fail_at = fail_at

    def qmp(self, domain: str, command: str, args: dict[str, list[dict[str, object]]]) -> None:
        if len(self.sent) == self.fail_at:
            self.sent.append([])
            raise OsfleetError("QMP input-send-event: monitor busy")
        self.sent.append(args["events"])


def test_a_drag_that_fails_midway_still_lets_the_button_go() -> None:
    qmp = _FlakyQmp(fail_at=3)  # move, press, one move ... then a move fails
    with pytest.raises(OsfleetError):
        Input(qmp, "osfleet-x", (1280, 800)).drag(10, 10, 200, 200)  # type: ignore[arg-type]
    last = qmp.sent[-1]
    assert last == [{"type": "btn", "data": {"down": False, "button": "left"}}]


def test_a_step_never_runs_past_its_budget() -> None:
    from osfleet.replicas.actions import run_actions

    acts = ACTIONS.validate_python([{"type": "wait", "seconds": 0.3}, {"type": "wait", "seconds": 5}, {"type": "wait"}])
    start = time.monotonic()
    results = run_actions(None, "osfleet-x", (1280, 800), acts, budget=0.5)  # type: ignore[arg-type]
    took = time.monotonic() - start
    assert 0.45 <= took < 1.0  # the second wait was cut to what was left
    assert [r.ok for r in results] == [True, True, False] and "budget" in (results[2].error or "")
