"""The per-host asset store: the files OSWorld-format tasks would download, kept offline.

OSWorld tasks fetch their inputs (``download`` set-up steps) and expected files (``cloud_file`` getters)
from the web. A replica has no network and a host must not depend on a third party at run time, so each
host keeps those files itself: ``$OSFLEET_HOME/assets/blobs/<sha256>`` holds the bytes once per content,
``$OSFLEET_HOME/assets/index.json`` maps each URL to a sha256. A URL that is not in the store is a task
error naming the URL (422 through the API), never a network call.

A task bundle carries its own assets: a folder with task JSON files and ``assets/manifest.json``
(``{"files": [{"url": ..., "file": "name-in-assets/", "sha256": optional}]}``); ``add_bundle`` copies
them into the store, checking each sha256 that is given.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from osfleet.config import Settings
from osfleet.tasks.model import TaskError

INDEX_NAME = "index.json"
BUNDLE_MANIFEST = Path("assets") / "manifest.json"
_CHUNK = 1 << 20


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
            tmp = blob.with_name(f".{digest}.part")
            shutil.copyfile(file, tmp)
            os.replace(tmp, blob)
        index = self.index()
        if index.get(url) != digest:
            index[url] = digest
            _atomic_write(self.index_path, json.dumps(index, indent=1, sort_keys=True) + "\n")
        return Asset(url=url, sha256=digest, size=blob.stat().st_size)

    def resolve(self, url: str) -> Asset:
        """The stored asset for ``url``, or ``MissingAssetError`` naming it."""
        digest = self.index().get(url)
        if digest is None or not self.blob(digest).is_file():
            raise MissingAssetError(url)
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
