"""OSWorld's set-up steps, getters and scoring on a real replica of the office image (heavy: run under the lock).

    flock /tmp/osfleet-heavy.lock .venv/bin/python -m pytest -m vm tests/test_osworld_vm.py

What the unit tests play with a local shell here runs in the guest: paths resolved as OSWorld's server does,
files written through the guest agent, the task cache, multi-file getters, and Chrome's tabs through DevTools
asked by the query script inside the guest (the replica has no network device).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from osfleet.config import Settings
from osfleet.replicas.manager import ReplicaHost
from osfleet.tasks import runner
from osfleet.tasks.assets import AssetStore
from osfleet.tasks.osworld_format import getters
from osfleet.tasks.osworld_format.convert import from_osworld
from osfleet.vm.images import GoldenImage

pytestmark = [pytest.mark.vm, pytest.mark.slow]
PAGE = "https://pages.test/shop.html"
NOTE = "https://pages.test/b.txt"


@pytest.fixture(scope="module")
def office(office_image: GoldenImage) -> Iterator[tuple[ReplicaHost, str]]:
    settings = Settings.from_env()
    with ReplicaHost(office_image, settings, mode="snapshot", auto_recover=False) as host:
        rid = host.create().replica
        try:
            yield host, rid
        finally:
            host.down([rid])


@pytest.fixture
def store(tmp_path: Path) -> AssetStore:
    store = AssetStore.from_settings()
    (tmp_path / "b.txt").write_text("beta\n")
    (tmp_path / "shop.html").write_text("<html><head><title>Shop</title></head><body><p>42 USD</p></body></html>")
    store.add(NOTE, tmp_path / "b.txt")
    store.add(PAGE, tmp_path / "shop.html")
    return store


def task(config: list[dict[str, Any]], **evaluator: Any) -> dict[str, Any]:
    return {"id": "vm", "instruction": "x", "config": config, "evaluator": evaluator}


def test_steps_paths_cache_and_multi_file_getters(office: tuple[ReplicaHost, str], store: AssetStore) -> None:
    host, rid = office
    config = [
        {
            "type": "download",
            "parameters": {"files": [{"url": NOTE, "path": "~/osw/a.txt"}, {"url": NOTE, "path": "osw/b.txt"}]},
        },
        {
            "type": "execute",
            "parameters": {"command": ["sh", "-c", "echo alpha > ~/osw/a.txt; ls ~/osw"], "stdout": "ls.out"},
        },
    ]
    data = task(
        config,
        func=["check_include_exclude", "compare_text_file", "check_include_exclude"],
        result=[
            {"type": "cache_file", "path": "ls.out"},
            {
                "type": "vm_file",
                "path": ["~/osw/a.txt", "/home/user/osw/b.txt"],
                "dest": ["a", "b"],
                "multi": True,
                "gives": [1],
            },
            {"type": "vm_command_line", "command": ["cat", "~/osw/a.txt"]},
        ],
        expected=[
            {"type": "rule", "rules": {"include": ["a.txt", "b.txt"]}},
            {"type": "cloud_file", "path": NOTE, "dest": "b-gold.txt"},
            {"type": "rule", "rules": {"include": ["alpha"], "exclude": ["beta"]}},
        ],
    )
    t = from_osworld(data, store)
    runner.reset_to_task(host, rid, t)
    ev = runner.evaluate(host, rid, t)
    assert ev.reward == 1.0, ev
    owner = host.shell(rid, "stat -c %U:%a /var/lib/osfleet-task-cache/ls.out", 30, True)["stdout"].strip()
    assert owner.startswith("root:")  # the agent (the desktop user) cannot rewrite the cache
    infeasible = from_osworld({"id": "i", "instruction": "x", "evaluator": {"func": "infeasible"}})
    assert runner.evaluate(host, rid, infeasible, True).reward == 1.0
    assert runner.evaluate(host, rid, t, True).reward == 0.0  # declared infeasible: OSWorld gives 0


def test_chrome_tabs_through_devtools_in_the_guest(
    office: tuple[ReplicaHost, str], store: AssetStore, tmp_path: Path
) -> None:
    host, rid = office
    has = host.shell(rid, "python3 -c 'import websocket' && echo yes", 60)["stdout"]
    if "yes" not in has:
        pytest.fail("the office image lacks python3-websocket, which the guest query script needs (office recipe)")
    config = [
        {"type": "download", "parameters": {"files": [{"url": PAGE, "path": "/home/user/shop.html"}]}},
        {"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}},
        {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["file:///home/user/shop.html"]}},
    ]
    data = task(config, func="check_include_exclude", result={"type": "active_url_from_accessTree", "goto_prefix": ""})
    data["evaluator"]["expected"] = {"type": "rule", "rules": {"include": ["shop.html"]}}
    t = from_osworld(data, store)
    runner.reset_to_task(host, rid, t)
    assert runner.evaluate(host, rid, t).reward == 1.0
    tabs = getters.get(host, rid, {"type": "open_tabs_info"}, tmp_path, store, 60)
    assert [tab["title"] for tab in tabs] == ["Shop"]
