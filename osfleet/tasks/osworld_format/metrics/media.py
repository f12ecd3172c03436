"""Metrics on audio, video and VLC: media similarity, MP3 tags, VLC's status and its ``vlcrc`` settings.

- ``compare_videos``: the first ``max_frames_to_check`` (100) frames of the two videos (OpenCV) have
  perceptual hashes within ``threshold`` (5) of each other, but for at most ``threshold`` of them, and the
  videos end together. As in OSWorld, two files OpenCV cannot read at all end together: they score 1.
- ``compare_audios``: librosa's MFCCs of the two recordings (22 050 Hz, mono), each coefficient scaled to
  its largest magnitude, aligned by fast DTW on cosine distance; the score is ``exp(-distance / path
  length)``. Two files that cannot be decoded (or are empty) score 1, as in OSWorld; one alone scores 0.
- ``check_mp3_meta``: each ID3 tag named in the rules (``title``, ``artist``...; several values joined with
  commas, a missing one as ``""``) matches its rule (``common.match_rule``).
- ``is_vlc_playing``: VLC's HTTP status (XML) says ``playing`` and its meta information names
  ``rules.file_name`` (the file, or a path ending with it) or ``rules.url`` (contained, or the URL's file
  name, or the same host and a path containing the URL's).
- ``is_vlc_fullscreen``: the window's size equals the screen's.
- ``vlcrc`` settings, read as OSWorld reads them (any line containing ``<name>=``, commented or not; the
  last wins; VLC's default when none): ``is_vlc_recordings_folder`` (``input-record-path``; the first
  non-comment line decides), ``check_qt_bgcone``, ``check_qt_max_volume``, ``check_qt_minimal_view``,
  ``check_qt_slider_colours`` (``type: match`` the rule's string, or ``blackish``: every colour's
  channels below 100), ``check_global_key_play_pause`` (set to anything counts as 1),
  ``check_one_instance_when_started_from_file``, ``check_play_and_exit`` (``play-and-exit``, default 0; OSWorld's
  main branch).
"""

from __future__ import annotations

import os
import warnings
from typing import Any
from urllib.parse import urlparse

from osfleet.tasks.osworld_format.metrics.common import (
    CannotScore,
    Metric,
    Score,
    file_path,
    match_rule,
    read_bytes,
    scored,
    short,
)


def _open_video(value: Any) -> Any:
    import cv2

    return cv2.VideoCapture(str(file_path(value)))


@scored("max_frames_to_check", "threshold")
def compare_videos(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    import cv2
    import imagehash
    from PIL import Image

    frames, threshold = options.get("max_frames_to_check", 100), options.get("threshold", 5)
    a, b = _open_video(result), _open_video(expected)
    try:
        checked = mismatched = 0
        while checked < frames:
            ok_a, frame_a = a.read()
            ok_b, frame_b = b.read()
            if not ok_a or not ok_b:
                same_end = ok_a == ok_b
                return float(
                    same_end
                ), f"{checked} frames compared; the videos {'end' if same_end else 'do not end'} together"
            hash_a = imagehash.phash(Image.fromarray(cv2.cvtColor(frame_a, cv2.COLOR_BGR2RGB)))
            hash_b = imagehash.phash(Image.fromarray(cv2.cvtColor(frame_b, cv2.COLOR_BGR2RGB)))
            checked += 1
            if hash_a - hash_b > threshold:
                mismatched += 1
                if mismatched > threshold:
                    return 0.0, f"more than {threshold} of the first {checked} frames differ"
    finally:
        a.release()
        b.release()
    return 1.0, f"the first {checked} frames are the same"


def _audio(value: Any) -> Any:
    """The decoded samples at librosa's default rate, or None when there are none (unreadable, empty)."""
    import librosa

    try:
        samples, rate = librosa.load(str(file_path(value)))
    except Exception:  # noqa: BLE001  (OSWorld treats any failure to decode as "empty or corrupt")
        return None
    return None if samples.shape[0] == 0 else (samples, rate)


@scored()
def compare_audios(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    # librosa and its decoders warn freely (deprecated modules, short signals): a warning is never a score,
    # even where warnings are errors (the test run).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _compare_audios(result, expected)


def _compare_audios(result: Any, expected: Any) -> Score:
    import librosa
    import numpy as np
    from fastdtw import fastdtw
    from scipy.spatial.distance import cosine

    if not result or not expected:
        return 0.0, "no recording"
    a, b = _audio(result), _audio(expected)
    if a is None and b is None:
        return 1.0, "neither recording can be decoded (OSWorld counts them the same)"
    if a is None or b is None:
        return 0.0, f"the {'result' if a is None else 'expected'} recording cannot be decoded"
    try:
        mfcc_a = librosa.feature.mfcc(y=a[0], sr=a[1])
        mfcc_b = librosa.feature.mfcc(y=b[0], sr=b[1])
    except Exception as exc:  # noqa: BLE001  (OSWorld scores 0 when the features cannot be computed)
        return 0.0, f"no MFCC features: {type(exc).__name__}"
    mfcc_a, mfcc_b = librosa.util.normalize(mfcc_a, axis=1), librosa.util.normalize(mfcc_b, axis=1)
    distance, path = fastdtw(mfcc_a.T, mfcc_b.T, dist=cosine)
    normalised = distance / len(path) if len(path) else np.inf
    similarity = float(np.exp(-normalised))
    return similarity, f"audio similarity {similarity:.4f} (DTW distance {distance:.3f} over {len(path)} steps)"


@scored()
def check_mp3_meta(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    from mutagen.easyid3 import EasyID3

    if result is None:
        return 0.0, "no file"
    tags = EasyID3(str(file_path(result)))
    met = True
    for name, rule in expected.items():
        value = tags.get(name, "")
        if isinstance(value, list):
            value = ",".join(value)
        met = met and match_rule(value, rule)
        if not met:
            return 0.0, f"tag {name} = {short(value)} does not match {short(rule)}"
    return 1.0, "every tag as expected"


def _text(value: Any) -> str:
    """A file's text as OSWorld's VLC metrics read it: bytes decoded as UTF-8, newlines left as they are."""
    return read_bytes(value).decode("utf-8")


_FILE_INFO = ("filename", "title", "uri", "location", "name")
_URL_INFO = ("url", "URI", "location", "title", "filename")
_STREAM_INFO = ("Codec", "Type", "Language")


def _first_info(tree: Any, paths: list[str]) -> str | None:
    for path in paths:
        element = tree.find(path)
        if element is not None and element.text:
            return str(element.text)
    return None


def _playing_file(info: str, name: Any) -> bool:
    return os.path.basename(info) == name or info.endswith(name)


def _playing_url(info: str, url: Any) -> bool:
    if url in info or info.endswith(url):
        return True
    try:
        wanted = urlparse(url)
        if info == os.path.basename(wanted.path):
            return True
        if "://" in info:
            got = urlparse(info)
            return wanted.netloc == got.netloc and wanted.path in got.path
    except Exception:  # noqa: BLE001  (OSWorld ignores a URL it cannot parse)
        return False
    return False


@scored()
def is_vlc_playing(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    from xml.etree import ElementTree

    tree = ElementTree.fromstring(_text(result))
    state = tree.find("state").text  # type: ignore[union-attr]  # no <state>: cannot score, as in OSWorld
    if state != "playing":
        return 0.0, f"VLC is {short(state)}"
    meta = 'information/category[@name="meta"]/info[@name="{}"]'
    if expected["type"] == "file_name":
        info = _first_info(tree, [meta.format(n) for n in _FILE_INFO])
        if info is None:
            return 0.0, "VLC's status names no file"
        ok = _playing_file(info, expected["file_name"])
    elif expected["type"] == "url":
        stream = 'information/category[@name="Stream 0"]/info[@name="{}"]'
        info = _first_info(tree, [meta.format(n) for n in _URL_INFO] + [stream.format(n) for n in _STREAM_INFO])
        if info is None:
            return 0.0, "VLC's status names no URL"
        ok = _playing_url(info, expected["url"])
    else:
        return 0.0, f"unknown rule type {short(expected['type'])}"
    return float(ok), f"VLC plays {short(info)}"


@scored()
def is_vlc_fullscreen(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    if result is None or expected is None:
        return 0.0, "no window or no screen size"
    ok = result["width"] == expected["width"] and result["height"] == expected["height"]
    return float(ok), f"window {short(expected)}, screen {short(result)}"


@scored()
def is_vlc_recordings_folder(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    config = _text(result)
    want = expected["recording_file_path"]
    for line in config.split("\n"):
        if line.startswith("#") or not line.strip():
            continue
        if "input-record-path" in line:
            folder = line.split("=")[-1].strip()
            return float(folder == want), f"recordings go to {short(folder)}"
    return 0.0, "no recording folder set"


def _setting(config: str, marker: str, default: str) -> str:
    value = default
    for line in config.split("\n"):
        if marker in line:
            value = line.split("=")[-1].strip()
    return value


def _wanted(expected: Any, key: str) -> Any:
    want = expected[key]
    return str(want) if isinstance(want, int) else want


def _vlcrc_check(key: str, marker: str, default: str) -> Metric:
    @scored()
    def check(result: Any, expected: Any, options: dict[str, Any]) -> Score:
        config = _text(result)
        want = _wanted(expected, key)
        value = _setting(config, marker, default)
        return float(value == want), f"{marker.rstrip('=')} is {short(value)}, expected {short(want)}"

    return check


check_qt_bgcone = _vlcrc_check("expected_qt_bgcone", "qt-bgcone=", "1")
check_qt_max_volume = _vlcrc_check("expected_qt_max_volume", "qt-max-volume=", "125")
check_qt_minimal_view = _vlcrc_check("expected_qt_minimal_view", "qt-minimal-view=", "0")
check_one_instance_when_started_from_file = _vlcrc_check(
    "expected_one_instance_when_started_from_file", "one-instance-when-started-from-file=", "1"
)
check_play_and_exit = _vlcrc_check("expected_play_and_exit", "play-and-exit=", "0")
SLIDER_COLOURS = "153;210;153;20;210;20;255;199;15;245;39;29"  # VLC's default


@scored()
def check_qt_slider_colours(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    colours = _setting(_text(result), "qt-slider-colours", SLIDER_COLOURS)
    if expected["type"] == "match":
        want = expected["expected_qt_slider_colours"]
        return float(colours == want), f"slider colours {short(colours)}, expected {short(want)}"
    if expected["type"] == "blackish":
        try:
            values = [int(x) for x in colours.split(";")]
        except ValueError:
            return 0.0, f"slider colours {short(colours)} are not numbers"
        dark = all(v < 100 for rgb in zip(values[0::3], values[1::3], values[2::3], strict=False) for v in rgb)
        return float(dark), f"slider colours {short(colours)} {'are' if dark else 'are not'} all blackish"
    raise CannotScore(f"check_qt_slider_colours has no type {short(expected['type'])} (match, blackish)")


@scored()
def check_global_key_play_pause(result: Any, expected: Any, options: dict[str, Any]) -> Score:
    config = _text(result)
    want = _wanted(expected, "expected_global_key_play_pause")
    value = "0"
    for line in config.split("\n"):
        if "global-key-play-pause=" in line:
            value = "0" if line.split("=")[-1].strip() == "" else "1"
    return float(value == want), f"global play/pause key set: {value}, expected {short(want)}"


METRICS: dict[str, Metric] = {
    "compare_videos": compare_videos,
    "compare_audios": compare_audios,
    "check_mp3_meta": check_mp3_meta,
    "is_vlc_playing": is_vlc_playing,
    "is_vlc_fullscreen": is_vlc_fullscreen,
    "is_vlc_recordings_folder": is_vlc_recordings_folder,
    "check_qt_bgcone": check_qt_bgcone,
    "check_qt_max_volume": check_qt_max_volume,
    "check_qt_minimal_view": check_qt_minimal_view,
    "check_qt_slider_colours": check_qt_slider_colours,
    "check_global_key_play_pause": check_global_key_play_pause,
    "check_one_instance_when_started_from_file": check_one_instance_when_started_from_file,
    "check_play_and_exit": check_play_and_exit,
}
NEEDS: dict[str, tuple[str, ...]] = {
    "compare_videos": ("cv2", "imagehash"),
    "compare_audios": ("librosa", "fastdtw", "scipy"),
    "check_mp3_meta": ("mutagen",),
}
