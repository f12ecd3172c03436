"""The per-host asset store: the files OSWorld-format tasks would download, kept offline.

OSWorld tasks fetch their inputs (``download`` set-up steps) and expected files (``cloud_file`` getters)
from the web. A replica has no network and a host must not depend on a third party at run time, so each
host keeps those files itself: ``$OSFLEET_HOME/assets/blobs/<sha256>`` holds the bytes once per content,
``$OSFLEET_HOME/assets/index.json`` maps each URL to a sha256. A URL that is not in the store is a task
error naming the URL (422 through the API), never a network call.

A task bundle carries its own assets: a folder with task JSON files and ``assets/manifest.json``
(``{"files": [{"url": ..., "file": "name-in-assets/", "sha256": optional}]}``); ``add_bundle`` copies
them into the store, checking each sha256 that is given.

Where there is internet, ``fetch`` fills the store ahead of time (``osfleet tasks assets fetch DIR``): each
download streams into ``.partial/`` beside the blobs, hashed as it arrives, and is renamed into place only
when complete, so an interrupted or failed download leaves nothing half-written in the store. Index updates
hold a lock, so two fetches (or a fetch and an import) never lose each other's entries.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import http.client
import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from osfleet.config import Settings
from osfleet.tasks.errors import TaskError

INDEX_NAME = "index.json"
BUNDLE_MANIFEST = Path("assets") / "manifest.json"
PARTIAL = ".partial"
_CHUNK = 1 << 20
FETCH_RETRIES = 3
FETCH_TIMEOUT_SECONDS = 60.0  # without a byte arriving
PROGRESS_EVERY_SECONDS = 2.0
USER_AGENT = "osfleet-assets/1"


SHIPPED_SUITES = Path(__file__).resolve().parent / "suites"  # the bundles shipped in osfleet's package


@functools.cache
def shipped_assets() -> dict[str, Path]:
    """URL -> file of every bundle shipped with osfleet (read once: they are part of the installed package)."""
    found: dict[str, Path] = {}
    for manifest in sorted(SHIPPED_SUITES.glob(f"*/{BUNDLE_MANIFEST}")):
        try:
            files = json.loads(manifest.read_text()).get("files", [])
        except (OSError, ValueError, AttributeError):
            continue
        for entry in files if isinstance(files, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("url"), str) and isinstance(entry.get("file"), str):
                path = (manifest.parent / entry["file"]).resolve()
                if path.is_relative_to(manifest.parent.resolve()) and path.is_file():
                    found[entry["url"]] = path
    return found


class MissingAssetError(TaskError):
    """A task names a URL this host's asset store does not hold (nothing is downloaded at run time)."""

    def __init__(self, url: str) -> None:
        super().__init__(f"asset not in this host's store: {url} (add it with 'osfleet tasks assets add URL FILE')")
        self.url = url


class AssetError(TaskError):
    """An asset file or bundle manifest cannot be used as given."""


@dataclass(frozen=True)
class Asset:
    url: str
    sha256: str
    size: int


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _atomic_write(path: Path, text: str) -> None:
    """Write then rename, so a reader (a host agent resolving a task) never sees half an index."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class AssetStore:
    """URL -> sha256 index over content-addressed blobs in one folder."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> AssetStore:
        return cls((settings or Settings.from_env()).home / "assets")

    @property
    def index_path(self) -> Path:
        return self.root / INDEX_NAME

    def blob(self, sha256: str) -> Path:
        return self.root / "blobs" / sha256

    def index(self) -> dict[str, str]:
        """URL -> sha256; an absent store is an empty one."""
        try:
            data = json.loads(self.index_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise AssetError(f"asset index {self.index_path} is unreadable: {exc}") from None
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise AssetError(f"asset index {self.index_path} is not a URL -> sha256 map")
        return data

    def urls(self) -> list[str]:
        return sorted(self.index())

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The index's writers, one at a time (readers see whole files anyway: writes are renames)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _point(self, url: str, digest: str) -> None:
        with self._locked():
            index = self.index()
            if index.get(url) != digest:
                index[url] = digest
                _atomic_write(self.index_path, json.dumps(index, indent=1, sort_keys=True) + "\n")

    def held(self, url: str) -> bool:
        digest = self.index().get(url)
        return digest is not None and self.blob(digest).is_file()

    def add(self, url: str, file: Path, sha256: str | None = None) -> Asset:
        """Store ``file`` for ``url`` (its bytes once per content); re-adding a URL points it at the new file."""
        if not url.strip():
            raise AssetError("an asset needs a URL")
        if not file.is_file():
            raise AssetError(f"no such file: {file}")
        digest = sha256_of(file)
        if sha256 is not None and sha256.lower() != digest:
            raise AssetError(f"{file} has sha256 {digest}, the manifest says {sha256} (for {url})")
        blob = self.blob(digest)
        if not blob.exists():
            blob.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=blob.parent, prefix=f".{digest}.", suffix=".part")  # one per writer
            os.close(fd)
            try:
                shutil.copyfile(file, tmp)
                os.replace(tmp, blob)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        self._point(url, digest)
        return Asset(url=url, sha256=digest, size=blob.stat().st_size)

    def adopt(self, url: str, part: Path, digest: str) -> Asset:
        """Move a finished download (under ``.partial/``, hashed as it arrived) into the store for ``url``."""
        blob = self.blob(digest)
        blob.parent.mkdir(parents=True, exist_ok=True)
        if blob.is_file():
            part.unlink()
        else:
            os.replace(part, blob)
        self._point(url, digest)
        return Asset(url=url, sha256=digest, size=blob.stat().st_size)

    def partial_dir(self) -> Path:
        """Where downloads are written until complete; what a killed fetch left there is removed first."""
        folder = self.root / PARTIAL
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def resolve(self, url: str) -> Asset:
        """The stored asset for ``url``, or ``MissingAssetError`` naming it.

        A file of a bundle shipped with osfleet is taken into the store the first time a task names it, so a
        client's copy of a shipped suite task (OSWorld's harness, the parity check) sets up on any host agent
        without a ``tasks assets add-bundle`` there first."""
        digest = self.index().get(url)
        if digest is None or not self.blob(digest).is_file():
            shipped = shipped_assets().get(url)
            if shipped is None:
                raise MissingAssetError(url)
            return self.add(url, shipped)
        return Asset(url=url, sha256=digest, size=self.blob(digest).stat().st_size)

    def path(self, url: str) -> Path:
        return self.blob(self.resolve(url).sha256)

    def add_bundle(self, bundle: Path) -> list[Asset]:
        """Copy a task bundle's own assets (``assets/manifest.json``) into the store; none: nothing to do."""
        manifest = bundle / BUNDLE_MANIFEST
        if not manifest.exists():
            return []
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError) as exc:
            raise AssetError(f"bundle manifest {manifest} is unreadable: {exc}") from None
        entries = data.get("files") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            raise AssetError(f"bundle manifest {manifest} needs a list 'files' of {{url, file, sha256?}}")
        added = []
        for i, entry in enumerate(entries):
            if not (
                isinstance(entry, dict) and isinstance(entry.get("url"), str) and isinstance(entry.get("file"), str)
            ):
                raise AssetError(f"bundle manifest {manifest}: files[{i}] needs 'url' and 'file' strings")
            file = (manifest.parent / entry["file"]).resolve()
            if manifest.parent.resolve() not in file.parents:
                raise AssetError(f"bundle manifest {manifest}: files[{i}] points outside the bundle's assets/")
            sha = entry.get("sha256")
            added.append(self.add(entry["url"], file, sha if isinstance(sha, str) else None))
        return added


class DownloadError(AssetError):
    """One URL could not be downloaded (after its retries); ``permanent``: retrying cannot help (4xx)."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass
class FetchReport:
    fetched: list[Asset] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)  # URL -> why

    @property
    def summary(self) -> str:
        got = sum(a.size for a in self.fetched)
        return (
            f"{len(self.fetched)} downloaded ({got / 2**20:.1f} MiB), {len(self.held)} already held, "
            f"{len(self.missing)} missing"
        )

    def as_json(self) -> dict[str, object]:
        return {
            "fetched": [{"url": a.url, "sha256": a.sha256, "size": a.size} for a in self.fetched],
            "held": self.held,
            "missing": self.missing,
            "summary": self.summary,
        }


Say = Callable[[str], None]


def _download(url: str, part: Path, timeout: float, say: Say, label: str) -> str:
    """Stream ``url`` into ``part`` and return its sha256; progress at most every few seconds."""
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp, part.open("wb") as out:
            total = int(resp.headers.get("Content-Length") or 0)
            done, shown = 0, time.monotonic()
            while chunk := resp.read(_CHUNK):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if time.monotonic() - shown >= PROGRESS_EVERY_SECONDS:
                    shown = time.monotonic()
                    of = f" of {total / 2**20:.1f}" if total else ""
                    say(f"{label} {done / 2**20:.1f}{of} MiB")
            if total and done != total:
                raise DownloadError(f"the connection closed after {done} of {total} bytes")
    except urllib.error.HTTPError as exc:
        raise DownloadError(f"HTTP {exc.code} {exc.reason}", permanent=400 <= exc.code < 500) from None
    except (TimeoutError, urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise DownloadError(f"{type(reason).__name__}: {reason}".rstrip(": ")) from None
    return digest.hexdigest()


def fetch(
    store: AssetStore,
    urls: list[str],
    say: Say = lambda _: None,
    retries: int = FETCH_RETRIES,
    timeout: float = FETCH_TIMEOUT_SECONDS,
) -> FetchReport:
    """Download every URL the store does not hold yet, each retried ``retries`` times (not on a 4xx answer).

    An interrupt (Ctrl-C, SIGTERM) removes the download under way and goes up; what was complete stays."""
    report = FetchReport()
    partial = store.partial_dir()
    for stale in partial.glob("*.part"):  # a fetch that was killed (SIGKILL) could not remove its own
        pid = stale.name.split("-")[0]
        if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
            stale.unlink(missing_ok=True)
    for n, url in enumerate(urls, 1):
        label = f"[{n}/{len(urls)}]"
        if store.held(url):
            report.held.append(url)
            continue
        part = partial / f"{os.getpid()}-{n}.part"
        try:
            for attempt in range(1, retries + 2):
                say(f"{label} {url}" + (f" (try {attempt})" if attempt > 1 else ""))
                try:
                    digest = _download(url, part, timeout, say, label)
                except DownloadError as exc:
                    part.unlink(missing_ok=True)
                    if exc.permanent or attempt > retries:
                        report.missing[url] = str(exc)
                        say(f"{label} missing: {exc}")
                        break
                    time.sleep(min(0.5 * 2 ** (attempt - 1), 8.0))
                    continue
                asset = store.adopt(url, part, digest)
                report.fetched.append(asset)
                say(f"{label} ok {asset.sha256[:12]} {asset.size} bytes")
                break
        finally:
            part.unlink(missing_ok=True)
    return report
