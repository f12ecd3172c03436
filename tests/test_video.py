"""A recorded episode as an MP4 (``osfleet trajectories export ID --format mp4``), checked by decoding it with the
same ffmpeg: as many frames as the recorded times say at 10 a second, each screen on from its time to the next,
a screen of another size fitted into the first's, and an interrupted or failed export leaving nothing behind."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx2 as httpx
import imageio_ffmpeg
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from PIL import Image

from osfleet.api.app import create_app
from osfleet.api.auth import load_clients
from osfleet.cli import cli
from osfleet.config import AgentConfig, RecordingConfig
from osfleet.fleet.app import create_gateway
from osfleet.fleet.hosts import HostEntry
from osfleet.recording import TrajectoryStore, store_dir
from osfleet.recording.store import StepRecord, TrajectoryMeta, new_id
from osfleet.recording.video import export_mp4, frame_counts, screens
from tests.fakes import FakeHost
from tests.test_ui import ui_login

pytestmark = pytest.mark.system
T0 = 1_700_000_000.0
RED, GREEN, BLUE, WHITE, BLACK = (220, 30, 30), (30, 200, 30), (30, 30, 220), (240, 240, 240), (0, 0, 0)
Colour = tuple[int, int, int]
Shown = tuple[tuple[int, int], Colour]  # a screen's size and colour


def record(store: TrajectoryStore, reset: Shown | None, steps: list[tuple[float, Shown | None]]) -> str:
    """An episode as the recorder writes one: started at ``T0``, a reset screen (size, colour) or none, and steps
    of (seconds after ``T0``, (size, colour) or None for a step recorded without a screen)."""
    meta = TrajectoryMeta(id=new_id(T0), replica_id="r-1", lease_id="l-1", started_at=T0)
    store.create(meta)

    def screen(name: str, size: tuple[int, int], colour: Colour) -> None:
        path = store.root / meta.id / name
        Image.new("RGB", size, colour).save(path, "JPEG", quality=95)

    if reset is not None:
        meta.reset_image = "reset.jpg"
        screen(meta.reset_image, *reset)
    for i, (after, shown) in enumerate(steps):
        name = f"{i:06d}.jpg" if shown else None
        if shown:
            screen(f"{i:06d}.jpg", *shown)
        record = StepRecord(
            index=i, action_id=f"a{i}", time=T0 + after, seconds=0.1, actions=[], results=[], done=False, image=name
        )
        store.append_step(meta, record)
    return meta.id


def decoded(video: Path) -> tuple[tuple[int, int], list[Colour], list[Colour]]:
    """The video's frame size, and the colour at the centre and at the top left corner of each of its frames
    (decoded by ffmpeg)."""
    probe = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", str(video)], capture_output=True)
    line = next(x for x in probe.stderr.decode().splitlines() if "Video: h264" in x)
    assert "yuv420p" in line, line
    size = next(tuple(int(n) for n in part.split()[0].split("x")) for part in line.split(", ") if "x" in part[:5])
    raw = subprocess.run(
        [imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", str(video), "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        capture_output=True,
        check=True,
    ).stdout
    w, h = size
    frames = [raw[i : i + w * h * 3] for i in range(0, len(raw), w * h * 3)]
    centre = ((h // 2) * w + w // 2) * 3
    return (w, h), [(f[centre], f[centre + 1], f[centre + 2]) for f in frames], [(f[0], f[1], f[2]) for f in frames]


def near(got: Colour, want: Colour) -> bool:
    return all(abs(a - b) < 40 for a, b in zip(got, want, strict=True))


def test_frames_follow_the_recorded_times() -> None:
    # at 10 frames a second from the first screen: edges at 0, 3, 10 and 23 frames, the last held 1 s
    assert frame_counts([0.0, 0.32, 1.04, 2.26]) == [3, 7, 13, 10]
    assert frame_counts([5.0, 5.01, 5.3]) == [0, 3, 10]  # a screen on for less than a frame is not seen
    assert frame_counts([1.0, 0.5, 2.0]) == [0, 10, 10]  # a clock that went back: the screen comes at once
    assert frame_counts([]) == []


def test_an_episode_exported_as_mp4_shows_each_screen_at_its_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    store = TrajectoryStore(store_dir(tmp_path))
    tid = record(
        store,
        ((64, 40), RED),
        [
            (0.32, ((64, 40), GREEN)),
            (0.6, None),  # recorded without a screen: green stays on
            (1.04, ((90, 60), BLUE)),  # the resolution changed: fitted into 64x40, centred
            (2.26, ((64, 40), WHITE)),
        ],
    )
    out = tmp_path / "videos" / "episode.mp4"
    r = CliRunner().invoke(cli, ["trajectories", "export", tid, "--format", "mp4", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert f"{out}: 33 frames, 3.3 s, 64x40" in r.stdout
    assert imageio_ffmpeg.count_frames_and_secs(str(out)) == (33, pytest.approx(3.3))
    size, centres, corners = decoded(out)
    assert size == (64, 40)
    expected = [RED] * 3 + [GREEN] * 7 + [BLUE] * 13 + [WHITE] * 10
    assert [near(c, e) for c, e in zip(centres, expected, strict=True)] == [True] * 33, centres
    # the 90x60 screen fitted is 60x40, centred: black at its sides, the others fill the frame
    corner = [BLACK if e == BLUE else e for e in expected]
    assert [near(c, e) for c, e in zip(corners, corner, strict=True)] == [True] * 33, corners
    assert [p.name for p in out.parent.iterdir()] == ["episode.mp4"]  # no temporary left beside it

    r = CliRunner().invoke(cli, ["trajectories", "export", tid, "--format", "mp4"])  # named after the episode
    assert r.exit_code == 0 and imageio_ffmpeg.count_frames_and_secs(f"{tid}.mp4")[0] == 33, r.output


def test_odd_sides_are_padded_to_even_ones(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    tid = record(store, None, [(0.0, ((65, 41), GREEN)), (0.5, ((65, 41), RED))])
    video = export_mp4(store, tid, tmp_path / "odd.mp4")
    assert (video.width, video.height, video.frames) == (66, 42, 15)
    size, centres, _ = decoded(tmp_path / "odd.mp4")
    assert size == (66, 42) and near(centres[0], GREEN) and near(centres[-1], RED)


def test_an_interrupted_export_leaves_no_file_and_keeps_the_old_one(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    tid = record(store, ((64, 40), RED), [(30.0, ((64, 40), GREEN))])  # 301 frames
    out = tmp_path / "out" / "episode.mp4"
    out.parent.mkdir()
    out.write_bytes(b"the video of an earlier export")
    seen: list[int] = []

    def interrupt(done: int, total: int) -> None:
        seen.append(done)
        if done >= 100:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export_mp4(store, tid, out, progress=interrupt)
    assert seen == [50, 100]
    assert [p.name for p in out.parent.iterdir()] == ["episode.mp4"]
    assert out.read_bytes() == b"the video of an earlier export"
    alive = subprocess.run(["pgrep", "-f", f"ffmpeg.*{out.name}"], capture_output=True, text=True)
    assert alive.stdout == "", "the interrupted export's ffmpeg is still running"


def test_a_bad_id_or_an_episode_without_screens_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSFLEET_HOME", str(tmp_path))
    store = TrajectoryStore(store_dir(tmp_path))
    blind = record(store, None, [(1.0, None)])
    runner = CliRunner()
    for args, says in [
        (["t-nope"], f"osfleet: error: no recorded episode t-nope in {store.root}"),
        ([blind], f"osfleet: error: recorded episode {blind} has no screens to make a video of"),
        (["--all"], "osfleet: error: an MP4 is of one episode: give its id, not --all"),
    ]:
        r = runner.invoke(cli, ["trajectories", "export", *args, "--format", "mp4", "--out", str(tmp_path / "x.mp4")])
        assert r.exit_code == 1 and r.stderr.strip() == says, r.output
    assert not (tmp_path / "x.mp4").exists()
    r = runner.invoke(cli, ["trajectories", "export", blind, "--format", "jsonl"])
    assert r.exit_code == 1 and r.stderr.strip() == "osfleet: error: --format jsonl needs --out FILE"


# --- the dashboard's download, on a host agent and through the gateway --------------------------------------------
ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789"
HOST_TOKEN, GW_TOKEN = "host-token-0123456789", "gw-token-0123456789"


def test_the_dashboard_streams_the_mp4_of_an_episode_to_whoever_may_see_it(
    tmp_path: Path, served: Callable[..., str]
) -> None:
    clients = tmp_path / "clients"
    clients.write_text(f"alice {ALICE}\nbob {BOB}\n")
    fake = FakeHost(tmp_path / "h1", ready=1)
    config = AgentConfig(
        token=HOST_TOKEN, warm=0, recording=RecordingConfig(), clients=load_clients(clients, HOST_TOKEN)
    )
    url = served(create_app(config, lambda: fake))
    alice = {"Authorization": f"Bearer {ALICE}"}
    with httpx.Client(base_url=url, headers=alice) as api:
        lease = api.post("/v1/leases", json={}).json()
        rid, lid = lease["replica_id"], lease["lease_id"]
        assert api.post(f"/v1/replicas/{rid}/reset", json={"lease_id": lid}).status_code == 200
        for i in range(2):
            step = {"lease_id": lid, "action_id": f"a{i}", "actions": [{"type": "wait", "seconds": 0.15}]}
            assert api.post(f"/v1/replicas/{rid}/step", json=step).status_code == 200
        assert api.post(f"/v1/replicas/{rid}/release", json={"lease_id": lid}).status_code == 200
    store = TrajectoryStore(store_dir(fake.home))
    (tid,) = store.ids()
    frames = sum(s.frames for s in screens(store, tid))
    temporaries = set(Path(tempfile.gettempdir()).glob("osfleet-*.mp4"))

    def fetch(c: TestClient, path: str) -> bytes:
        r = c.get(path)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "video/mp4" and r.headers["content-disposition"].endswith('.mp4"')
        video = tmp_path / "got.mp4"
        video.write_bytes(r.content)
        assert imageio_ffmpeg.count_frames_and_secs(str(video))[0] == frames
        return r.content

    with TestClient(create_app(config, lambda: fake)) as host:
        assert host.get(f"/ui/trajectories/{tid}/video.mp4").status_code == 401
        ui_login(host, ALICE)
        assert f'href="/ui/trajectories/{tid}/video.mp4"' in host.get(f"/ui/trajectories/{tid}").text
        fetch(host, f"/ui/trajectories/{tid}/video.mp4")
        ui_login(host, BOB)  # not his episode: as if it did not exist
        assert host.get(f"/ui/trajectories/{tid}/video.mp4").status_code == 404
    gateway = create_gateway(
        GW_TOKEN, [HostEntry(name="h1", url=url, token=HOST_TOKEN)], clients=load_clients(clients, GW_TOKEN)
    )
    with TestClient(gateway) as gw:
        ui_login(gw, ALICE)  # the gateway's alice is not the host's (recorded directly): not hers there
        assert gw.get(f"/ui/trajectories/h1.{tid}/video.mp4").status_code == 404
        ui_login(gw, GW_TOKEN)  # the operator sees every episode
        assert f'href="/ui/trajectories/h1.{tid}/video.mp4"' in gw.get(f"/ui/trajectories/h1.{tid}").text
        fetch(gw, f"/ui/trajectories/h1.{tid}/video.mp4")
        assert gw.get("/ui/trajectories/h1.t-nope/video.mp4").status_code == 404
    assert set(Path(tempfile.gettempdir()).glob("osfleet-*.mp4")) == temporaries  # each removed once sent
