"""The golden image of a recipe for a benchmark (``--recipe``): found by the recipe's hash, built if missing.

A recipe's image is named by its hash (recipe values + guest files + builder version), so the image of
an unchanged recipe is found wherever osfleet builds images (``osfleet.vm.images.image_folders``: the image
store, ``$OSFLEET_HOME/build``, ``$OSFLEET_HOME/build-<recipe name>``). A missing one is built into
``build-<recipe name>``, beside the default build folder rather than in it: benches without ``--image`` take the
newest image of ``build/``, and a second recipe's image there would silently become everyone's default.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from osfleet.config import GOLDEN_PREFIX, Settings
from osfleet.errors import ImageNotFoundError, OsfleetError
from osfleet.vm.images import GoldenImage, image_folders, load


def recipe_image(path: Path, settings: Settings, say: Callable[[str], None], build: bool = True) -> GoldenImage:
    """The image of the recipe at ``path``; built (one image build, minutes) when none exists and ``build``."""
    from osfleet.imaging.builder import image_hash_for
    from osfleet.recipe import load_recipe

    try:
        recipe = load_recipe(path)
    except OSError as exc:
        raise OsfleetError(f"cannot read recipe {path}: {exc.strerror or exc}") from None
    stem = f"{GOLDEN_PREFIX}{image_hash_for(recipe)}"
    for folder in image_folders(settings):
        manifest = folder / f"{stem}.json"
        if manifest.exists():
            try:
                return load(manifest)
            except ImageNotFoundError:
                continue  # incomplete: built again below
    if not build:
        raise ImageNotFoundError(f"no image of recipe {path} ({stem}) here: run 'osfleet image build --recipe {path}'")
    out = settings.home / f"build-{recipe.name}"
    say(f"the image of {path} ({stem}) is not here: building it into {out} (minutes)")
    from invoke import Context

    from osfleet.imaging import builder
    from osfleet.imaging.host import Host

    files = builder.build(Host(Context()), path, str(out))
    return load(Path(files.manifest))
