"""Golden images on this host: find them by name, hash prefix or path; read their manifests.

osfleet writes images into three kinds of folder, and a name is found in any of them: the image store
(``$OSFLEET_HOME/images``, published), the default build folder (``$OSFLEET_HOME/build``) and the folders of
other recipes' builds beside it (``$OSFLEET_HOME/build-<recipe name>``, e.g. ``build-office``, where a suite's or
a benchmark's ``--recipe`` image is built so that it does not become every command's newest image). Only the
"newest image" default (no name given) is limited to the store and the default build folder, for that reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osfleet.config import GOLDEN_PREFIX, ReplicaShape, Settings
from osfleet.errors import ImageNotFoundError
from osfleet.recipe import image_hash_for, load_recipe


@dataclass(frozen=True)
class GoldenImage:
    """A complete golden image: its manifest exists, so all its files were renamed into place."""

    manifest_path: Path
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.manifest["image"])

    @property
    def disk(self) -> Path:
        return self.manifest_path.with_suffix(".qcow2")

    @property
    def kernel(self) -> Path:
        return self.manifest_path.with_suffix(".vmlinuz")

    @property
    def initrd(self) -> Path:
        return self.manifest_path.with_suffix(".initrd")

    @property
    def cmdline(self) -> str:
        return str(self.manifest["kernel_cmdline"])

    @property
    def screen(self) -> tuple[int, int]:
        s = self.manifest["recipe"]["screen"]
        return int(s["width"]), int(s["height"])

    @property
    def background(self) -> tuple[int, int, int]:
        v = str(self.manifest["recipe"]["background"])
        return int(v[1:3], 16), int(v[3:5], 16), int(v[5:7], 16)

    @property
    def shape(self) -> ReplicaShape:
        """The replica shape this image asks for: its recipe's ``memory_mib`` and ``tb_cache_mib`` (the OSWorld
        desktop's pre-started applications need more than the default), else osfleet's default."""
        recipe, default = self.manifest["recipe"], ReplicaShape()
        return dataclasses.replace(
            default,
            memory_mib=int(recipe.get("memory_mib") or default.memory_mib),
            tb_cache_mib=int(recipe.get("tb_cache_mib") or default.tb_cache_mib),
        )

    @property
    def published(self) -> bool:
        return "published_at" in self.manifest


class ImageHold:
    """An open descriptor on an image's disk, kept while a host agent (any ``ReplicaHost``) serves the image.

    Its saved running states rest on those bytes (``osfleet.replicas.saved_state``), even while no replica runs;
    with the disk held, a build or a publish of the same name sees the image in use (``publisher.pids_using``
    scans open descriptors) and stops instead of replacing it under the agent."""

    def __init__(self, image: GoldenImage) -> None:
        try:
            self._fd: int | None = os.open(image.disk, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # no disk to hold: whatever uses the image fails on its own, with its own message
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def load(manifest_path: Path) -> GoldenImage:
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise ImageNotFoundError(f"no golden image at {manifest_path}") from None
    except (OSError, ValueError) as exc:
        raise ImageNotFoundError(f"unreadable image manifest {manifest_path}: {exc}") from None
    image = GoldenImage(manifest_path, manifest)
    missing = [p.name for p in (image.disk, image.kernel, image.initrd) if not p.exists()]
    if missing:
        raise ImageNotFoundError(f"golden image {image.name} is incomplete: missing {', '.join(missing)}")
    return image


def image_folders(settings: Settings, *, default_only: bool = False) -> list[Path]:
    """Where osfleet puts golden images, in the order they are preferred: the store, ``build/``, then every
    ``build-<recipe name>/`` (sorted); ``default_only`` stops after ``build/`` (the newest-image default)."""
    folders = [settings.image_store, settings.build_dir]
    if not default_only:
        folders += sorted(p for p in settings.home.glob("build-*") if p.is_dir())
    return folders


def list_images(settings: Settings, *, default_only: bool = False) -> list[GoldenImage]:
    """Published images first, then built-but-unpublished ones (``build/``, then the other recipes' build
    folders); newest first within each folder."""
    found: list[GoldenImage] = []
    for directory in image_folders(settings, default_only=default_only):
        manifests = sorted(directory.glob(f"{GOLDEN_PREFIX}*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for m in manifests:
            try:
                found.append(load(m))
            except ImageNotFoundError:
                continue
    return found


def find_image(ref: str | None, settings: Settings) -> GoldenImage:
    """Resolve ``ref``: a path, a recipe file (the image built from it, by the recipe's hash), ``golden-<hash>``
    or a hash prefix (each looked up in every folder of ``image_folders``), or None for the newest image of the
    store and ``build/``."""
    if ref:
        path = Path(ref)
        if path.suffix in (".qcow2", ".json") and (path.exists() or "/" in ref):
            return load(path.with_suffix(".json"))
        if path.suffix in (".yaml", ".yml"):
            return _image_of_recipe(path, settings)
    images = list_images(settings, default_only=not ref)
    if not ref:
        if not images:
            raise ImageNotFoundError(
                f"no golden image in {settings.image_store} or {settings.build_dir}: run 'osfleet image build'"
            )
        return images[0]
    wanted = ref.removeprefix(GOLDEN_PREFIX)
    for image in images:
        if image.manifest["recipe_hash"].startswith(wanted):
            return image
    raise ImageNotFoundError(f"no golden image matches {ref!r} (see 'osfleet image ls')")


def _image_of_recipe(path: Path, settings: Settings) -> GoldenImage:
    """The image a recipe file builds, wherever it was built (``image_folders``); never builds it."""
    recipe = load_recipe(path)  # a missing or bad recipe is one line (BadRecipeError)
    name = f"{GOLDEN_PREFIX}{image_hash_for(recipe)}"
    for folder in image_folders(settings):
        if (folder / f"{name}.json").exists():
            return load(folder / f"{name}.json")
    out = settings.home / f"build-{recipe.name}"
    raise ImageNotFoundError(
        f"the image of recipe {path} ({name}) is not built here: osfleet image build --recipe {path} --out {out}"
    )
