"""The Pulumi program against lab hosts with the real engine (scripts/build-pulumi): config errors at preview,
and the whole cycle up -> health + screenshot -> second up -> config change -> destroy -> nothing left."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from osfleet.config import Settings
from osfleet.errors import MissingToolError
from osfleet.lab import lab as lab_ops
from osfleet.lab.engine import EngineError, call, engine_root, engine_version, purge_stack_files, stack
from osfleet.lab.state import LabState, load
from osfleet.tls import SYSTEM_CA_BUNDLE, client_context

# One xdist worker: the machine has one lab (lab_root); and in CI a step of their own (pyproject's machine_lab).
pytestmark = [pytest.mark.xdist_group("lab"), pytest.mark.machine_lab]

REPO = Path(__file__).resolve().parent.parent
OSFLEET = str(Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "osfleet")
STACK = "test-lab"


@pytest.fixture(scope="module")
def engine() -> str:
    try:
        return engine_version(engine_root())
    except MissingToolError as exc:
        pytest.fail(f"the Pulumi engine is not built: {exc}")


@pytest.fixture(scope="module")
def lab(engine: str) -> Iterator[LabState]:
    root = lab_ops.lab_root()
    existing = load(root)
    if existing is not None and lab_ops.running(existing):
        pytest.skip(f"a lab is up on this machine ({root}); these tests make their own: 'osfleet lab down' first")
    state = lab_ops.up(2, root, lambda m: None)
    yield state
    lab_ops.down(root, lambda m: None)


@pytest.fixture
def lab_stack(lab: LabState, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A throwaway stack on the lab in a folder of its own, its state removed afterwards."""
    from pulumi import automation as auto

    # The inline program finds the lab from OSFLEET_HOME when it runs: pinned to this lab's home, since an
    # earlier test of this xdist worker may have left another there (``engine.stack`` exports its settings).
    monkeypatch.setenv("OSFLEET_HOME", str(Path(lab.root).parent))
    st = stack(STACK, work_dir=tmp_path)
    st.set_config("osfleet:platform", auto.ConfigValue("lab"))
    st.set_config("osfleet:hosts", auto.ConfigValue("2"))
    st.set_config("osfleet:agentToken", auto.ConfigValue("t0k3n-" + os.urandom(8).hex(), secret=True))
    yield st
    try:
        call(st.destroy)
    finally:
        call(st.workspace.remove_stack, STACK)
        purge_stack_files(STACK)


@pytest.mark.system
@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("hosts", "0", "osfleet:hosts: 0 hosts: a stack needs at least one"),
        ("hosts", "3", "osfleet:hosts: the lab has 2 hosts, the stack wants 3; run 'osfleet lab up --hosts 3'"),
        ("mode", "warm", "osfleet:mode: 'warm' is not one of snapshot, cold"),
        ("warm", "-1", "osfleet:warm: -1 is out of range 0..4096"),
        ("recipe", "no/such/recipe.yaml", f"osfleet:recipe: no recipe file {REPO}/no/such/recipe.yaml"),
        ("platform", "azure", "osfleet:platform: 'azure' is not one of lab, onprem, aws, k8s"),
        ("footprintRun", "/no/such/run", "osfleet:footprintRun: no run directory /no/such/run"),
        ("usdPerHostHour", "-1", "osfleet:usdPerHostHour: -1.0 is negative"),
    ],
)
def test_bad_config_fails_at_preview_with_one_line_naming_the_key(
    lab_stack: Any, key: str, value: str, expected: str
) -> None:
    from pulumi import automation as auto

    lab_stack.set_config(f"osfleet:{key}", auto.ConfigValue(value))
    with pytest.raises(EngineError) as err:
        call(lab_stack.preview)
    assert str(err.value) == expected


@pytest.mark.system
def test_missing_secret_fails_at_preview(lab_stack: Any) -> None:
    lab_stack.remove_config("osfleet:agentToken")
    with pytest.raises(EngineError) as err:
        call(lab_stack.preview)
    assert str(err.value) == (
        "osfleet:agentToken: missing secret; set it with 'pulumi config set --secret osfleet:agentToken'"
    )


def _get(
    url: str, token: str | None = None, method: str = "GET", body: dict[str, Any] | None = None, ca: str = ""
) -> Any:
    """One call to an agent of the stack, verified against the stack's CA (PEM text ``ca``)."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    with urllib.request.urlopen(req, timeout=30, context=client_context(ca_pem=ca)) as resp:
        return json.load(resp)


def _ready(url: str, token: str, timeout: float, ca: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["state"] == "ready" for r in _get(f"{url}/v1/replicas", token, ca=ca)):
            return
        time.sleep(2)
    raise AssertionError(f"no ready replica at {url} after {timeout:.0f} s")


@pytest.mark.vm
def test_up_serves_screenshots_second_up_changes_nothing_config_updates_only_agents_destroy_leaves_nothing(
    lab: LabState, lab_stack: Any, settings: Settings, tmp_path: Path
) -> None:
    from pulumi import automation as auto

    from osfleet.bench.infra import infra_leftovers
    from osfleet.measure.cost import HostType, replicas_per_host
    from osfleet.report.load import load as load_run

    run_dir = REPO / "tests" / "data" / "run-sample"
    lab_stack.set_config("osfleet:warm", auto.ConfigValue("1"))
    lab_stack.set_config("osfleet:footprintRun", auto.ConfigValue(str(run_dir)))
    lab_stack.set_config("osfleet:usdPerHostHour", auto.ConfigValue("0.5"))
    up = call(lab_stack.up)
    assert up.summary.resource_changes == {"create": 17}  # 13 + the CA (component and key) + a certificate per agent
    # Capacity from the measured footprint and this machine's size (the lab hosts share it).
    mem_gib = round(int(Path("/proc/meminfo").read_text().split()[1]) / 2**20, 2)
    cost = load_run(run_dir).cost
    assert cost is not None
    n, binding = replicas_per_host(HostType("lab", os.cpu_count() or 1, mem_gib, 0.5, "test"), cost.footprint)
    assert up.outputs["replicaCapacity"].value == {"lab1": n, "lab2": n}
    assert up.outputs["bindingResource"].value == {"lab1": binding, "lab2": binding}
    if n:
        assert up.outputs["usdPerReplicaDay"].value == {"lab1": round(12 / n, 4), "lab2": round(12 / n, 4)}
    urls: dict[str, str] = up.outputs["agents"].value
    token: str = up.outputs["agentToken"].value
    ca: str = up.outputs["caCert"].value
    assert sorted(urls) == ["lab1", "lab2"] and all(u.startswith("https://") for u in urls.values())
    for url in urls.values():
        assert _get(f"{url}/health", ca=ca)["status"] == "ok"
        _ready(url, token, timeout=600, ca=ca)
        lease = _get(f"{url}/v1/leases", token, "POST", {"holder": "test"}, ca=ca)
        obs = _get(f"{url}/v1/replicas/{lease['replica_id']}/observation?lease_id={lease['lease_id']}", token, ca=ca)
        assert base64.b64decode(obs["screenshot"])[:8] == b"\x89PNG\r\n\x1a\n"
        with pytest.raises(urllib.error.HTTPError) as denied:
            _get(f"{url}/v1/host", "wrong-token", ca=ca)
        assert denied.value.code == 401
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):  # the system's CAs: no
            urllib.request.urlopen(f"{url}/health", timeout=10, context=client_context(SYSTEM_CA_BUNDLE))

    again = call(lab_stack.up)
    assert again.summary.resource_changes == {"same": 17}

    lab_stack.set_config("osfleet:warm", auto.ConfigValue("0"))
    changed = call(lab_stack.up)
    assert changed.summary.resource_changes == {"same": 15, "update": 2}  # the two agents, nothing else

    # A new recipe replaces only the image (its build and each host's copy) and restarts the agents onto it.
    recipe = tmp_path / "desktop-1024.yaml"
    recipe.write_text((REPO / "golden_images/recipes/desktop.yaml").read_text().replace("width: 1280", "width: 1024"))
    lab_stack.set_config("osfleet:recipe", auto.ConfigValue(str(recipe)))
    preview = call(lab_stack.preview)
    assert preview.change_summary == {"same": 12, "replace": 3, "update": 2}
    lab_stack.remove_config("osfleet:recipe")

    call(lab_stack.destroy)
    assert infra_leftovers(lab, settings) == {
        "domains": 0, "agent_processes": 0, "agent_folders": 0, "published_images": 0,
    }  # fmt: skip
    for h in lab.hosts:
        done = subprocess.run(
            [OSFLEET, "replicas", "ls", "--json"], capture_output=True, text=True, env={**os.environ, **h.env}
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == []


@pytest.mark.system
@pytest.mark.slow
def test_onprem_stack_prepares_a_host_given_as_user_at_host(lab: LabState, tmp_path: Path) -> None:
    """The onprem code path (user@host list, SSH key, home, prefix) against one lab host, up and destroy."""
    from pulumi import automation as auto

    h = lab.hosts[0]
    st = stack("test-onprem", work_dir=tmp_path)
    try:
        for key, value in {
            "platform": "onprem",
            "hosts": json.dumps([f"root@{h.addr}:22"]),
            "sshKey": lab.key,
            "home": h.home,
            "namePrefix": h.name_prefix,
            "osfleetBin": OSFLEET,
            "tuneKernel": "false",  # the lab host shares this machine's kernel
            "warm": "0",
        }.items():
            st.set_config(f"osfleet:{key}", auto.ConfigValue(value))
        st.set_config("osfleet:agentToken", auto.ConfigValue("t0k3n", secret=True))
        up = call(st.up)
        assert up.outputs["hosts"].value == {"host1": h.addr}
        assert _get(f"{up.outputs['agents'].value['host1']}/health", ca=up.outputs["caCert"].value)["status"] == "ok"
        assert (Path(h.home) / "images" / f"{up.outputs['goldenImage'].value}.qcow2").exists()
        call(st.destroy)
        assert not (Path(h.home) / "agent").exists()
        assert not list((Path(h.home) / "images").glob("golden-*"))
    finally:
        call(st.destroy)
        call(st.workspace.remove_stack, "test-onprem")
        purge_stack_files("test-onprem")


@pytest.mark.system
def test_onprem_needs_hosts(lab: LabState, tmp_path: Path) -> None:
    from pulumi import automation as auto

    st = stack("test-onprem", work_dir=tmp_path)
    try:
        st.set_config("osfleet:platform", auto.ConfigValue("onprem"))
        st.set_config("osfleet:agentToken", auto.ConfigValue("t0k3n", secret=True))
        with pytest.raises(EngineError) as err:
            call(st.preview)
        assert str(err.value) == "osfleet:hosts: zero hosts; give a list of user@host[:port]"
        st.set_config("osfleet:hosts", auto.ConfigValue('["root@10.233.255.254:22"]'))
        st.set_config("osfleet:sshKey", auto.ConfigValue(lab.key))
        with pytest.raises(EngineError) as err:
            call(st.preview)
        assert str(err.value).startswith("osfleet:hosts: host 10.233.255.254:22 is unreachable")
    finally:
        call(st.workspace.remove_stack, "test-onprem")
        purge_stack_files("test-onprem")
