"""The office recipe (OSWorld's applications) and the recipe fields it adds, without building anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from golden_images import __file__ as golden_init
from osfleet.errors import BadRecipeError
from osfleet.imaging import builder, osworld_desktop
from osfleet.recipe import load_recipe, recipe_hash

pytestmark = pytest.mark.unit

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


def test_the_office_recipe_is_the_desktop_osworld_expects() -> None:
    r = load_recipe(OFFICE)
    assert r.osworld_desktop and r.password == "password" and r.code_server == "4.89.1"
    assert r.prestart == ["chrome", "libreoffice", "code-server"] and r.memory_mib == 1536
    for package in ("thunderbird", "nodejs", "python3-pyatspi", "gir1.2-atspi-2.0", "at-spi2-core", "dbus", "sudo"):
        assert package in r.packages, package
    assert {"python3-websocket", "python3-uno", "iproute2"} <= set(r.packages) and "virtio_net" in r.kernel_modules
    files = osworld_desktop.guest_files(r)
    assert {"osworld/xsession", "osworld/code", "osworld/google-chrome", "osworld/vlcrc"} <= set(files)
    assert "http-password=password" in files["osworld/vlcrc"] and "http-port=8080" in files["osworld/vlcrc"]
    assert '--user-data-dir="$HOME/.config/google-chrome"' in files["osworld/google-chrome"]
    assert "DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus" in files["osworld/session.env"]
    env = osworld_desktop.env(r)
    assert env["OSFLEET_PRESTART"] == "chrome libreoffice code-server" and env["OSFLEET_CHROME_PORT"] == "1337"


def test_only_osworld_recipes_get_its_files_so_the_desktop_keeps_its_name() -> None:
    desktop = load_recipe(builder.DEFAULT_RECIPE)
    assert osworld_desktop.guest_files(desktop) == {} and osworld_desktop.env(desktop) == {}
    assert builder.image_hash_for(desktop) == recipe_hash(desktop, builder.guest_files())
    office = load_recipe(OFFICE)
    changed = office.model_copy(update={"prestart": ["chrome"]})
    assert builder.image_hash_for(changed) != builder.image_hash_for(office)


@pytest.mark.parametrize(
    "old, new, problem",
    [
        ("osworld_desktop: true", "osworld_desktop: false", "prestart and code_server need osworld_desktop"),
        ('code_server: "4.89.1"', "code_server: null", "prestart names code-server but no code_server"),
        ('code_server: "4.89.1"', 'code_server: "latest"', "npm version"),
        ("password: password", "password: 'pass word'", "password"),
    ],
)
def test_osworld_recipe_fields_are_checked(tmp_path: Path, old: str, new: str, problem: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(OFFICE.read_text().replace(old, new))
    with pytest.raises(BadRecipeError, match=problem):
        load_recipe(path)


def test_readiness_waits_for_the_prestarted_apps_only_where_the_image_has_them(tmp_path: Path) -> None:
    from osfleet.vm.images import GoldenImage
    from osfleet.vm.readiness import prestarted_apps

    office = GoldenImage(tmp_path / "o.json", {"recipe": load_recipe(OFFICE).model_dump()})
    desktop = GoldenImage(tmp_path / "d.json", {"recipe": load_recipe(builder.DEFAULT_RECIPE).model_dump()})
    assert prestarted_apps(office) == ["chrome", "libreoffice", "code-server"] and prestarted_apps(desktop) == []
    assert office.shape.memory_mib == 1536 and desktop.shape.memory_mib == 512
    assert office.shape.tb_cache_mib == 512 and desktop.shape.tb_cache_mib == 64  # a browser overflows 64
