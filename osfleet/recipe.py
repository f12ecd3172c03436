"""Golden-image recipes: what goes into a desktop image, and the hash that names the result.

The hash covers the recipe's values, the guest files shipped beside it and the builder's version, so an
unchanged recipe is a cache hit and any change to what ends up in the image gives a new name.
"""

from __future__ import annotations

import hashlib
import json
import re
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from osfleet.errors import BadRecipeError, first_problem

# Bump when the build steps change in a way that changes the image for the same recipe.
BUILDER_VERSION = "3"
# Fields added after builder version 3 count in the hash only when set, so older images keep their names.
OPTIONAL_SINCE_V3 = (
    "pip_packages",
    "chrome_devtools_port",
    "osworld_desktop",
    "prestart",
    "code_server",
    "password",
    "memory_mib",
    "tb_cache_mib",
)
HASH_LENGTH = 16

# Recipes and guest files are data shipped in the ``golden_images`` package (beside its Fabric tasks): read
# as package resources, never imported as code, so ``osfleet`` does not depend on the Fabric tasks. The guest
# files are here, not only in the builder (``osfleet.imaging``), because they are part of an image's name:
# whoever looks an image up by its recipe (``osfleet.vm.images``, the suites) hashes them without the builder.
ASSETS_PACKAGE = "golden_images"
DEFAULT_RECIPE = Path(str(resources.files(ASSETS_PACKAGE) / "recipes" / "desktop.yaml"))
GUEST_FILES = ("init", "initrd-init", "shutdown", "xorg.conf", "xsession")
# The OSWorld desktop's files (``osfleet.imaging.osworld_desktop`` installs them), for a recipe that has it.
OSWORLD_GUEST_FILES = (
    "xsession",
    "session.env",
    "runtime-dir",
    "apps",
    "prewarm-office.py",
    "google-chrome",
    "google-chrome.desktop",
    "code-server",
    "code",
    "vlcrc",
    "gnome-terminal",
    "build-code-server",
)

_PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]*$")
_COLOR = re.compile(r"^#[0-9a-fA-F]{6}$")
# Values that end up in shell commands, guest files or the guest's environment: each must be a plain name.
_SUITE = re.compile(r"^[a-z][a-z0-9-]{1,40}$")
_PROGRAM = re.compile(r"^[a-z0-9][a-z0-9._+-]{0,40}$")
_PIP_PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,60}==[0-9][A-Za-z0-9.+!-]{0,30}$")
_NPM_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
_MIRROR = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%+/-]*)?$")


class Screen(BaseModel):
    model_config = ConfigDict(extra="forbid")

    width: int = Field(1280, ge=640, le=3840)
    height: int = Field(800, ge=480, le=2160)


class Recipe(BaseModel):
    """A desktop image recipe; the YAML file's keys map one to one onto these fields."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")
    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"
    kernel_package: str = "linux-image-amd64"
    packages: list[str]
    screen: Screen = Field(default_factory=lambda: Screen(width=1280, height=800))
    user: str = Field("user", pattern=r"^[a-z_][a-z0-9_-]{0,30}$")
    hostname: str = Field("osfleet", pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    window_manager: str = "twm"
    terminal: str = "xterm"
    editor: str = "xedit"
    background: str = "#2f5f8f"
    disk_size_gib: int = Field(2, ge=1, le=64)
    # Kernel modules kept in the image; everything else is dropped to keep the image small.
    kernel_modules: list[str]
    # Kernel modules the initrd loads to find and mount the root disk.
    initrd_modules: list[str]
    # Python packages Debian does not ship (e.g. pyautogui for OSWorld's set-up steps), pinned ``name==version``,
    # installed with pip without their dependencies (those come from Debian packages in ``packages``).
    pip_packages: list[str] = []
    # When set, ``google-chrome`` in the guest starts Chromium with its DevTools protocol on this port (the port
    # OSWorld's browser tasks reach).
    chrome_devtools_port: int | None = Field(None, ge=1024, le=65535)
    # The desktop OSWorld's tasks expect (guest files in ``golden_images/guest/osworld/``): a session bus at
    # /run/user/<uid>/bus with AT-SPI, ``google-chrome`` with its profile where OSWorld's getters read it,
    # VLC's HTTP interface, ``code``, sudo; the session pre-starts the ``prestart`` applications.
    osworld_desktop: bool = False
    # Applications the session starts before the running state is saved, so a task's set-up finds them up:
    # chrome (no window, DevTools answering), libreoffice (no window; documents open in it), code-server.
    prestart: list[Literal["chrome", "libreoffice", "code-server"]] = []
    # code-server (VS Code's editor served from npm) of this version, staged by the build host (the guest
    # has no network) and built in the image against Debian's nodejs; ``code`` opens it.
    code_server: str | None = None
    # The desktop user's password (OSWorld's tasks run ``echo password | sudo -S ...``); the user may sudo.
    password: str | None = Field(None, pattern=r"^[A-Za-z0-9._-]{1,64}$")
    # Guest RAM of this image's replicas (MiB); none: osfleet's default shape.
    memory_mib: int | None = Field(None, ge=256, le=16384)
    # QEMU's translation cache under TCG (MiB, a ceiling: only what is translated is resident); none: osfleet's
    # default shape (64, sized for hundreds of small desktops). A browser's code overflows 64: opening one
    # Chromium tab after a restore flushed it 49-54 times and took 91-111 s; with 512, 43-52 s (README,
    # "OSWorld tasks, offline"; scripts/measure-chrome-tabs).
    tb_cache_mib: int | None = Field(None, ge=32, le=4096)

    @field_validator("packages", "kernel_modules", "initrd_modules")
    @classmethod
    def _names(cls, values: list[str]) -> list[str]:
        bad = [v for v in values if not _PACKAGE_NAME.match(v.replace("_", "-"))]
        if bad:
            raise ValueError(f"invalid names: {', '.join(repr(b) for b in bad)}")
        return values

    @field_validator("pip_packages")
    @classmethod
    def _pins(cls, values: list[str]) -> list[str]:
        bad = [v for v in values if not _PIP_PIN.match(v)]
        if bad:
            raise ValueError(f"pip packages must be pinned as name==version: {', '.join(repr(b) for b in bad)}")
        return values

    @field_validator("code_server")
    @classmethod
    def _code_server(cls, value: str | None) -> str | None:
        if value is not None and not _NPM_VERSION.match(value):
            raise ValueError(f"{value!r} is not an npm version like 4.89.1")
        return value

    @model_validator(mode="after")
    def _osworld_parts(self) -> Recipe:
        if (self.prestart or self.code_server) and not self.osworld_desktop:
            raise ValueError("prestart and code_server need osworld_desktop: true (its session starts them)")
        if "code-server" in self.prestart and not self.code_server:
            raise ValueError("prestart names code-server but no code_server version is given")
        if "chrome" in self.prestart and self.chrome_devtools_port is None:
            raise ValueError("prestart names chrome but chrome_devtools_port is not set")
        return self

    @field_validator("kernel_package")
    @classmethod
    def _package(cls, value: str) -> str:
        if not _PACKAGE_NAME.match(value):
            raise ValueError(f"{value!r} is not a Debian package name")
        return value

    @field_validator("suite")
    @classmethod
    def _suite(cls, value: str) -> str:
        if not _SUITE.match(value):
            raise ValueError(f"{value!r} is not a Debian suite name (like bookworm)")
        return value

    @field_validator("mirror")
    @classmethod
    def _mirror(cls, value: str) -> str:
        if not _MIRROR.match(value):
            raise ValueError(f"{value!r} is not a plain http(s) mirror URL (like http://deb.debian.org/debian)")
        return value

    @field_validator("window_manager", "terminal", "editor")
    @classmethod
    def _program(cls, value: str) -> str:
        if not _PROGRAM.match(value):
            raise ValueError(f"{value!r} is not a program name (like xterm)")
        return value

    @field_validator("background")
    @classmethod
    def _color(cls, value: str) -> str:
        if not _COLOR.match(value):
            raise ValueError("must be a colour like #2f5f8f")
        return value.lower()


def load_recipe(path: Path) -> Recipe:
    """Read and validate a recipe file, turning every problem into one readable line."""
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise BadRecipeError(f"recipe not found: {path}") from None
    except (OSError, yaml.YAMLError) as exc:
        raise BadRecipeError(f"recipe {path} is not readable YAML: {exc}".splitlines()[0]) from None
    if not isinstance(data, dict):
        raise BadRecipeError(f"recipe {path} must be a mapping of keys to values")
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise BadRecipeError(f"bad recipe {path}: {first_problem(exc, 'recipe')}") from None


def recipe_hash(recipe: Recipe, guest_files: dict[str, str]) -> str:
    """Content hash naming the image built from ``recipe`` with these guest file contents."""
    h = hashlib.sha256()
    h.update(f"builder={BUILDER_VERSION}\n".encode())
    values = recipe.model_dump()
    for key in OPTIONAL_SINCE_V3:  # fields added later count only when set: older images keep their names
        if values.get(key) in (None, [], False):
            values.pop(key, None)
    h.update(json.dumps(values, sort_keys=True).encode())
    for name in sorted(guest_files):
        h.update(f"\n--- {name}\n".encode())
        h.update(guest_files[name].encode())
    return h.hexdigest()[:HASH_LENGTH]


def guest_files() -> dict[str, str]:
    """The guest files every image holds (``init``, the X session, ...), by name."""
    base = resources.files(ASSETS_PACKAGE) / "guest"
    return {name: (base / name).read_text() for name in GUEST_FILES}


def osworld_guest_files(recipe: Recipe) -> dict[str, str]:
    """The OSWorld desktop's guest files (named ``osworld/<file>``), or none for a recipe without it."""
    if not recipe.osworld_desktop:
        return {}
    base = resources.files(ASSETS_PACKAGE) / "guest" / "osworld"
    return {f"osworld/{name}": (base / name).read_text() for name in OSWORLD_GUEST_FILES}


def image_hash_for(recipe: Recipe) -> str:
    """The hash naming the image built from ``recipe`` (``golden-<hash>``), with the guest files it ships."""
    return recipe_hash(recipe, guest_files() | osworld_guest_files(recipe))
