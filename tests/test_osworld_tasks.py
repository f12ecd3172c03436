"""OSWorld tasks offline: the asset store, conversion, host-side evaluation, ``tasks import`` (no VM).

The "guest" of the runner tests is this machine's own shell in a temporary folder (``LocalGuest``), so set-up
steps, file writes through base64 chunks, getters and post-config really run; only libvirt is left out.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import openpyxl
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from osfleet.api.app import create_app
from osfleet.cli import cli
from osfleet.config import AgentConfig
from osfleet.errors import GuestFileTooLargeError
from osfleet.tasks import runner
from osfleet.tasks.assets import AssetError, AssetStore, MissingAssetError
from osfleet.tasks.model import OsworldCheck, PutFile, Run, TaskError, UnsupportedTaskError
from osfleet.tasks.osworld_format.convert import OsworldTask, from_osworld, unsupported_features
from osfleet.tasks.osworld_format.guest_writes import RAW_CHUNK_BYTES, put_file
from osfleet.tasks.osworld_format.importer import import_folder
from tests import fake_guest_reads
from tests.fakes import FakeHost

URL = "https://example.test/files/budget.xlsx"
GOLD = "https://example.test/files/budget-gold.xlsx"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def workbook(path: Path, rows: list[list[Any]]) -> Path:
    wb = openpyxl.Workbook()
    ws = wb.active
    assert ws is not None
    for row in rows:
        ws.append(row)
    wb.save(path)
    return path


class LocalGuest:
    """The runner's view of a replica, played by this machine's shell (paths are real local paths)."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def shell(self, replica_id: str, command: str, timeout: float, as_root: bool = False) -> dict[str, Any]:
        self.commands.append(command)
        command = fake_guest_reads.as_local_user(command)
        p = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout)
        return {"exit_code": p.returncode, "stdout": p.stdout, "stderr": p.stderr}

    def read_file(self, replica_id: str, path: str, limit: int, timeout: float = 60.0) -> bytes:
        data = Path(path).read_bytes()
        if len(data) > limit:
            raise GuestFileTooLargeError(f"file over {limit / 2**20:g} MiB: {path}")
        return data


@pytest.mark.unit
def test_asset_store_adds_resolves_and_names_missing_urls(home: Path, tmp_path: Path) -> None:
    store = AssetStore.from_settings()
    f = tmp_path / "a.bin"
    f.write_bytes(b"x" * 100)
    asset = store.add(URL, f)
    again = store.add("https://mirror.test/a.bin", f)
    assert asset.sha256 == again.sha256 and asset.size == 100
    assert len(list((home / "assets" / "blobs").iterdir())) == 1  # one copy per content
    assert store.path(URL).read_bytes() == b"x" * 100
    assert store.urls() == [URL, "https://mirror.test/a.bin"]
    with pytest.raises(MissingAssetError, match="https://nowhere.test/x.xlsx"):
        store.resolve("https://nowhere.test/x.xlsx")


@pytest.mark.unit
def test_bundle_manifest_is_checked(home: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "assets").mkdir(parents=True)
    (bundle / "assets" / "a.txt").write_text("hello")
    manifest = bundle / "assets" / "manifest.json"
    manifest.write_text(json.dumps({"files": [{"url": URL, "file": "a.txt", "sha256": "0" * 64}]}))
    with pytest.raises(AssetError, match="sha256"):
        AssetStore.from_settings().add_bundle(bundle)
    manifest.write_text(json.dumps({"files": [{"url": URL, "file": "../../etc/passwd"}]}))
    with pytest.raises(AssetError, match="outside"):
        AssetStore.from_settings().add_bundle(bundle)
    manifest.write_text(json.dumps({"files": [{"url": URL, "file": "a.txt"}]}))
    assert [a.url for a in AssetStore.from_settings().add_bundle(bundle)] == [URL]


def calc_task(doc: str, **evaluator: Any) -> dict[str, Any]:
    ev = {
        "func": "compare_table",
        "result": {"type": "vm_file", "path": doc, "dest": "budget.xlsx"},
        "expected": {"type": "cloud_file", "path": GOLD, "dest": "gold.xlsx"},
        "options": {"rules": [{"type": "sheet_data", "sheet_idx0": "RI0", "sheet_idx1": "EI0"}]},
        "postconfig": [
            {"type": "activate_window", "parameters": {"window_name": "budget.xlsx - LibreOffice Calc"}},
            {"type": "execute", "parameters": {"command": ["touch", doc + ".saved"]}},
        ],
    }
    ev.update(evaluator)
    return {
        "id": "calc-total",
        "snapshot": "libreoffice_calc",
        "instruction": "Add the total in B3.",
        "config": [
            {"type": "download", "parameters": {"files": [{"url": URL, "path": doc}]}},
            {"type": "open", "parameters": {"path": doc}},
        ],
        "evaluator": ev,
    }


@pytest.mark.unit
def test_download_and_cloud_file_resolve_through_the_store(home: Path, tmp_path: Path) -> None:
    doc = "/home/user/budget.xlsx"
    with pytest.raises(MissingAssetError, match=re.escape(URL)):
        from_osworld(calc_task(doc))
    store = AssetStore.from_settings()
    store.add(URL, workbook(tmp_path / "in.xlsx", [["a", 1], ["b", 2]]))
    with pytest.raises(MissingAssetError, match=re.escape(GOLD)):
        from_osworld(calc_task(doc))
    store.add(GOLD, workbook(tmp_path / "gold.xlsx", [["a", 1], ["b", 2], ["total", 3]]))
    task = from_osworld(calc_task(doc))
    put, exists, launch, wait = task.setup
    assert isinstance(put, PutFile) and put.sha256 == store.resolve(URL).sha256 and put.path == doc
    assert isinstance(exists, Run) and "test -e /home/user/budget.xlsx" in exists.command
    assert launch.type == "launch" and "libreoffice --calc /home/user/budget.xlsx" in launch.command
    assert isinstance(wait, Run) and "xdotool search" in wait.command
    assert [s.type for s in task.postconfig] == ["run", "run"]
    assert "wmctrl -a 'budget.xlsx - LibreOffice Calc'" in task.postconfig[0].command  # type: ignore[union-attr]
    check = task.criteria[0].check
    assert isinstance(check, OsworldCheck) and check.func == "compare_table" and check.result["path"] == doc


@pytest.mark.system
def test_the_runner_sets_up_post_configures_and_scores_on_the_host(home: Path, tmp_path: Path) -> None:
    store = AssetStore.from_settings()
    store.add(URL, workbook(tmp_path / "in.xlsx", [["a", 1], ["b", 2]]))
    store.add(GOLD, workbook(tmp_path / "gold.xlsx", [["a", 1], ["b", 2], ["total", 3]]))
    doc = str(tmp_path / "guest" / "budget.xlsx")
    data = calc_task(doc)
    data["config"] = data["config"][:1]  # no application to open here
    task = from_osworld(data)
    guest = LocalGuest()
    runner.apply_setup(guest, "r-1", task)  # type: ignore[arg-type]
    assert Path(doc).read_bytes() == store.path(URL).read_bytes()
    first = runner.evaluate(guest, "r-1", task)  # type: ignore[arg-type]
    assert first.reward == 0.0 and "values differ" in first.criteria[0].detail
    assert Path(doc + ".saved").exists()  # post-config ran (its failed wmctrl step did not stop it)
    workbook(Path(doc), [["a", 1], ["b", 2], ["total", 3]])  # what the oracle would save
    assert runner.evaluate(guest, "r-1", task).reward == 1.0  # type: ignore[arg-type]
    Path(doc).unlink()
    assert runner.evaluate(guest, "r-1", task).reward == 0.0  # type: ignore[arg-type]  # no file: 0, not an error


@pytest.mark.system
def test_put_file_writes_large_files_in_chunks(tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(bytes(range(256)) * (RAW_CHUNK_BYTES // 128))
    guest = LocalGuest()
    dest = tmp_path / "deep" / "dir" / "big.bin"
    put_file(guest, "r-1", str(dest), src, 30)
    assert dest.read_bytes() == src.read_bytes() and not Path(f"{dest}.osfleet-part").exists()
    assert len(guest.commands) == 3  # mkdir with the first chunk, the second chunk, rename
    small = tmp_path / "small.txt"
    small.write_text("hello\n")
    put_file(guest, "r-1", str(tmp_path / "x" / "small.txt"), small, 30)
    assert (tmp_path / "x" / "small.txt").read_text() == "hello\n" and len(guest.commands) == 4  # one command
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    put_file(guest, "r-1", str(tmp_path / "x" / "empty"), empty, 30)
    assert (tmp_path / "x" / "empty").read_bytes() == b""


@pytest.mark.system
def test_getters_command_line_rule_and_window_size(home: Path, tmp_path: Path) -> None:
    data = {
        "id": "t",
        "instruction": "x",
        "evaluator": {
            "func": ["is_in_list", "literal_match"],
            "result": [
                {"type": "vm_command_line", "command": ["printf", "a b"]},
                {"type": "vm_window_size", "app_class_name": "NoSuchApp"},
            ],
            "expected": [
                {"type": "rule", "rules": {"expected": "b"}},
                {"type": "constant", "value": "{'width': 1, 'height': 2}"},
            ],
        },
    }
    task = from_osworld(data)
    ev = runner.evaluate(LocalGuest(), "r-1", task)  # type: ignore[arg-type]
    assert [c.met for c in ev.criteria] == [True, False] and ev.reward == 0.0  # OSWorld's "and": a 0 makes it 0
    data["evaluator"]["conj"] = "or"
    ev = runner.evaluate(LocalGuest(), "r-1", from_osworld(data))  # type: ignore[arg-type]
    assert [c.met for c in ev.criteria] == [True] and ev.reward == 1.0  # "or" stops at the first 1


@pytest.mark.unit
@pytest.mark.parametrize(
    ("step", "command"),
    [
        ({"type": "close_window", "parameters": {"window_name": "gimp", "by_class": True}}, "wmctrl -x -c gimp"),
        ({"type": "activate_window", "parameters": {"window_name": "A b", "strict": True}}, "wmctrl -F -a 'A b'"),
    ],
)
def test_window_steps(home: Path, step: dict[str, Any], command: str) -> None:
    data = calc_task("/tmp/x.txt", func="exact_match", result={"type": "vm_command_line", "command": "true"})
    data["config"] = [step]
    data["evaluator"] = {**data["evaluator"], "expected": {"type": "rule", "rules": {"expected": ""}}}
    data["evaluator"].pop("options")
    assert from_osworld(data).setup[0].command == command  # type: ignore[union-attr]


@pytest.mark.unit
def test_unsupported_features_are_all_named(home: Path) -> None:
    data = {
        "id": "t",
        "instruction": "x",
        "config": [{"type": "sparkle", "parameters": {}}, {"type": "googledrive", "parameters": {}}],
        "evaluator": {
            "func": ["no_such_metric", "exact_match"],
            "result": [{"type": "vm_file", "path": ["/a", "/b"], "multi": True}, {"type": "googledrive_file"}],
            "expected": [{"type": "rule", "rules": {}}, {"type": "calc_insensitive_md5"}],
            "conj": "xor",
        },
    }
    assert unsupported_features(data) == [
        "set-up type 'sparkle' (OSWorld has none by that name)",
        "set-up type 'googledrive': needs a Google Drive account and the internet (OSWorld's googledrive set-up)",
        "metric 'no_such_metric' (osfleet has no such metric yet)",
        "conj 'xor' (OSWorld has and, or)",
        "result type 'googledrive_file': reads a file from a Google Drive account over the internet",
        "expected type 'calc_insensitive_md5' (OSWorld has none by that name)",
    ]
    with pytest.raises(UnsupportedTaskError, match="sparkle"):
        from_osworld(data)
    assert unsupported_features(data, metrics=["no_such_metric", "exact_match"])[2].startswith("conj")


@pytest.mark.unit
def test_published_schema_lists_the_stored_urls(home: Path, tmp_path: Path) -> None:
    schema = json.dumps(OsworldTask.model_json_schema())
    assert URL not in schema and '"maxLength": 0' in schema  # nothing stored: no download can be asked for
    f = tmp_path / "f"
    f.write_text("x")
    AssetStore.from_settings().add(URL, f)
    assert f'"enum": ["{URL}"]' in json.dumps(OsworldTask.model_json_schema())


@pytest.mark.unit
def test_a_missing_asset_is_a_422_naming_the_url(home: Path, tmp_path: Path) -> None:
    fake = FakeHost(tmp_path, ready=1)
    auth = {"Authorization": "Bearer t"}
    with TestClient(create_app(AgentConfig(token="t", warm=0), lambda: fake)) as c:
        r = c.post("/v1/leases", json={"holder": "t"}, headers=auth)
        rid, lid = r.json()["replica_id"], r.json()["lease_id"]
        r = c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": calc_task("/tmp/b.xlsx")}, headers=auth)
    assert r.status_code == 422 and r.json()["kind"] == "invalid_task" and URL in r.json()["error"]


def make_bundle(root: Path) -> Path:
    (root / "assets").mkdir(parents=True)
    workbook(root / "assets" / "in.xlsx", [["a", 1]])
    workbook(root / "assets" / "gold.xlsx", [["a", 1], ["total", 1]])
    (root / "assets" / "manifest.json").write_text(
        json.dumps({"files": [{"url": URL, "file": "in.xlsx"}, {"url": GOLD, "file": "gold.xlsx"}]})
    )
    (root / "calc").mkdir()
    (root / "calc" / "ok.json").write_text(json.dumps(calc_task("/home/user/budget.xlsx")))
    bad = calc_task("/home/user/budget.xlsx", func="no_such_metric")
    (root / "calc" / "bad.json").write_text(json.dumps(bad))
    (root / "calc" / "broken.json").write_text("{")
    return root


@pytest.mark.unit
def test_import_reports_each_task_and_adds_the_bundle_assets(home: Path, tmp_path: Path) -> None:
    report = import_folder(make_bundle(tmp_path / "bundle"))
    by_file = {t.file: t for t in report.tasks}
    assert by_file["calc/ok.json"].supported and by_file["calc/ok.json"].features_supported
    assert by_file["calc/bad.json"].unsupported == ["metric 'no_such_metric' (osfleet has no such metric yet)"]
    assert by_file["calc/broken.json"].unsupported[0].startswith("not JSON")
    assert report.summary["supported"] == 1 and report.summary["tasks"] == 3 and report.assets_added == 2
    with pytest.raises(TaskError, match="no task JSON"):
        import_folder(tmp_path / "bundle" / "assets")


@pytest.mark.unit
def test_import_and_assets_commands(home: Path, tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "bundle")
    cli_runner = CliRunner()
    r = cli_runner.invoke(cli, ["tasks", "import", str(bundle), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["summary"]["supported"] == 1
    assert out["summary"]["unsupported_features"]["metric 'no_such_metric' (osfleet has no such metric yet)"] == 1
    task = next(t for t in out["tasks"] if t["file"] == "calc/ok.json")
    assert task["features_supported"] and task["missing_assets"] == [] and task["id"] == "calc-total"
    r = cli_runner.invoke(cli, ["tasks", "import", str(bundle)])
    assert "1 of 3 tasks supported" in r.output and "unsupported  calc/bad.json: metric 'no_such_metric'" in r.output
    f = tmp_path / "x.txt"
    f.write_text("x")
    r = cli_runner.invoke(cli, ["tasks", "assets", "add", "https://example.test/x.txt", str(f)])
    assert r.exit_code == 0 and "https://example.test/x.txt" in r.output
    r = cli_runner.invoke(cli, ["tasks", "assets", "ls", "--json"])
    assert (
        json.loads(r.output)["https://example.test/x.txt"]
        == AssetStore.from_settings().resolve("https://example.test/x.txt").sha256
    )
    r = cli_runner.invoke(cli, ["tasks", "import", str(tmp_path / "bundle" / "assets")])
    assert r.exit_code != 0 and r.output.strip().splitlines()[-1].startswith("osfleet: error: no task JSON")


@pytest.mark.unit
def test_a_broken_asset_index_leaves_the_schema_without_downloads(home: Path) -> None:
    (home / "assets").mkdir(parents=True)
    (home / "assets" / "index.json").write_text("{not json")
    assert '"maxLength": 0' in json.dumps(OsworldTask.model_json_schema())
    with pytest.raises(AssetError, match="unreadable"):
        AssetStore.from_settings().resolve(URL)


@pytest.mark.unit
def test_an_unsupported_feature_is_a_422_naming_it_and_one_cli_line(home: Path, tmp_path: Path) -> None:
    task = {"id": "t", "instruction": "x", "config": [{"type": "googledrive", "parameters": {}}]}
    task["evaluator"] = {"func": "infeasible"}
    fake = FakeHost(tmp_path, ready=1)
    auth = {"Authorization": "Bearer t"}
    with TestClient(create_app(AgentConfig(token="t", warm=0), lambda: fake)) as c:
        r = c.post("/v1/leases", json={"holder": "t"}, headers=auth)
        rid, lid = r.json()["replica_id"], r.json()["lease_id"]
        r = c.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid, "task": task}, headers=auth)
        assert r.status_code == 422 and "set-up type 'googledrive': needs a Google Drive account" in r.json()["error"]
        r = c.post("/reset", json={"task_config": task, "timeout": 60}, headers=auth)
        assert r.status_code == 422 and "googledrive" in r.json()["error"]
    f = tmp_path / "t.json"
    f.write_text(json.dumps(task))
    r = CliRunner().invoke(cli, ["tasks", "validate", "--file", str(f)])
    assert r.exit_code != 0 and r.output.strip().splitlines() == [
        "osfleet: error: unsupported OSWorld set-up type 'googledrive': needs a Google Drive account and the "
        "internet (OSWorld's googledrive set-up)"
    ]
