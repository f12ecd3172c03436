"""Task suites shipped with osfleet: bundles of OSWorld-format tasks with their assets and oracles.

``osworld`` (``suites/osworld/``, written by ``suites/generate.py``) runs on the office image: Calc, Writer
and terminal/editor tasks, each scored by OSWorld metrics on the host. Loading a suite adds its assets to the
host's store (so its downloads resolve offline) and attaches each task's ``osfleet_oracle``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from osfleet.config import Settings
from osfleet.errors import ImageNotFoundError, first_problem
from osfleet.protocol.actions import Action
from osfleet.recipe import DEFAULT_RECIPE, image_hash_for, load_recipe
from osfleet.tasks.assets import AssetStore
from osfleet.tasks.model import Task, TaskError
from osfleet.tasks.osworld_format.convert import from_osworld
from osfleet.tasks.osworld_format.importer import task_files
from osfleet.vm.images import GoldenImage, image_folders, load

SUITES = {"osworld": Path(__file__).parent / "osworld"}
# The image each suite runs on: its recipe, and the folder it is built into beside the default build folder
# (so building it does not make it every other command's "newest image").
SUITE_RECIPE = {"osworld": "office.yaml"}  # a recipe shipped beside desktop.yaml
SUITE_BUILD_DIR = "build-office"
_ORACLE = TypeAdapter(list[Action])


@dataclass
class SuiteTask:
    task: Task
    file: Path
    apps: list[str] = field(default_factory=list)


def suite_folder(name: str) -> Path:
    if name not in SUITES:
        raise TaskError(f"no task suite {name!r} (suites: {', '.join(SUITES)})")
    return SUITES[name]


def load_suite(name: str, store: AssetStore | None = None) -> list[SuiteTask]:
    """The suite's tasks, with their oracles; its assets are added to ``store`` (this host's by default)."""
    folder = suite_folder(name)
    store = store or AssetStore.from_settings()
    store.add_bundle(folder)
    tasks = []
    for path in task_files(folder):
        data = json.loads(path.read_text())
        try:
            oracle = _ORACLE.validate_python(data.get("osfleet_oracle", []))
        except ValidationError as exc:
            raise TaskError(f"bad oracle in {path}: {first_problem(exc, 'osfleet_oracle')}") from None
        task = from_osworld(data, store).model_copy(update={"oracle": oracle})
        tasks.append(SuiteTask(task=task, file=path, apps=list(data.get("related_apps", []))))
    return tasks


def suite_image(name: str, settings: Settings) -> GoldenImage:
    """The image built from the suite's recipe, wherever it was built or published on this host."""
    suite_folder(name)
    recipe = DEFAULT_RECIPE.parent / SUITE_RECIPE[name]
    image = f"golden-{image_hash_for(load_recipe(recipe))}"
    for folder in image_folders(settings):
        if (folder / f"{image}.json").exists():
            return load(folder / f"{image}.json")
    raise ImageNotFoundError(
        f"suite {name} runs on {image} (recipe {recipe.name}), which is not built here: "
        f"osfleet image build --recipe {recipe} --out {settings.home / SUITE_BUILD_DIR}"
    )
