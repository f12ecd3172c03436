"""Compiled code the evaluation jail reads but never writes: numba's cache for librosa (``compare_audios``).

librosa compiles its numba functions on first use, ~28 s of CPU here, and keeps the machine code in a cache
beside its sources. In the jail the virtualenv is read-only and each evaluation's home is a fresh tmpfs, so every
``compare_audios`` would compile again (28 s of a 45 s wall limit). A cache the evaluations could write would be
shared by every tenant's evaluations: one of them could leave machine code there for the next to run. So the host
makes the cache itself, in a process of its own that runs the metric on two recordings it synthesises (nothing
from a guest), into ``$OSFLEET_HOME/jail/numba-<version>``, and the jail binds that folder read-only with
``NUMBA_CACHE_DIR`` pointing at it; an evaluation whose metric uses librosa copies it into its own ``/tmp`` first
(3 MB; numba refuses a cache folder it cannot write). ``scripts/setup`` warms it
(``python -m osfleet.tasks.jail.numba_cache``); a sandbox that finds it cold warms it in the background (evaluations
meanwhile compile for themselves).
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from osfleet.config import Settings

log = logging.getLogger(__name__)

JAIL_PATH = "/numba-cache"
WARM_MARK = ".warm"
WARM_SECONDS = 600
_warming = threading.Lock()


def folder(settings: Settings | None = None) -> Path | None:
    """This numba's cache folder (None when numba is not installed: no metric needs it)."""
    if importlib.util.find_spec("numba") is None:
        return None
    from importlib.metadata import version

    return (settings or Settings.from_env()).home / "jail" / f"numba-{version('numba')}"


def warm(where: Path) -> None:
    """Fill ``where`` (a host process, not the jail), unless it is already warm; serialised by a lock file."""
    where.mkdir(parents=True, exist_ok=True, mode=0o755)
    with open(where / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (where / WARM_MARK).exists():
            return
        env = {**os.environ, "NUMBA_CACHE_DIR": str(where)}
        subprocess.run(
            [sys.executable, "-I", "-m", "osfleet.tasks.jail.numba_cache", "--compile"],
            env=env, check=True, capture_output=True, timeout=WARM_SECONDS,
        )  # fmt: skip
        for root, dirs, files in os.walk(where):  # readable by the jail's user
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o755)
            for name in files:
                os.chmod(os.path.join(root, name), 0o644)
        (where / WARM_MARK).write_text("librosa's numba functions, compiled by the host\n")


def warm_soon(where: Path) -> None:
    """``warm`` in a background thread when the cache is cold (once at a time in this process)."""
    if (where / WARM_MARK).exists() or not _warming.acquire(blocking=False):
        return

    def run() -> None:
        try:
            warm(where)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("evaluation jail: cannot warm numba's cache in %s: %s", where, exc)
        finally:
            _warming.release()

    threading.Thread(target=run, name="osfleet-numba-warm", daemon=True).start()


def _compile() -> None:
    """Run ``compare_audios`` on synthetic recordings: mono at librosa's rate and stereo at 44.1 kHz (to_mono and
    resampling), so the functions real recordings reach are compiled for the types they get."""
    import wave

    import numpy as np  # an optional dependency (the osworld extra), needed only here

    from osfleet.tasks.osworld_format.metrics.media import compare_audios

    with tempfile.TemporaryDirectory(prefix="osfleet-numba-warm-") as tmp:
        files = []
        for name, rate, channels in (("mono.wav", 22050, 1), ("stereo.wav", 44100, 2)):
            path = Path(tmp) / name
            tone = (np.sin(np.arange(rate) * 2 * np.pi * 440 / rate) * 8000).astype(np.int16)
            with wave.open(str(path), "wb") as w:
                w.setnchannels(channels)
                w.setsampwidth(2)
                w.setframerate(rate)
                w.writeframes(np.repeat(tone, channels).tobytes())
            files.append(path)
        compare_audios(files[0], files[1], {})


def main(argv: list[str]) -> int:
    if argv[1:] == ["--compile"]:
        _compile()
        return 0
    where = folder()
    if where is None:
        print("numba is not installed: no cache to warm")
        return 0
    warm(where)
    print(f"numba's cache for the evaluation jail is warm: {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
