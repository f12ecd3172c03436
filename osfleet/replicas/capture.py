"""A running replica's screen for observations, for as little host CPU as this host allows.

Capture: QEMU's ``screendump`` (QMP) writes the framebuffer as a PPM into a file on tmpfs, about half the time of
libvirt's screenshot stream (measured in the notes: 28 ms vs 61 ms) because no stream is set up and nothing passes
through libvirtd. Where no such directory can be made (no tmpfs configured, QEMU cannot write there), libvirt's
stream is used, as before, and every observation is encoded whole.

Only what changed: the last frame of each screen is kept (``SCREENS_KEPT_BYTES`` of them at most, the least recently
used forgotten first), and each new dump is compared with it by MCU row (16 pixel rows, the unit a JPEG is coded
in). An observation then encodes only the rows that changed (``osfleet.vm.jpeg_bands``: byte for byte the JPEG a
whole encode gives) and an unchanged screen's encoding is served again. Every observation takes a fresh dump, so
nothing older than the request is ever served: what is reused is only the work of encoding identical pixels.

No copies on the way: the dump is mapped, not read; it is compared with the kept frame a row at a time (``memcmp``)
and only the rows that changed are copied into it; the encoder reads the kept frame in place. A screen's dump file
is kept between captures (QEMU truncates it as it opens it, so no file is made and removed per capture) and removed
when the screen is forgotten or the host closes.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import itertools
import logging
import mmap
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from osfleet.errors import VirtError
from osfleet.measure.timing import stage
from osfleet.protocol.models import DEFAULT_QUALITY, ImageFormat
from osfleet.vm import screen
from osfleet.vm.jpeg_bands import MCU_HEIGHT, BandedJpeg, JpegLayoutError, mcu_rows
from osfleet.vm.virt import Virt

log = logging.getLogger(__name__)

SCREENS_KEPT_BYTES = 256 * 2**20  # kept frames and their dump files, all screens: ~20 screens at 1920x1080
SCREEN_IDLE_SECONDS = 300.0  # a screen not captured this long is forgotten (its replica was reset or retired)
ENCODINGS_PER_SCREEN = 4  # (format, quality) pairs kept per screen
MAX_SIDE = 16384  # a dump that claims a larger screen is not read
_PPM_HEADER = re.compile(rb"P6\s(\d{1,5})\s(\d{1,5})\s255\s")
_SERIALS = itertools.count()
_libc = ctypes.CDLL(None)
_libc.memcmp.restype = ctypes.c_int
_libc.memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class BadDumpError(VirtError):
    """QEMU's screendump file is not a whole PPM frame."""


@dataclass
class _Encoding:
    version: int
    data: bytes
    bands: BandedJpeg | None = None


@dataclass
class _Screen:
    """The last frame of one domain's screen and what was encoded of it; used under ``lock``."""

    dump: Path
    serial: int = field(default_factory=lambda: next(_SERIALS))  # tells a screen made anew from a forgotten one
    lock: threading.Lock = field(default_factory=threading.Lock)
    width: int = 0
    height: int = 0
    pixels: bytearray = field(default_factory=bytearray)
    version: int = 0  # counts the frames that differed from the one before
    row_versions: list[int] = field(default_factory=list)  # per MCU row: the version it last changed in
    encodings: OrderedDict[tuple[str, int], _Encoding] = field(default_factory=OrderedDict)
    used: float = 0.0

    @property
    def kept_bytes(self) -> int:
        return 2 * len(self.pixels)  # the frame and its dump file

    def take(self, frame: memoryview, width: int, height: int) -> None:
        """Take ``frame`` (packed RGB rows, writable) as the screen now: the MCU rows that differ from the kept
        frame are copied into it and get a new version."""
        if (width, height) != (self.width, self.height) or not self.pixels:
            self.width, self.height = width, height
            self.pixels = bytearray(frame)
            self.version += 1
            self.row_versions = [self.version] * mcu_rows(height)
            self.encodings.clear()
            return
        size, row_bytes = len(self.pixels), width * 3 * MCU_HEIGHT
        new = (ctypes.c_char * size).from_buffer(frame)
        kept = (ctypes.c_char * size).from_buffer(self.pixels)
        try:
            source, target = ctypes.addressof(new), ctypes.addressof(kept)
            changed = []
            for row in range(len(self.row_versions)):
                start = row * row_bytes
                length = min(row_bytes, size - start)
                if _libc.memcmp(source + start, target + start, length):
                    ctypes.memmove(target + start, source + start, length)
                    changed.append(row)
        finally:
            del new, kept  # the buffers' exports end here
        if changed:
            self.version += 1
            for row in changed:
                self.row_versions[row] = self.version

    def encoded(self, fmt: ImageFormat, quality: int) -> bytes:
        """The kept frame in ``fmt``: the last encoding again when nothing changed since it; for JPEG, only the
        MCU rows that changed are encoded anew."""
        key = (fmt, quality)
        last = self.encodings.pop(key, None)
        if last is not None and last.version == self.version:
            self.encodings[key] = last
            return last.data
        bands: BandedJpeg | None = None
        if fmt == "jpeg":
            bands = last.bands if last is not None and last.bands is not None else None
            changed = None if bands is None or last is None else self._changed_since(last.version)
            bands = bands or BandedJpeg(self.width, self.height, quality)
            try:
                data = bands.encode(memoryview(self.pixels), changed)
            except JpegLayoutError as exc:  # an encoder that lays JPEGs out otherwise: whole encodes, always
                log.warning("JPEG rows cannot be reused (%s); encoding whole screens", exc)
                bands, data = None, screen.encode(self.image(), fmt, quality)
        else:
            data = screen.encode(self.image(), fmt, quality)
        self.encodings[key] = _Encoding(self.version, data, bands)
        while len(self.encodings) > ENCODINGS_PER_SCREEN:
            self.encodings.popitem(last=False)
        return data

    def _changed_since(self, version: int) -> list[int]:
        return [row for row, v in enumerate(self.row_versions) if v > version]

    def image(self) -> Image.Image:
        """The kept frame as an image of its own (a copy)."""
        return Image.frombytes("RGB", (self.width, self.height), bytes(self.pixels))


class Frame:
    """A screen as one observation captured it: encode it outside the replica's lock. A capture of the same
    screen in between (another caller's) makes it encode that newer frame, never an older one."""

    def __init__(self, kept: _Screen | None = None, image: Image.Image | None = None) -> None:
        self._kept, self._image = kept, image
        self._version = kept.version if kept is not None else 0  # taken under the screen's lock

    @property
    def fingerprint(self) -> Hashable:
        """Equal for two frames of one screen exactly when their pixels are: the kept screen's version (it
        counts frames that differed from the one before), or a digest of a frame from libvirt's stream."""
        if self._kept is None:
            assert self._image is not None
            return hashlib.blake2b(self._image.tobytes(), digest_size=16).digest()
        return (self._kept.serial, self._version)

    def encode(self, fmt: ImageFormat, quality: int | None = None) -> bytes:
        """The screen in ``fmt`` (``quality`` 1..100 for JPEG and WebP; default 85), timed as stage ``encode``."""
        q = DEFAULT_QUALITY if quality is None else quality
        if not 1 <= q <= 100:
            raise ValueError(f"quality {q} is not between 1 and 100")
        if self._kept is None:
            assert self._image is not None
            return screen.encode(self._image, fmt, q)
        with stage("encode"), self._kept.lock:
            return self._kept.encoded(fmt, q)

    def image(self) -> Image.Image:
        if self._kept is None:
            assert self._image is not None
            return self._image
        with self._kept.lock:
            return self._kept.image()


class ScreenCapture:
    """Screens of this host's domains; thread-safe. ``directory`` is where QEMU may write screendumps
    (made on first use, owned by QEMU's user, mode 0700), or None for libvirt's stream only."""

    def __init__(self, virt: Virt, directory: Path | None) -> None:
        self.virt = virt
        self.directory = directory
        self._usable: bool | None = None if directory is not None else False
        self._lock = threading.Lock()
        self._screens: OrderedDict[str, _Screen] = OrderedDict()

    @property
    def method(self) -> str:
        """``screendump`` or ``libvirt``: how the next capture is taken (decided on first use)."""
        return "screendump" if self._dir() is not None else "libvirt"

    def grab(self, domain: str) -> Image.Image:
        """The domain's screen now, as an RGB image of its own (timed as stage ``capture``)."""
        return self.take(domain).image()

    def take(self, domain: str) -> Frame:
        """The domain's screen now (timed as stage ``capture``), to encode with ``Frame.encode``."""
        with stage("capture"):
            directory = self._dir()
            if directory is None:
                return Frame(image=self.virt.screenshot(domain))
            kept = self._screen(domain, directory)
            with kept.lock:
                try:
                    self.virt.qmp(domain, "screendump", {"filename": str(kept.dump)})
                    _read_dump(kept)
                    frame = Frame(kept)
                except (VirtError, OSError) as exc:
                    if not self.virt.is_running(domain):  # the replica is gone: libvirt's stream names why
                        return Frame(image=self.virt.screenshot(domain))
                    log.info("screendump of %s into %s failed (%s); using libvirt's screenshot", domain, directory, exc)
                    self._usable = False
                    return Frame(image=self.virt.screenshot(domain))
            self._evict(kept)
            return frame

    def forget(self, domain: str) -> None:
        """Drop the domain's kept frame and its dump file (its domain is gone)."""
        with self._lock:
            kept = self._screens.pop(domain, None)
        if kept is not None:
            with kept.lock:
                _drop(kept)

    def close(self) -> None:
        """Forget every screen (their dump files go)."""
        with self._lock:
            screens, self._screens = list(self._screens.values()), OrderedDict()
        for kept in screens:
            with kept.lock:
                _drop(kept)

    def _screen(self, domain: str, directory: Path) -> _Screen:
        """The domain's kept screen (made on first use), now the most recently used."""
        with self._lock:
            kept = self._screens.pop(domain, None) or _Screen(dump=directory / f"{domain}.{os.getpid()}.ppm")
            kept.used = time.monotonic()
            self._screens[domain] = kept
            return kept

    def _evict(self, keep: _Screen) -> None:
        """Forget the least recently used screens beyond ``SCREENS_KEPT_BYTES`` and those idle for
        ``SCREEN_IDLE_SECONDS`` (never ``keep``, nor one being captured right now)."""
        now = time.monotonic()
        stale = []
        with self._lock:
            over = sum(s.kept_bytes for s in self._screens.values()) - SCREENS_KEPT_BYTES
            for name, other in list(self._screens.items()):
                if other is keep:
                    continue
                if over <= 0 and now - other.used < SCREEN_IDLE_SECONDS:
                    break  # the rest were used more recently
                if other.lock.acquire(blocking=False):
                    del self._screens[name]
                    over -= other.kept_bytes
                    stale.append(other)
        for other in stale:
            try:
                _drop(other)
            finally:
                other.lock.release()

    def _dir(self) -> Path | None:
        with self._lock:
            if self._usable is None and self.directory is not None:
                try:
                    self.directory.mkdir(parents=True, exist_ok=True)
                    owner = self.virt.qemu_ids()
                    if owner is not None:
                        os.chown(self.directory, *owner)
                    self.directory.chmod(0o700)
                    _remove_orphan_dumps(self.directory)
                    self._usable = True
                except (OSError, VirtError) as exc:
                    log.info("screens through libvirt's stream: %s", exc)
                    self._usable = False
            return self.directory if self._usable else None


def _read_dump(kept: _Screen) -> None:
    """Take the PPM QEMU just wrote to ``kept.dump`` into ``kept`` (the caller holds its lock)."""
    fd = os.open(kept.dump, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size < 16:
            raise BadDumpError(f"screendump {kept.dump} has {size} bytes")
        with mmap.mmap(fd, size, access=mmap.ACCESS_COPY) as mapped:  # private: nothing is written back
            found = _PPM_HEADER.match(mapped, 0, 64)
            if found is None:
                raise BadDumpError(f"screendump {kept.dump} is not a binary PPM")
            width, height = int(found.group(1)), int(found.group(2))
            start, length = found.end(), width * height * 3
            if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE) or start + length > size:
                raise BadDumpError(f"screendump {kept.dump} is not a whole {width}x{height} frame")
            with memoryview(mapped)[start : start + length] as frame:
                kept.take(frame, width, height)
    finally:
        os.close(fd)


def _drop(kept: _Screen) -> None:
    """Remove a forgotten screen's dump file and encodings (the caller holds its lock); its frame stays whole for
    a ``Frame`` taken before, and goes with the last of them."""
    kept.encodings.clear()
    with contextlib.suppress(OSError):
        kept.dump.unlink(missing_ok=True)


def _remove_orphan_dumps(directory: Path) -> None:
    """Dump files of host processes that are gone (``<domain>.<pid>.ppm``): kept screens of an agent that died."""
    for path in directory.glob("*.ppm"):
        pid = path.suffixes[-2].lstrip(".") if len(path.suffixes) >= 2 else ""
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                path.unlink()
