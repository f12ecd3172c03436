"""``osfleet tasks assets fetch``: every URL a folder's task files name, downloaded into the store by sha256.

The web is a local HTTP server in a thread (this machine has no internet) that answers 404, resets the
connection, fails once then works, or sends its body slowly; the interrupt tests run the real command as a
process and stop it with SIGINT and SIGTERM mid-download.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from osfleet.cli import cli
from osfleet.tasks.assets import AssetStore, fetch
from osfleet.tasks.osworld_format.convert import HISTORY_TEMPLATE_URL, asset_urls

BODY = b"the expected workbook\n" * 1000
SLOW_BYTES = 4 << 20


class Web(BaseHTTPRequestHandler):
    hits: dict[str, int] = {}

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?")[0]
        Web.hits[path] = Web.hits.get(path, 0) + 1
        if path == "/missing":
            self.send_error(404)
        elif path == "/reset" or (path == "/flaky" and Web.hits[path] == 1):
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY[:100])
            self.connection.shutdown(socket.SHUT_RDWR)  # the peer sees the body end early
        elif path == "/slow":
            self.send_response(200)
            self.send_header("Content-Length", str(SLOW_BYTES))
            self.end_headers()
            for _ in range(SLOW_BYTES // 65536):
                self.wfile.write(b"s" * 65536)
                time.sleep(0.2)
        else:
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)


@pytest.fixture
def web() -> Iterator[str]:
    Web.hits = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), Web)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path / "osfleet-home"))
    return tmp_path / "osfleet-home"


def task(urls: list[str], cloud: list[str]) -> dict[str, object]:
    return {
        "id": "t",
        "instruction": "x",
        "config": [{"type": "download", "parameters": {"files": [{"url": u, "path": "~/f"} for u in urls]}}],
        "evaluator": {
            "func": "compare_table",
            "result": {"type": "vm_file", "path": ["/a", "/b"], "dest": ["a", "b"], "multi": True},
            "expected": {"type": "cloud_file", "path": cloud, "dest": ["c", "d"], "multi": True},
        },
    }


def folder(root: Path, tasks: list[dict[str, object]]) -> Path:
    for i, t in enumerate(tasks):
        (root / "app").mkdir(parents=True, exist_ok=True)
        (root / "app" / f"{i}.json").write_text(json.dumps(t))
    return root


@pytest.mark.unit
def test_asset_urls_cover_downloads_multi_cloud_files_and_the_history_template() -> None:
    data = task(["u1", "u2"], ["c1", "c2"])
    data["evaluator"]["postconfig"] = [  # type: ignore[index]
        {"type": "download", "parameters": {"files": [{"url": "u3", "path": "x"}]}},
        {"type": "update_browse_history", "parameters": {"history": []}},
    ]
    assert asset_urls(data) == ["u1", "u2", "u3", HISTORY_TEMPLATE_URL, "c1", "c2"]


@pytest.mark.integration  # over a second: kept out of the unit tier's 2 minutes
def test_fetch_stores_by_sha256_retries_and_names_what_is_missing(home: Path, web: str) -> None:
    store = AssetStore.from_settings()
    said: list[str] = []
    urls = [f"{web}/ok.xlsx", f"{web}/missing", f"{web}/reset", f"{web}/flaky", f"{web}/same-bytes"]
    report = fetch(store, urls, say=said.append, retries=2, timeout=5)
    assert sorted(a.url for a in report.fetched) == sorted([f"{web}/ok.xlsx", f"{web}/flaky", f"{web}/same-bytes"])
    assert set(report.missing) == {f"{web}/missing", f"{web}/reset"}
    assert "404" in report.missing[f"{web}/missing"] and "closed after 100" in report.missing[f"{web}/reset"]
    assert Web.hits["/missing"] == 1  # a 404 is not retried
    assert Web.hits["/reset"] == 3 and Web.hits["/flaky"] == 2  # 1 + 2 retries; one failure, then success
    digest = hashlib.sha256(BODY).hexdigest()
    assert store.path(f"{web}/flaky").read_bytes() == BODY and store.resolve(f"{web}/ok.xlsx").sha256 == digest
    assert [p.name for p in (home / "assets" / "blobs").iterdir()] == [digest]  # one copy per content
    assert not list((home / "assets" / ".partial").iterdir())  # nothing half-written is left
    assert (
        any("try 2" in line for line in said) and report.summary == "3 downloaded (0.1 MiB), 0 already held, 2 missing"
    )
    again = fetch(store, urls[:1], retries=0)
    assert again.held == urls[:1] and not again.fetched  # held URLs are not downloaded again


@pytest.mark.unit
def test_fetch_command_reads_the_task_files_and_exits_non_zero_on_missing(home: Path, web: str, tmp_path: Path) -> None:
    root = folder(tmp_path / "tasks", [task([f"{web}/a"], [f"{web}/b", f"{web}/missing"])])
    (root / "app" / "broken.json").write_text("{")
    r = CliRunner().invoke(cli, ["tasks", "assets", "fetch", str(root), "--retries", "0"])
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert f"missing  {web}/missing: HTTP 404 Not Found" in lines and lines[-1].endswith("1 missing")
    assert "skipped" in r.output and "3 URLs named" in r.output
    r = CliRunner().invoke(cli, ["tasks", "import", str(root), "--json"])
    t = next(t for t in json.loads(r.stdout)["tasks"] if t["file"] == "app/0.json")
    assert t["missing_assets"] == [f"{web}/missing"] and not t["supported"]


@pytest.mark.unit
def test_offline_every_url_is_one_missing_line(home: Path, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on: what a machine without internet sees
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    root = folder(tmp_path / "tasks", [task([f"{dead}/a"], [f"{dead}/b", f"{dead}/c"])])
    r = CliRunner().invoke(cli, ["tasks", "assets", "fetch", str(root), "--retries", "0", "--json"])
    assert r.exit_code == 1
    out = json.loads(r.stdout)
    assert sorted(out["missing"]) == [f"{dead}/a", f"{dead}/b", f"{dead}/c"]
    assert all("Connection refused" in why for why in out["missing"].values())


@pytest.mark.system
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_fetch_leaves_no_half_file(home: Path, web: str, tmp_path: Path, sig: signal.Signals) -> None:
    root = folder(tmp_path / "tasks", [task([f"{web}/ok.xlsx", f"{web}/slow"], [f"{web}/b", f"{web}/c"])])
    env = {**os.environ, "OSFLEET_HOME": str(home)}
    cmd = [sys.executable, "-m", "osfleet", "tasks", "assets", "fetch", str(root)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    partial = home / "assets" / ".partial"
    deadline = time.monotonic() + 60
    while not (partial.is_dir() and any(p.stat().st_size > 0 for p in partial.iterdir())):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "the download under way was removed" in err and err.strip().splitlines()[-1] == "osfleet: interrupted"
    assert not list(partial.iterdir())
    store = AssetStore.from_settings()
    assert store.held(f"{web}/ok.xlsx") and not store.held(f"{web}/slow")  # finished ones are kept
    assert [p.name for p in (home / "assets" / "blobs").iterdir()] == [hashlib.sha256(BODY).hexdigest()]
