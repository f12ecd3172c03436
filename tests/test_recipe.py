from __future__ import annotations

from pathlib import Path

import pytest

from osfleet.errors import BadRecipeError
from osfleet.imaging import builder
from osfleet.recipe import load_recipe, recipe_hash

pytestmark = pytest.mark.unit


def test_default_recipe_is_valid_and_hash_is_stable() -> None:
    r = load_recipe(builder.DEFAULT_RECIPE)
    assert (r.screen.width, r.screen.height) == (1280, 800)
    assert r.user == "user"
    assert builder.image_hash_for(r) == builder.image_hash_for(load_recipe(builder.DEFAULT_RECIPE))


def test_hash_changes_with_recipe_and_guest_files() -> None:
    r = load_recipe(builder.DEFAULT_RECIPE)
    files = builder.guest_files()
    h = recipe_hash(r, files)
    assert recipe_hash(r.model_copy(update={"hostname": "other"}), files) != h
    assert recipe_hash(r, {**files, "init": files["init"] + "\n# changed"}) != h


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\npackages: []\nkernel_modules: []\ninitrd_modules: []\ncolour: red\n", "colour"),
        ("name: x\npackages: []\nkernel_modules: []\n", "initrd_modules"),
        ("name: x\npackages: ['bad name']\nkernel_modules: []\ninitrd_modules: []\n", "packages"),
        ("name: x\npackages: []\nkernel_modules: []\ninitrd_modules: []\nbackground: blue\n", "background"),
        (
            "name: x\npackages: []\nkernel_modules: []\ninitrd_modules: []\nscreen: {width: 10}\n",
            "screen.width",
        ),
        ("- just\n- a list\n", "mapping"),
        ("name: [unclosed\n", "not readable YAML"),
    ],
)
def test_bad_recipes_give_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(BadRecipeError, match=message) as info:
        load_recipe(path)
    assert "\n" not in str(info.value)


BASE = "name: x\npackages: [xterm]\nkernel_modules: [ext4]\ninitrd_modules: [ext4]\n"


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("suite: 'bookworm; rm -rf /'", "suite"),
        ("suite: '$(reboot)'", "suite"),
        ("mirror: 'http://deb.debian.org/debian; rm -rf /'", "mirror"),
        ("kernel_package: 'linux-image-amd64 && reboot'", "kernel_package"),
        ("window_manager: 'twm & rm -rf ~'", "window_manager"),
        ("terminal: 'xterm -e reboot'", "terminal"),
        ("editor: '`reboot`'", "editor"),
        ("user: 'user; reboot'", "user"),
        ("hostname: 'a b'", "hostname"),
        ("screen: {width: 1280, height: '800; reboot'}", "screen.height"),
        ("screen: {width: 99999, height: 800}", "screen.width"),
    ],
)
def test_recipe_values_that_reach_a_shell_are_refused_naming_the_field(tmp_path: Path, line: str, field: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(BASE + line + "\n")
    with pytest.raises(BadRecipeError) as info:
        load_recipe(path)
    assert str(info.value).startswith(f"bad recipe {path}: {field}: ")


def test_package_lists_refuse_shell_words(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("name: x\npackages: [xterm, 'twm;reboot']\nkernel_modules: []\ninitrd_modules: []\n")
    with pytest.raises(BadRecipeError, match="packages: .*'twm;reboot'"):
        load_recipe(path)


def test_missing_recipe(tmp_path: Path) -> None:
    with pytest.raises(BadRecipeError, match="recipe not found"):
        load_recipe(tmp_path / "nope.yaml")
