"""The osfleet container image, built by code: what runs the host agent, the gateway and Locust in Kubernetes.

Two layers, no Docker daemon:

1. the base: Debian by ``debootstrap --variant=minbase`` (as the golden images start) plus the packages the
   host agent calls (``qemu-img`` for overlays, QEMU for the accelerator probe, libvirt's client library,
   ``ip``/``nft`` for the opt-in replica network) and Python;
2. osfleet: a virtualenv at ``/opt/osfleet`` with the project's wheel and its dependencies at exactly the
   versions of the environment that builds it (so the image runs what this checkout was tested with),
   installed offline from wheels the build host made (it has the package index; the chroot has none).

Content-addressed like the golden images: the image's tag is a hash of every input (the base's suite, mirror and
packages; the wheel's contents; the pinned dependencies; this builder's version), so an unchanged input is a
cache hit that builds nothing. Layers are written reproducibly (``osfleet.imaging.oci``) and the base is cached
on its own, so a change of osfleet's code rebuilds only the second layer. The result is an OCI archive that
containerd imports and any registry takes (``skopeo copy oci-archive:F docker://REGISTRY/osfleet:TAG``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from shlex import quote as q

from osfleet import __version__
from osfleet.checkout import project_dir
from osfleet.config import Settings
from osfleet.errors import CommandFailedError, ConfigError
from osfleet.imaging import oci
from osfleet.imaging.host import Host
from osfleet.tasks.jail.bubblewrap import JAIL_USER

BUILDER_VERSION = "container-1"
REPOSITORY = "localhost/osfleet"  # never pulled: a node that had to would ask this machine, never the network
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = (
    "python3", "python3-venv", "ca-certificates", "libvirt0", "libvirt-clients", "qemu-utils",
    "qemu-system-x86", "iproute2", "nftables", "procps", "util-linux",
    "bubblewrap", "libseccomp2",  # the evaluation jail (osfleet.tasks.jail), which runs as JAIL_USER
)  # fmt: skip
EXTRAS = ("host", "loadtest", "office", "k8s")  # Locust; the office metrics evaluations import; the gateway's discovery
VENV = "/opt/osfleet"
ENV = {
    "PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONUNBUFFERED": "1",
}
STEPS = 5
BUILD_DISK_BYTES = 3 * 2**30


@dataclass(frozen=True)
class ContainerImage:
    """A built image: its reference (``localhost/osfleet:<version>-<hash>``), archive and manifest digest."""

    reference: str
    archive: Path
    digest: str
    cached: bool


def newest_reference(settings: Settings | None = None) -> str | None:
    """The reference of the newest image ``osfleet image container`` built on this machine, or None: what the
    ``k8s`` stack deploys when ``osfleet:containerImage`` is not set."""
    archives = sorted(images_dir(settings or Settings.from_env()).glob("osfleet-*.oci.tar"),
                      key=lambda p: p.stat().st_mtime)  # fmt: skip
    if not archives:
        return None
    return f"{REPOSITORY}:{archives[-1].name.removeprefix('osfleet-').removesuffix('.oci.tar')}"


def images_dir(settings: Settings) -> Path:
    """Where built container images (OCI archives) and the cached base layer live."""
    return settings.build_dir / "container"


def build(
    out: Path | None = None, settings: Settings | None = None, host: Host | None = None, wheel: Path | None = None
) -> ContainerImage:
    """Build (or find) the image of this osfleet; ``out``: also copy the OCI archive there."""
    s = settings or Settings.from_env()
    h = host or _local_host()
    store = images_dir(s)
    store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="osfleet-container-", dir=store) as tmp:
        work = Path(tmp)
        with h.step(1, STEPS, "the osfleet wheel and its pinned dependencies"):
            ours = wheel or _build_wheel(work / "dist")
            pins = _pins()
        tag = f"{__version__}-{_input_hash(ours, pins)}"
        reference = f"{REPOSITORY}:{tag}"
        archive = store / f"osfleet-{tag}.oci.tar"
        if archive.exists():
            h.say(f"container image {reference} is up to date (cache hit): {archive}")
            image = ContainerImage(reference, archive, _manifest_digest(archive), cached=True)
        else:
            h.require_free(str(store), BUILD_DISK_BYTES, "a container image build")
            image = _build(h, s, work, ours, pins, reference, archive)
    if out is not None and out.resolve() != image.archive.resolve():
        shutil.copyfile(image.archive, out)
        h.say(f"OCI archive written to {out}")
    return image


def _build(
    h: Host, s: Settings, work: Path, ours: Path, pins: list[str], reference: str, archive: Path
) -> ContainerImage:
    started = time.monotonic()
    base_dir = _base(h, s)
    rootfs = base_dir / "rootfs"
    layout = work / "layout"
    blobs = layout / "blobs" / "sha256"
    shutil.copytree(base_dir / "blobs", blobs)
    base_layer = _layer_from_json(base_dir / "layer.json")
    with h.step(4, STEPS, "installing osfleet into /opt/osfleet (offline, from wheels built here)"):
        wheels = work / "wheels"
        _wheels(h, ours, pins, wheels)
        try:
            app_layer = _install(h, rootfs, wheels, ours)
        finally:
            h.run(f"rm -rf {q(str(rootfs / VENV.lstrip('/')))} {q(str(rootfs / 'tmp' / 'osfleet-wheels'))}")
    with h.step(5, STEPS, "writing the OCI image and archive"):
        layers = [base_layer, app_layer]
        shutil.move(str(work / "app-layer"), str(blobs / app_layer.blob.digest.split(":", 1)[1]))
        labels = {
            "org.opencontainers.image.title": "osfleet",
            "org.opencontainers.image.version": __version__,
            "org.opencontainers.image.description": "osfleet host agent, fleet gateway and Locust runtime",
        }
        config = oci.image_config(layers, ENV, ["osfleet", "--help"], labels)
        manifest = oci.write_layout(layout, layers, config, reference, {"org.opencontainers.image.ref.name": reference})
        oci.write_archive(layout, archive)
    h.say(f"built {reference} ({archive.stat().st_size / 2**20:.0f} MiB) in {time.monotonic() - started:.0f} s")
    return ContainerImage(reference, archive, manifest.digest, cached=False)


def _local_host() -> Host:
    from invoke import Context

    return Host(Context())


def _base(h: Host, s: Settings) -> Path:
    """The base layer (debootstrap + packages), built once per input and kept with its rootfs."""
    inputs = [BUILDER_VERSION, SUITE, MIRROR, BASE_PACKAGES, JAIL_USER]
    key = hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:12]
    base = images_dir(s) / f"base-{key}"
    if (base / "layer.json").exists():
        h.say(f"base layer {key} is up to date (cache hit)")
        return base
    if base.exists():
        shutil.rmtree(base)
    h.require_tools(["debootstrap", "chroot"])
    tmp = images_dir(s) / f".base-{key}-{uuid.uuid4().hex[:8]}"
    rootfs = tmp / "rootfs"
    chroot = f"chroot {q(str(rootfs))} env DEBIAN_FRONTEND=noninteractive LC_ALL=C"
    try:
        with h.step(2, STEPS, f"debootstrap {SUITE} and {len(BASE_PACKAGES)} packages (about 3 min)"):
            h.run(f"debootstrap --variant=minbase {SUITE} {q(str(rootfs))} {MIRROR}", what="debootstrap")
            h.write_file(f"{rootfs}/usr/sbin/policy-rc.d", "#!/bin/sh\nexit 101\n", 0o755)
            h.run(f"mount -t proc proc {q(str(rootfs / 'proc'))}")
            try:
                pkgs = " ".join(q(p) for p in BASE_PACKAGES)
                h.run(f"{chroot} apt-get install -y -q --no-install-recommends {pkgs}", what="apt-get install")
                h.run(
                    f"{chroot} useradd --system --user-group --no-create-home --home-dir /nonexistent "
                    f"--shell /usr/sbin/nologin {JAIL_USER}",
                    what="useradd (the evaluation jail's user)",
                )
            finally:
                h.run(f"umount {q(str(rootfs / 'proc'))}")
            h.run(
                f"cd {q(str(rootfs))} && rm -rf usr/share/doc/* usr/share/man/* usr/share/info/* usr/share/locale/*"
                " var/cache/apt/* var/lib/apt/lists/* var/log/* usr/sbin/policy-rc.d var/cache/debconf/*-old"
                " && : > etc/machine-id && rm -f etc/hostname etc/resolv.conf",
                what="trimming the base",
            )
        with h.step(3, STEPS, "packing the base layer"):
            layer = oci.write_layer(rootfs, tmp / "blobs")
            (tmp / "layer.json").write_text(
                json.dumps({"blob": layer.blob.__dict__, "diff_id": layer.diff_id}, sort_keys=True)
            )
        tmp.rename(base)
    finally:
        h.probe(f"umount -l {q(str(rootfs / 'proc'))} 2>/dev/null; rm -rf {q(str(tmp))}")
    return base


def _layer_from_json(path: Path) -> oci.Layer:
    raw = json.loads(path.read_text())
    return oci.Layer(oci.Blob(**raw["blob"]), raw["diff_id"])


def _build_wheel(dist: Path) -> Path:
    """The project's wheel from its checkout, with fixed timestamps (SOURCE_DATE_EPOCH)."""
    src = project_dir()
    dist.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="osfleet-wheel-") as build_tmp:
        # Built from a copy: setuptools writes build/ and egg-info beside the sources it builds.
        copy = Path(build_tmp) / "src"
        shutil.copytree(
            src, copy, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", "runs",
                                                     ".mypy_cache", ".ruff_cache", ".pytest_cache", "tests")
        )  # fmt: skip
        env = {**os.environ, "SOURCE_DATE_EPOCH": "315532800"}
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
             str(copy)],
            capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        raise CommandFailedError(f"building the osfleet wheel failed: {_last_line(done.stderr or done.stdout)}")
    (wheel,) = dist.glob("osfleet-*.whl")
    return wheel


def _pins() -> list[str]:
    """``name==version`` of every distribution in this environment (what the image's dependencies are pinned to)."""
    import importlib.metadata as md

    pins = set()
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() != "osfleet":
            pins.add(f"{name.lower().replace('_', '-')}=={dist.version}")
    return sorted(pins)


def _input_hash(wheel: Path, pins: list[str]) -> str:
    """What the image is made of: the wheel's files (not its zip metadata), the pins, the base, the builder."""
    h = hashlib.sha256(json.dumps([BUILDER_VERSION, SUITE, MIRROR, BASE_PACKAGES, EXTRAS, ENV, pins]).encode())
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
            h.update(name.encode() + b"\0" + hashlib.sha256(z.read(name)).digest())
    return h.hexdigest()[:12]


def _wheels(h: Host, ours: Path, pins: list[str], out: Path) -> None:
    """Wheels of osfleet's dependencies at the pinned versions, made on this machine (pip's cache, the index)."""
    out.mkdir(parents=True, exist_ok=True)
    constraints = out.parent / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    spec = f"{ours}[{','.join(EXTRAS)}]"
    h.run(
        f"{q(sys.executable)} -m pip wheel -q -w {q(str(out))} -c {q(str(constraints))} {q(spec)}",
        what="pip wheel (osfleet's dependencies)",
    )


def _install(h: Host, rootfs: Path, wheels: Path, ours: Path) -> oci.Layer:
    """The venv inside the base rootfs, installed with no index; packed as the second layer."""
    inside = rootfs / "tmp" / "osfleet-wheels"
    shutil.copytree(wheels, inside)
    if not (inside / ours.name).exists():
        shutil.copy(ours, inside / ours.name)
    chroot = f"chroot {q(str(rootfs))} env LC_ALL=C.UTF-8 SOURCE_DATE_EPOCH=315532800 PYTHONHASHSEED=0"
    h.run(f"{chroot} python3 -m venv {VENV}", what="python3 -m venv")
    spec = f"/tmp/osfleet-wheels/{ours.name}[{','.join(EXTRAS)}]"
    h.run(
        f"{chroot} {VENV}/bin/pip install -q --no-index --no-cache-dir --find-links /tmp/osfleet-wheels {q(spec)}",
        what="pip install (in the image)",
    )
    h.run(f"{chroot} {VENV}/bin/osfleet --version", what="running osfleet in the image")
    h.run(f"rm -rf {q(str(inside))}")
    layer_dir = rootfs.parent.parent / "app-layer-tmp"
    shutil.rmtree(layer_dir, ignore_errors=True)
    layer = oci.write_layer(rootfs, layer_dir, only=[VENV])
    blob = layer_dir / layer.blob.digest.split(":", 1)[1]
    blob.rename(wheels.parent / "app-layer")
    shutil.rmtree(layer_dir, ignore_errors=True)
    return layer


def _manifest_digest(archive: Path) -> str:
    import tarfile

    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ConfigError(f"{archive} is not an OCI archive (no index.json)")
        return str(json.load(member)["manifests"][0]["digest"])


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"
