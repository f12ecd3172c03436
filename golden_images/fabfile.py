"""Fabric tasks for golden images: ``fab -r golden_images TASK`` locally, ``fab -r golden_images -H root@host TASK``
over SSH. Each task takes the Connection (or local Context) first, so one task serves both.

``overlay`` and ``verify`` run the ``osfleet`` command on the host (a KVM host has osfleet installed for
its host agent); ``--osfleet`` names it when it is not on the remote PATH.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from fabric import task
from invoke.exceptions import Exit

from osfleet.config import Settings
from osfleet.errors import OsfleetError
from osfleet.imaging import builder, publisher
from osfleet.imaging.host import Host
from osfleet.vm.images import find_image


def _fail(exc: OsfleetError) -> Exit:
    return Exit(f"error: {exc}", code=1)


@task(help={"recipe": "recipe YAML file", "out": "output directory on the host (default: $OSFLEET_HOME/build)"})
def build(c, recipe: str = str(builder.DEFAULT_RECIPE), out: str = ""):  # type: ignore[no-untyped-def]
    """Build the golden desktop image of a recipe (a cache hit when the recipe is unchanged)."""
    try:
        builder.build(Host(c), Path(recipe), out or None)
    except OsfleetError as exc:
        raise _fail(exc) from None


@task(
    help={
        "image": "local image: golden-<hash>, a hash prefix or a .qcow2 path (default: newest)",
        "store": "image store on the host (default: $OSFLEET_HOME/images)",
    }
)
def publish(c, image: str = "", store: str = ""):  # type: ignore[no-untyped-def]
    """Publish a locally built golden image into a host's read-only image store (once per checksum)."""
    try:
        publisher.publish(Host(c), find_image(image or None, Settings.from_env()), store or None)
    except OsfleetError as exc:
        raise _fail(exc) from None


@task(
    help={
        "image": "image on the host: golden-<hash> or a hash prefix",
        "dest": "directory on the host",
        "strategy": "overlay, reflink or full",
        "count": "how many disks",
        "osfleet": "path of the osfleet command on the host",
    }
)
def overlay(c, image: str, dest: str, strategy: str = "overlay", count: int = 1, osfleet: str = "osfleet"):  # type: ignore[no-untyped-def]
    """Make copy-on-write replica disks of a published image on a host (qcow2 overlay, reflink or full copy)."""
    host = Host(c)
    try:
        out = host.run(
            f"{shlex.quote(osfleet)} disk provision --strategy {shlex.quote(strategy)} --count {int(count)} "
            f"{shlex.quote(image)} {shlex.quote(dest)}",
            what="osfleet disk provision",
        )
        print(out.strip())
    except OsfleetError as exc:
        raise _fail(exc) from None


@task(
    help={
        "image": "image on the host (default: newest)",
        "screenshot": "where to save the screenshot locally",
        "osfleet": "path of the osfleet command on the host",
    }
)
def verify(c, image: str = "", screenshot: str = "verify.png", osfleet: str = "osfleet"):  # type: ignore[no-untyped-def]
    """Boot a throwaway replica on the host, wait for guest agent and drawn desktop, fetch the screenshot."""
    host = Host(c)
    try:
        remote_shot = host.run("mktemp --suffix=.png").strip() if host.remote else str(Path(screenshot).resolve())
        try:
            out = host.run(
                f"{shlex.quote(osfleet)} image verify {shlex.quote(image)} --screenshot {shlex.quote(remote_shot)}",
                what="osfleet image verify",
            )
            if host.remote:
                host.get(remote_shot, Path(screenshot))
        finally:
            if host.remote:
                host.probe(f"rm -f {shlex.quote(remote_shot)}")
        print(out.strip())
    except OsfleetError as exc:
        raise _fail(exc) from None


__all__ = ["build", "publish", "overlay", "verify"]
