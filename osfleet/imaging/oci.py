"""OCI images written by code: layers from folders, the image config, the manifest and an OCI archive.

No daemon and no registry: an image is an OCI image layout (``oci-layout``, ``index.json``, ``blobs/sha256/``)
packed in one tar file, which containerd imports (``ctr images import``) and which skopeo or crane push to any
registry (``skopeo copy oci-archive:F docker://REGISTRY/NAME:TAG``).

Reproducible by construction, so an unchanged input gives the same digests: entries in sorted order, every
timestamp set to ``EPOCH``, owners kept as numbers without names, gzip without a name or time, and no
``created`` date in the config. Hard links stay hard links; device nodes, sockets and the contents of the
folders a runtime mounts over (``/proc``, ``/sys``, ``/dev``, ``/run``, ``/tmp``) are left out.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

EPOCH = 0  # every mtime in a layer; a build date would change every digest
LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_MEDIA = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA = "application/vnd.oci.image.index.v1+json"
# Folders a container runtime mounts over: their contents never belong in a layer (the folders themselves do).
MOUNTED = ("proc", "sys", "dev", "run", "tmp")
CHUNK = 1 << 20


@dataclass(frozen=True)
class Blob:
    """A content-addressed file: its digest (``sha256:...``), size and media type."""

    digest: str
    size: int
    media_type: str

    def descriptor(self, **annotations: str) -> dict[str, Any]:
        d: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if annotations:
            d["annotations"] = dict(sorted(annotations.items()))
        return d


@dataclass(frozen=True)
class Layer:
    """A gzipped tar layer: the blob, and its uncompressed digest (the config's ``diff_id``)."""

    blob: Blob
    diff_id: str


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes and counts what passes into ``inner``."""

    def __init__(self, inner: IO[bytes]) -> None:
        self.inner, self.sha, self.size = inner, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        b = bytes(data)
        self.sha.update(b)
        self.size += len(b)
        self.inner.write(b)
        return len(b)


def _entries(root: Path, only: Iterable[str] | None) -> Iterator[tuple[Path, str]]:
    """(path, name in the layer) in sorted order: parents before children; ``only`` limits the walk to those
    top-level paths (their parent folders included)."""
    wanted = sorted({p.strip("/") for p in only}) if only is not None else None
    if wanted is not None:
        parents = sorted({str(Path(w).parents[i]) for w in wanted for i in range(len(Path(w).parts) - 1)})
        for p in parents:
            yield root / p, p
        starts = [root / w for w in wanted]
    else:
        starts = sorted(root.iterdir(), key=lambda p: p.name)
    for start in starts:
        yield from _walk(root, start)


def _walk(root: Path, path: Path) -> Iterator[tuple[Path, str]]:
    rel = str(path.relative_to(root))
    yield path, rel
    if path.is_dir() and not path.is_symlink():
        if rel in MOUNTED:
            return
        for child in sorted(os.scandir(path), key=lambda e: e.name):
            yield from _walk(root, Path(child.path))


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    if info.type in (tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE):
        return None
    info.mtime = EPOCH
    info.uname = info.gname = ""
    info.pax_headers = {}
    return info


def write_layer(root: Path, blobs: Path, only: Iterable[str] | None = None) -> Layer:
    """Pack the folder ``root`` (or only the paths ``only`` under it) as a layer into ``blobs`` (``blobs/sha256``)."""
    blobs.mkdir(parents=True, exist_ok=True)
    tmp = blobs / f".layer-{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as out:
            gz_hash = _Hashing(out)
            with gzip.GzipFile(filename="", mode="wb", fileobj=gz_hash, mtime=EPOCH, compresslevel=6) as gz:
                tar_hash = _Hashing(gz)  # type: ignore[arg-type]
                with tarfile.open(fileobj=tar_hash, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                    for path, name in _entries(root, only):
                        if stat.S_ISSOCK(path.lstat().st_mode):
                            continue
                        tar.add(str(path), arcname=name, recursive=False, filter=_normalized)
        blob = Blob(f"sha256:{gz_hash.sha.hexdigest()}", gz_hash.size, LAYER_MEDIA)
        tmp.rename(blobs / blob.digest.split(":", 1)[1])
    finally:
        tmp.unlink(missing_ok=True)
    return Layer(blob, f"sha256:{tar_hash.sha.hexdigest()}")


def write_json_blob(blobs: Path, doc: dict[str, Any], media_type: str) -> Blob:
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.sha256(data).hexdigest()
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / digest).write_bytes(data)
    return Blob(f"sha256:{digest}", len(data), media_type)


def image_config(layers: list[Layer], env: dict[str, str], cmd: list[str], labels: dict[str, str]) -> dict[str, Any]:
    """The image's config: linux/amd64, its environment, default command and labels; no creation date."""
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": [f"{k}={v}" for k, v in env.items()],
            "Cmd": cmd,
            "WorkingDir": "/",
            "Labels": dict(sorted(labels.items())),
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
    }


def write_layout(
    layout: Path, layers: list[Layer], config: dict[str, Any], reference: str, annotations: dict[str, str]
) -> Blob:
    """Write the config, manifest, ``index.json`` and ``oci-layout`` into ``layout`` (whose ``blobs/sha256``
    holds the layers); return the manifest, whose digest is the image's."""
    blobs = layout / "blobs" / "sha256"
    cfg = write_json_blob(blobs, config, CONFIG_MEDIA)
    manifest = write_json_blob(
        blobs,
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA,
            "config": cfg.descriptor(),
            "layers": [layer.blob.descriptor() for layer in layers],
            "annotations": dict(sorted(annotations.items())),
        },
        MANIFEST_MEDIA,
    )
    tag = reference.rsplit(":", 1)[1] if ":" in reference.rsplit("/", 1)[-1] else "latest"
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA,
        # containerd names the imported image by io.containerd.image.name; OCI tools (skopeo) by the tag.
        "manifests": [
            manifest.descriptor(**{"io.containerd.image.name": reference, "org.opencontainers.image.ref.name": tag})
        ],
    }
    (layout / "index.json").write_text(json.dumps(index, sort_keys=True, separators=(",", ":")))
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return manifest


def write_archive(layout: Path, out: Path) -> None:
    """Pack the layout as an OCI archive (a plain tar; sorted, timeless), written beside ``out`` and renamed."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            for path, name in _entries(layout, None):
                tar.add(str(path), arcname=name, recursive=False, filter=_normalized)
        tmp.rename(out)
    finally:
        tmp.unlink(missing_ok=True)


def read_reference(archive: Path) -> str:
    """The image reference an OCI archive written here names (``io.containerd.image.name``)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ValueError(f"{archive} has no index.json")
        index = json.load(member)
    return str(index["manifests"][0]["annotations"]["io.containerd.image.name"])
