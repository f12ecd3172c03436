"""``osfleet image``, ``osfleet disk`` and ``osfleet accel``: golden images, replica disks, the accelerator."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from osfleet.cli_support import friendly as _friendly
from osfleet.config import Settings

F = TypeVar("F", bound=Callable[..., Any])


def _host(host: str | None, port: int, key: str | None) -> Any:
    """The target of a Fabric-backed command: this machine, or ``user@host`` over SSH."""
    from fabric import Connection
    from invoke import Context

    from osfleet.imaging.host import Host

    if not host:
        return Host(Context())
    connect_kwargs = {"key_filename": key} if key else {}
    return Host(Connection(host, port=port, connect_timeout=10, connect_kwargs=connect_kwargs))


_host_options = [
    click.option("--host", "host", default=None, help="run on user@host over SSH instead of this machine"),
    click.option("--port", default=22, show_default=True, help="SSH port of --host"),
    click.option("--key", default=None, help="SSH private key file for --host"),
]


def host_options(fn: F) -> F:
    for opt in reversed(_host_options):
        fn = opt(fn)
    return fn


# --- images ------------------------------------------------------------------------------------------------
@click.group()
def image() -> None:
    """Build, publish, list and verify golden desktop images."""


@image.command("build")
@click.option(
    "--recipe",
    type=click.Path(path_type=Path),
    default=None,
    help="recipe YAML (default: the desktop recipe)",
)
@click.option("--out", default=None, help="output directory on the host (default: $OSFLEET_HOME/build)")
@host_options
@_friendly
def image_build(recipe: Path | None, out: str | None, host: str | None, port: int, key: str | None) -> None:
    """Build the golden image of a recipe; an unchanged recipe is a cache hit."""
    from osfleet.imaging import builder

    files = builder.build(_host(host, port, key), recipe or builder.DEFAULT_RECIPE, out)
    click.echo(files.disk)


@image.command("container")
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="also write the OCI archive here (push it with: skopeo copy oci-archive:FILE docker://REGISTRY/osfleet:TAG)",
)
@click.option(
    "--import/--no-import",
    "import_",
    default=True,
    show_default=True,
    help="import it into the k8s lab's containerd when one runs (osfleet lab k8s up)",
)
@_friendly
def image_container(out: Path | None, import_: bool) -> None:
    """Build the OCI image of the host agent, gateway and Locust (Debian by debootstrap, osfleet's wheel and its
    pinned dependencies; no Docker daemon); content-addressed, so an unchanged input is a cache hit. Prints the
    image reference last (the k8s stack's containerImage)."""
    from osfleet.imaging import container

    image = container.build(out)
    if import_:
        from osfleet.lab.kube.images import import_into_lab

        import_into_lab(image.archive, image.reference, lambda m: click.echo(m, err=True))
    click.echo(image.reference)


@image.command("publish")
@click.argument("image_ref", required=False)
@click.option("--store", default=None, help="image store on the host (default: $OSFLEET_HOME/images)")
@host_options
@_friendly
def image_publish(image_ref: str | None, store: str | None, host: str | None, port: int, key: str | None) -> None:
    """Put a built image into a host's read-only image store (skipped when already there)."""
    from osfleet.imaging import publisher
    from osfleet.vm.images import find_image

    img = find_image(image_ref, Settings.from_env())
    click.echo(publisher.publish(_host(host, port, key), img, store))


@image.command("ls")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@_friendly
def image_ls(as_json: bool) -> None:
    """List golden images on this machine (published first)."""
    from osfleet.vm.images import list_images

    imgs = list_images(Settings.from_env())
    if as_json:
        click.echo(
            json.dumps([{"name": i.name, "disk": str(i.disk), "published": i.published} for i in imgs], indent=2)
        )
        return
    if not imgs:
        click.echo("no golden images (run 'osfleet image build')")
    for i in imgs:
        m = i.manifest
        click.echo(
            f"{i.name}  {'published' if i.published else 'built    '}  {m['disk_allocated_bytes'] / 2**20:7.1f} MiB"
            f"  built {m['built_at']}  {i.disk}"
        )


@image.command("verify")
@click.argument("image_ref", required=False)
@click.option("--screenshot", type=click.Path(path_type=Path), default=Path("verify.png"), show_default=True)
@click.option("--timeout", default=180.0, show_default=True, help="seconds to wait for a drawn desktop")
@_friendly
def image_verify(image_ref: str | None, screenshot: Path, timeout: float) -> None:
    """Boot a throwaway replica, wait for guest agent and drawn desktop, save its screenshot."""
    from osfleet.imaging.verify import verify_image
    from osfleet.vm.images import find_image

    settings = Settings.from_env()
    res = verify_image(find_image(image_ref, settings), screenshot, settings, timeout)
    accel = "KVM" if res.accel == "kvm" else "TCG"
    click.echo(
        f"ok: guest agent after {res.agent_seconds:.1f} s, desktop drawn after {res.desktop_seconds:.1f} s "
        f"under {accel}; screenshot {screenshot}"
    )


# --- disks and accelerator ---------------------------------------------------------------------------------
@click.group()
def disk() -> None:
    """Replica disks from golden images."""


@disk.command("provision")
@click.argument("image_ref")
@click.argument("dest_dir", type=click.Path(path_type=Path))
@click.option("--strategy", type=click.Choice(["overlay", "reflink", "full"]), default="overlay", show_default=True)
@click.option("--count", default=1, show_default=True, type=click.IntRange(1, 10000))
@_friendly
def disk_provision(image_ref: str, dest_dir: Path, strategy: str, count: int) -> None:
    """Create COUNT replica disks of an image in DEST_DIR; prints each path."""
    from osfleet.vm import disks
    from osfleet.vm.images import find_image

    img = find_image(image_ref, Settings.from_env())
    dest_dir.mkdir(parents=True, exist_ok=True)
    suffix = "qcow2" if strategy == "overlay" else "img"
    existing = len(list(dest_dir.glob(f"replica-*.{suffix}")))
    for i in range(existing, existing + count):
        dest = dest_dir / f"replica-{i:04d}.{suffix}"
        disks.provision(strategy, img.disk, dest)  # type: ignore[arg-type]
        click.echo(dest)


@click.command("accel")
@click.option("--image", "image_ref", default=None, help="image whose kernel the probe boots (default: newest)")
@click.option("--refresh", is_flag=True, help="probe again instead of using the remembered answer")
@_friendly
def accel_cmd(image_ref: str | None, refresh: bool) -> None:
    """Print the accelerator guests really run under here: kvm, or qemu (TCG)."""
    from osfleet.vm.accel import cached_reason, detect_accelerator
    from osfleet.vm.images import find_image

    settings = Settings.from_env()
    accel = detect_accelerator(find_image(image_ref, settings).kernel, settings, refresh=refresh)
    click.echo(f"{accel}  ({cached_reason(settings)})")
