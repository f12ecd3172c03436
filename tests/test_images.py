"""Golden images are found by name wherever osfleet builds them (no VM: manifests and empty files in a tmp home)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from osfleet.config import Settings
from osfleet.errors import BadRecipeError, ImageNotFoundError
from osfleet.vm.images import find_image, image_folders, list_images
from tests.conftest import VENV_BIN


def fake_image(folder: Path, recipe_hash: str, mtime: float) -> Path:
    """The files of a complete image (``images.load`` checks they exist), with a manifest as the builder writes."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"golden-{recipe_hash}"
    for suffix in (".qcow2", ".vmlinuz", ".initrd"):
        stem.with_suffix(suffix).write_bytes(b"")
    manifest = stem.with_suffix(".json")
    manifest.write_text(
        json.dumps(
            {
                "image": f"golden-{recipe_hash}",
                "recipe_hash": recipe_hash,
                "disk_allocated_bytes": 2**20,
                "built_at": "2026-12-01T00:00:00Z",
            }
        )
    )
    os.utime(manifest, (mtime, mtime))
    return manifest


@pytest.fixture
def home(tmp_path: Path) -> Settings:
    settings = dataclasses.replace(Settings.from_env(), home=tmp_path)
    fake_image(settings.build_dir, "aaaa000011112222", 1000)
    fake_image(tmp_path / "build-office", "bbbb000011112222", 2000)  # newer, but another recipe's folder
    return settings


@pytest.mark.unit
def test_a_name_is_found_in_another_recipes_build_folder(home: Settings) -> None:
    """What README once told users to do: build office.yaml into build-office, then serve it by name."""
    assert find_image("golden-bbbb000011112222", home).manifest_path.parent.name == "build-office"
    assert find_image("bbbb", home).name == "golden-bbbb000011112222"  # a hash prefix too


@pytest.mark.unit
def test_the_newest_image_default_ignores_other_recipes_folders(home: Settings) -> None:
    assert find_image(None, home).name == "golden-aaaa000011112222"


@pytest.mark.unit
def test_folders_are_listed_store_first(home: Settings) -> None:
    assert image_folders(home) == [home.image_store, home.build_dir, home.home / "build-office"]
    assert [i.name for i in list_images(home)] == ["golden-aaaa000011112222", "golden-bbbb000011112222"]


@pytest.mark.unit
def test_an_unknown_name_still_says_so(home: Settings) -> None:
    with pytest.raises(ImageNotFoundError, match="no golden image matches 'golden-cccc'"):
        find_image("golden-cccc", home)


@pytest.mark.system
def test_image_ls_lists_every_folder(home: Settings) -> None:
    proc = subprocess.run(
        [str(VENV_BIN / "osfleet"), "image", "ls", "--json"],
        env={**os.environ, "OSFLEET_HOME": str(home.home)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert [i["name"] for i in json.loads(proc.stdout)] == ["golden-aaaa000011112222", "golden-bbbb000011112222"]


@pytest.mark.unit
def test_a_recipe_file_names_the_image_built_from_it(home: Settings, tmp_path: Path) -> None:
    from osfleet.imaging.builder import DEFAULT_RECIPE, image_hash_for
    from osfleet.recipe import load_recipe

    office = DEFAULT_RECIPE.parent / "office.yaml"
    wanted = image_hash_for(load_recipe(office))
    with pytest.raises(ImageNotFoundError, match=f"golden-{wanted}\\) is not built here: osfleet image build"):
        find_image(str(office), home)
    fake_image(home.home / "build-office", wanted, 3000)
    assert find_image(str(office), home).name == f"golden-{wanted}"
    with pytest.raises(BadRecipeError, match="recipe not found"):
        find_image(str(tmp_path / "missing.yaml"), home)
