"""The office recipe (OSWorld's applications) and the recipe fields it adds, without building anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from golden_images import __file__ as golden_init
from osfleet.errors import BadRecipeError
from osfleet.imaging import builder
from osfleet.recipe import load_recipe, recipe_hash

OFFICE = Path(golden_init).parent / "recipes" / "office.yaml"


def test_office_recipe_has_what_osworld_tasks_use() -> None:
    r = load_recipe(OFFICE)
    for package in ("libreoffice-calc", "libreoffice-writer", "libreoffice-impress", "chromium", "gimp", "vlc"):
        assert package in r.packages
    assert {"xdotool", "wmctrl", "python3-xlib"} <= set(r.packages) and r.window_manager == "openbox"
    assert "pyautogui==0.9.54" in r.pip_packages and r.chrome_devtools_port == 1337
    assert builder.image_hash_for(r) != builder.image_hash_for(load_recipe(builder.DEFAULT_RECIPE))


def test_fields_added_later_do_not_rename_older_images() -> None:
    r = load_recipe(builder.DEFAULT_RECIPE)
    files = builder.guest_files()
    assert recipe_hash(r, files) == recipe_hash(r.model_copy(update={"pip_packages": []}), files)
    assert recipe_hash(r, files) != recipe_hash(r.model_copy(update={"chrome_devtools_port": 9222}), files)


def test_pip_packages_must_be_pinned(tmp_path: Path) -> None:
    text = OFFICE.read_text().replace("pyautogui==0.9.54", "pyautogui")
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(BadRecipeError, match="pip_packages: .*name==version"):
        load_recipe(path)


def test_chrome_wrapper_lets_a_task_choose_its_port() -> None:
    script = builder._chrome_wrapper(1337)
    assert script.startswith("#!/bin/sh") and '--remote-debugging-port=1337 "$@"' in script
