"""OCI images written by code (``osfleet.imaging.oci``): reproducible layers, a layout any OCI tool reads, an archive
that names its reference. Checked by reading back with tarfile and hashlib, as a registry or containerd would."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tarfile
import time
from pathlib import Path

import pytest

from osfleet.imaging import oci

pytestmark = pytest.mark.unit


def tree(root: Path) -> Path:
    (root / "opt" / "app" / "bin").mkdir(parents=True)
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "status").write_text("never in a layer")
    (root / "etc").mkdir()
    (root / "etc" / "hostname").write_text("x\n")
    tool = root / "opt" / "app" / "bin" / "tool"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o755)
    os.link(tool, root / "opt" / "app" / "bin" / "tool-again")
    (root / "opt" / "app" / "bin" / "link").symlink_to("tool")
    return root


def test_a_layer_is_the_same_bytes_whatever_the_files_times_and_keeps_links(tmp_path: Path) -> None:
    root = tree(tmp_path / "rootfs")
    first = oci.write_layer(root, tmp_path / "blobs1")
    for p in root.rglob("*"):
        os.utime(p, (time.time() + 1000, time.time() + 1000), follow_symlinks=False)
    second = oci.write_layer(root, tmp_path / "blobs2")
    assert first == second  # digests name content only
    blob = tmp_path / "blobs1" / first.blob.digest.removeprefix("sha256:")
    data = blob.read_bytes()
    assert first.blob.size == len(data) and first.blob.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    raw = gzip.decompress(data)
    assert first.diff_id == "sha256:" + hashlib.sha256(raw).hexdigest()
    with tarfile.open(blob) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert "proc" in members and "proc/self" not in members  # a runtime mounts over /proc
    assert list(members) == sorted(members, key=lambda n: list(members).index(n))  # order as written
    assert (
        members["opt/app/bin/tool-again"].islnk() and members["opt/app/bin/tool-again"].linkname == "opt/app/bin/tool"
    )
    assert members["opt/app/bin/link"].issym() and members["opt/app/bin/link"].linkname == "tool"
    assert members["opt/app/bin/tool"].mode & 0o777 == 0o755
    assert {m.mtime for m in members.values()} == {0} and {m.uname for m in members.values()} == {""}


def test_a_layer_of_one_folder_holds_it_and_its_parents_only(tmp_path: Path) -> None:
    root = tree(tmp_path / "rootfs")
    layer = oci.write_layer(root, tmp_path / "blobs", only=["/opt/app"])
    with tarfile.open(tmp_path / "blobs" / layer.blob.digest.removeprefix("sha256:")) as tar:
        names = tar.getnames()
    assert names[:2] == ["opt", "opt/app"] and "etc" not in names and "opt/app/bin/tool" in names


def test_the_archive_is_an_oci_layout_naming_its_reference(tmp_path: Path) -> None:
    root = tree(tmp_path / "rootfs")
    layout = tmp_path / "layout"
    layer = oci.write_layer(root, layout / "blobs" / "sha256")
    config = oci.image_config([layer], {"PATH": "/opt/app/bin"}, ["tool"], {"org.opencontainers.image.title": "t"})
    manifest = oci.write_layout(layout, [layer], config, "localhost/t:1.0-abc", {})
    archive = tmp_path / "t.oci.tar"
    oci.write_archive(layout, archive)
    assert oci.read_reference(archive) == "localhost/t:1.0-abc"
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        assert json.load(tar.extractfile("oci-layout")) == {"imageLayoutVersion": "1.0.0"}  # type: ignore[arg-type]
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        (desc,) = index["manifests"]
        assert desc["digest"] == manifest.digest
        assert desc["annotations"]["org.opencontainers.image.ref.name"] == "1.0-abc"
        body = tar.extractfile(f"blobs/sha256/{manifest.digest.removeprefix('sha256:')}").read()  # type: ignore[union-attr]
    assert "sha256:" + hashlib.sha256(body).hexdigest() == manifest.digest  # every blob named by its content
    doc = json.loads(body)
    assert doc["mediaType"] == oci.MANIFEST_MEDIA and doc["layers"] == [layer.blob.descriptor()]
    assert f"blobs/sha256/{doc['config']['digest'].removeprefix('sha256:')}" in names
    assert config["rootfs"]["diff_ids"] == [layer.diff_id] and "created" not in config
    # The same inputs again: the same archive, byte for byte.
    again = tmp_path / "again.oci.tar"
    oci.write_archive(layout, again)
    assert again.read_bytes() == archive.read_bytes()
