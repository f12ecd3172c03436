"""Build a golden desktop image on a host: debootstrap -> packages -> desktop -> ext4 -> compressed qcow2.

Everything is built under a temporary name beside the output and renamed into place at the end,
manifest last: an image whose manifest exists is complete, so no half-built image is ever used.
Every path and recipe value that reaches a shell goes through ``shlex.quote`` (imported as ``q``); the
recipe model validates the values themselves.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from shlex import quote as q
from typing import Any

from osfleet.config import GOLDEN_PREFIX, Settings
from osfleet.errors import CommandFailedError, ImageInUseError
from osfleet.imaging import build_lock, osworld_desktop, publisher
from osfleet.imaging.host import Host

# Where recipes and guest files come from, and the hash that names an image: in osfleet.recipe, below every
# module that looks an image up by its recipe; the builder's names for them stay importable from here.
from osfleet.recipe import ASSETS_PACKAGE as ASSETS_PACKAGE
from osfleet.recipe import BUILDER_VERSION, Recipe, load_recipe
from osfleet.recipe import DEFAULT_RECIPE as DEFAULT_RECIPE
from osfleet.recipe import GUEST_FILES as GUEST_FILES
from osfleet.recipe import guest_files as guest_files
from osfleet.recipe import image_hash_for as image_hash_for

KERNEL_CMDLINE = "console=ttyS0 quiet loglevel=3"
BUILD_TOOLS = ["debootstrap", "qemu-img", "mkfs.ext4", "busybox", "cpio", "gzip", "chroot", "sha256sum", "flock"]
# rootfs (~1.3 GiB before trimming) + sparse ext4 image + compressed qcow2, with headroom.
BUILD_DISK_BYTES = 4 * 2**30
STEPS = 7
_KERNEL_VERSION = re.compile(r"^[0-9][A-Za-z0-9.+_~-]*$")


@dataclass(frozen=True)
class ImageFiles:
    """Paths (on the host that holds them) of one golden image's files."""

    directory: str
    image_hash: str

    @property
    def stem(self) -> str:
        return f"{self.directory}/{GOLDEN_PREFIX}{self.image_hash}"

    @property
    def disk(self) -> str:
        return f"{self.stem}.qcow2"

    @property
    def kernel(self) -> str:
        return f"{self.stem}.vmlinuz"

    @property
    def initrd(self) -> str:
        return f"{self.stem}.initrd"

    @property
    def manifest(self) -> str:
        return f"{self.stem}.json"

    def payload(self) -> list[str]:
        """Files that make up the image, manifest excluded (it is written last)."""
        return [self.disk, self.kernel, self.initrd]


def build(host: Host, recipe_path: Path = DEFAULT_RECIPE, out_dir: str | None = None) -> ImageFiles:
    """Build (or find in the cache) the golden image of ``recipe_path`` on ``host``.

    Holds the output folder's lock (``build_lock``) from its checks to its last rename: a second build of the
    folder waits, then finds the first one's image. Files that a process holds open (a replica's QEMU, a host
    agent serving the image) are never replaced: the build stops with their pids instead."""
    recipe = load_recipe(recipe_path)
    h = image_hash_for(recipe)
    out = out_dir or str(Settings.from_env().build_dir)
    files = ImageFiles(out, h)
    if _complete(host, files):
        host.say(f"golden image {GOLDEN_PREFIX}{h} is up to date (cache hit): {files.disk}")
        return files

    host.require_tools(BUILD_TOOLS + (["npm"] if recipe.code_server else []))
    host.run(f"mkdir -p {q(out)}", what=f"creating {out}")
    with build_lock.folder_lock(host, out, f"osfleet image build of {GOLDEN_PREFIX}{h}"):
        if _complete(host, files):  # built by the build this one waited for
            host.say(f"golden image {GOLDEN_PREFIX}{h} is up to date (cache hit): {files.disk}")
            return files
        _refuse_in_use(host, files)
        return _build_locked(host, recipe, recipe_path, files)


def _complete(host: Host, files: ImageFiles) -> bool:
    """The image's manifest and every file it names are there (the manifest is renamed into place last)."""
    return host.exists(files.manifest) and all(host.exists(p) for p in files.payload())


def _refuse_in_use(host: Host, files: ImageFiles) -> None:
    """Stop before replacing the image's disk while a process holds it open (a replica's QEMU on an incomplete
    image's leftovers, a host agent serving it): saved states and overlays rest on those bytes."""
    users = publisher.pids_using(host, files.disk) if host.exists(files.disk) else []
    if users:
        raise ImageInUseError(
            f"{files.disk} on {host.name} is in use by pid(s) {', '.join(map(str, users))}: stop its host agent "
            "and replicas before building it again"
        )


def _build_locked(host: Host, recipe: Recipe, recipe_path: Path, files: ImageFiles) -> ImageFiles:
    out, h = files.directory, files.image_hash
    host.require_free(out, BUILD_DISK_BYTES, "an image build")
    work = f"{out}/.tmp-{h}-{uuid.uuid4().hex[:8]}"
    host.say(f"building golden image {GOLDEN_PREFIX}{h} from {recipe_path} on {host.name}")
    started = time.monotonic()
    try:
        host.run(f"mkdir -p {q(f'{work}/initrd/modules')}")
        kernel_version = _build_in(host, recipe, work)
        with host.step(7, STEPS, "publishing the build under its final name"):
            manifest = _manifest(host, recipe, h, work, kernel_version, time.monotonic() - started)
            _refuse_in_use(host, files)  # a replica may have started on leftovers meanwhile
            # No moment where an old manifest describes new files: it goes first, the new one comes last.
            host.run(f"rm -f {q(files.manifest)}")
            for src, dst in (
                (f"{work}/golden.qcow2", files.disk),
                (f"{work}/vmlinuz", files.kernel),
                (f"{work}/initrd.img", files.initrd),
            ):
                host.run(f"chmod 0444 {q(src)} && mv -f {q(src)} {q(dst)}")
            host.write_file(f"{work}/manifest.json", json.dumps(manifest, indent=2) + "\n", 0o444)
            host.run(f"mv -f {q(f'{work}/manifest.json')} {q(files.manifest)}")
    finally:
        host.stop_strays(work)
        host.probe(f"umount -l {q(f'{work}/rootfs/proc')} 2>/dev/null; rm -rf {q(work)}")
    host.say(f"built {files.disk} in {time.monotonic() - started:.0f} s")
    return files


def _build_in(host: Host, recipe: Recipe, work: str) -> str:
    rootfs = f"{work}/rootfs"
    chroot = f"chroot {q(rootfs)} env DEBIAN_FRONTEND=noninteractive INITRD=No LC_ALL=C"
    with host.step(1, STEPS, f"debootstrap {recipe.suite} (about 1 min)"):
        host.run(
            f"debootstrap --variant=minbase {q(recipe.suite)} {q(rootfs)} {q(recipe.mirror)}",
            what="debootstrap",
        )
    with host.step(2, STEPS, f"installing {len(recipe.packages)} packages and the kernel (about 1 min)"):
        host.write_file(f"{rootfs}/usr/sbin/policy-rc.d", "#!/bin/sh\nexit 101\n", 0o755)
        host.run(f"mount -t proc proc {q(f'{rootfs}/proc')}")
        try:
            pkgs = " ".join(q(p) for p in [recipe.kernel_package, *recipe.packages])
            host.run(f"{chroot} apt-get install -y -q --no-install-recommends {pkgs}", what="apt-get install")
            if recipe.pip_packages:
                _pip_install(host, recipe, work, rootfs, chroot)
            if recipe.code_server:
                osworld_desktop.stage_code_server(host, recipe, work, rootfs, chroot)
        finally:
            host.run(f"umount {q(f'{rootfs}/proc')}")
    kernel_version = _kernel_version(host.run(f"ls {q(f'{rootfs}/lib/modules')}"))
    kv = q(kernel_version)
    with host.step(3, STEPS, "configuring the desktop, user and init"):
        _configure(host, recipe, rootfs, chroot)
    with host.step(4, STEPS, "trimming modules, docs and caches"):
        keep = _module_closure(host, chroot, kernel_version, recipe.kernel_modules)
        host.write_file(f"{work}/keep-modules", "\n".join(k.lstrip("/") for k in keep) + "\n")
        host.run(
            f"cd {q(rootfs)} && find lib/modules/{kv} -name '*.ko*' | grep -vxF -f {q(f'{work}/keep-modules')}"
            f" | xargs -r rm -f && {chroot} depmod {kv}",
            what="trimming kernel modules",
        )
        host.run(
            f"cd {q(rootfs)} && rm -rf usr/share/doc/* usr/share/man/* usr/share/info/* usr/share/locale/*"
            " var/cache/apt/* var/lib/apt/lists/* var/log/*.log usr/sbin/policy-rc.d"
            " && find lib/modules -depth -type d -empty -delete",
            what="trimming files",
        )
    with host.step(5, STEPS, "kernel and initrd"):
        initrd = f"{work}/initrd"
        initrd_mods = _module_closure(host, chroot, kernel_version, recipe.initrd_modules)
        for ko in initrd_mods:
            host.run(f"cp {q(f'{rootfs}{ko}')} {q(f'{initrd}/modules/')}")
        host.write_file(f"{initrd}/modules.list", "\n".join(Path(k).name for k in initrd_mods) + "\n")
        host.write_file(f"{initrd}/init", guest_files()["initrd-init"], 0o755)
        host.run(
            f'mkdir -p {q(f"{initrd}/bin")} && cp "$(command -v busybox)" {q(f"{initrd}/bin/busybox")}'
            f" && cd {q(initrd)} && find . | cpio -o -H newc --quiet | gzip -9 > {q(f'{work}/initrd.img')}",
            what="making the initrd",
        )
        host.run(
            f"mv {q(f'{rootfs}/boot/vmlinuz-{kernel_version}')} {q(f'{work}/vmlinuz')}"
            f" && rm -rf {q(f'{rootfs}/boot')}/*"
        )
    size = f"{recipe.disk_size_gib}G"
    raw, disk = f"{work}/disk.raw", f"{work}/golden.qcow2"
    with host.step(6, STEPS, f"ext4 filesystem ({size}) and compressed qcow2 (about 40 s)"):
        host.run(f"mkfs.ext4 -q -F -L osfleet-root -d {q(rootfs)} {q(raw)} {q(size)}", what="mkfs.ext4")
        host.run(f"rm -rf {q(rootfs)}")
        host.run(f"qemu-img convert -c -f raw -O qcow2 {q(raw)} {q(disk)}", what="qemu-img convert")
        host.run(f"rm -f {q(raw)}")
    return kernel_version


def _kernel_version(ls_output: str) -> str:
    """The kernel version the image's kernel package installed (a directory name under /lib/modules)."""
    names = ls_output.split()
    if not names or not _KERNEL_VERSION.match(names[0]):
        raise CommandFailedError(f"unexpected kernel module directory in the image: {ls_output.strip()[:80]!r}")
    return names[0]


def _configure(host: Host, recipe: Recipe, rootfs: str, chroot: str) -> None:
    files = guest_files()
    boot_modules = [m for m in recipe.kernel_modules if m not in recipe.initrd_modules]
    env = {
        "OSFLEET_HOSTNAME": recipe.hostname,
        "OSFLEET_USER": recipe.user,
        "OSFLEET_BACKGROUND": recipe.background,
        "OSFLEET_WM": recipe.window_manager,
        "OSFLEET_TERMINAL": recipe.terminal,
        "OSFLEET_EDITOR": recipe.editor,
        "OSFLEET_SCREEN": f"{recipe.screen.width}x{recipe.screen.height}",
        "OSFLEET_MODULES": " ".join(boot_modules),
    } | osworld_desktop.env(recipe)
    host.run(f"mkdir -p {q(f'{rootfs}/etc/osfleet')} {q(f'{rootfs}/etc/X11/xorg.conf.d')}")
    host.write_file(f"{rootfs}/etc/osfleet/desktop.env", "".join(f"{k}={q(v)}\n" for k, v in env.items()))
    host.write_file(f"{rootfs}/sbin/osfleet-init", files["init"], 0o755)
    host.write_file(f"{rootfs}/etc/osfleet/xsession", files["xsession"], 0o755)
    xorg = files["xorg.conf"].replace("@WIDTH@", str(recipe.screen.width))
    host.write_file(f"{rootfs}/etc/X11/xorg.conf", xorg.replace("@HEIGHT@", str(recipe.screen.height)))
    if recipe.chrome_devtools_port is not None and not recipe.osworld_desktop:
        host.write_file(f"{rootfs}/usr/local/bin/google-chrome", _chrome_wrapper(recipe.chrome_devtools_port), 0o755)
    if not host.exists(f"{rootfs}/sbin/shutdown"):
        host.write_file(f"{rootfs}/sbin/shutdown", files["shutdown"], 0o755)
    host.write_file(f"{rootfs}/etc/hostname", recipe.hostname + "\n")
    host.write_file(f"{rootfs}/etc/fstab", "/dev/vda / ext4 rw,relatime 0 1\n")
    host.run(f"{chroot} useradd -m -u 1000 -s /bin/bash {q(recipe.user)}", what="useradd")
    if recipe.osworld_desktop:
        osworld_desktop.configure(host, recipe, rootfs, chroot)
    # Clones get their own machine id at first boot of each replica (see the replica runtime).
    host.run(f": > {q(f'{rootfs}/etc/machine-id')}")


def _pip_install(host: Host, recipe: Recipe, work: str, rootfs: str, chroot: str) -> None:
    """Install the recipe's pinned pip packages in the image, without their dependencies (Debian packages give
    those). The build host downloads them (it has the package index and its certificates; the chroot does not),
    and the chroot installs from that folder with no index, building source packages with Debian's setuptools."""
    pins = " ".join(q(p) for p in recipe.pip_packages)
    wheels = f"{work}/pip"
    host.run(f"python3 -m pip download -q --no-deps -d {q(wheels)} {pins}", what="pip download")
    host.run(f"cp -r {q(wheels)} {q(f'{rootfs}/tmp/osfleet-pip')}")
    host.run(
        f"{chroot} python3 -m pip install -q --no-index --find-links /tmp/osfleet-pip --no-deps"
        f" --no-build-isolation --no-cache-dir --break-system-packages {pins}",
        what="pip install",
    )
    host.run(f"rm -rf {q(f'{rootfs}/tmp/osfleet-pip')}")


def _chrome_wrapper(port: int) -> str:
    """``google-chrome`` as OSWorld's tasks call it: Chromium with DevTools on ``port`` (a task's own
    ``--remote-debugging-port`` comes later on the command line and wins)."""
    return (
        "#!/bin/sh\n# Chromium under the name OSWorld's tasks use, with the DevTools port they expect.\n"
        "exec chromium --no-first-run --no-default-browser-check --password-store=basic --disable-gpu "
        f'--remote-debugging-port={port} "$@"\n'
    )


def _module_closure(host: Host, chroot: str, kernel_version: str, modules: list[str]) -> list[str]:
    """Module files (paths inside the rootfs) for ``modules`` and their dependencies, in load order."""
    names = " ".join(q(m) for m in modules)
    out = host.run(f"{chroot} modprobe -S {q(kernel_version)} --show-depends -a {names}", what="modprobe")
    paths: list[str] = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "insmod" and parts[1] not in paths:
            paths.append(parts[1])
    return paths


def _manifest(host: Host, recipe: Recipe, h: str, work: str, kernel_version: str, seconds: float) -> dict[str, Any]:
    disk = q(f"{work}/golden.qcow2")
    stat = host.run(f"stat -c '%s %b %B' {disk}").split()
    virtual = json.loads(host.run(f"qemu-img info --output=json {disk}"))["virtual-size"]
    sha = host.run(f"sha256sum {disk}").split()[0]
    return {
        "image": f"{GOLDEN_PREFIX}{h}",
        "recipe_hash": h,
        "builder_version": BUILDER_VERSION,
        "recipe": recipe.model_dump(),
        "kernel_version": kernel_version,
        "kernel_cmdline": KERNEL_CMDLINE,
        "disk_sha256": sha,
        "disk_apparent_bytes": int(stat[0]),
        "disk_allocated_bytes": int(stat[1]) * int(stat[2]),
        "disk_virtual_bytes": virtual,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(seconds, 1),
        "built_on": host.name,
    }
