"""What the main job's lab fleet removes besides the lab itself: the lab agents' template RAM on tmpfs, which
``lab down`` does not own, and only that (another home's files in the same folder stay)."""

from __future__ import annotations

from pathlib import Path

import pytest

from osfleet.bench.lab_fleet import _template_owners, remove_template_memory
from osfleet.config import Settings

pytestmark = pytest.mark.unit


def _template(memory: Path, name: str, state_dir: Path) -> Path:
    (memory / f"{name}.ram").write_bytes(b"\0" * 4096)
    (memory / f"{name}.state").write_text(f"{state_dir}\n")
    return memory / f"{name}.ram"


def test_only_the_labs_template_memory_is_removed(tmp_path: Path) -> None:
    memory = tmp_path / "shm"
    memory.mkdir()
    lab = tmp_path / "home" / "lab"
    ours = [_template(memory, f"golden-x-lab{i}", lab / f"lab{i}" / "home" / "states" / "golden-x") for i in (1, 2)]
    theirs = _template(memory, "golden-x-main", tmp_path / "home" / "states" / "golden-x")
    settings = Settings(home=tmp_path / "home", memory_dir=memory)
    assert len(_template_owners(lab, settings)) == 2
    assert sorted(remove_template_memory(lab, settings)) == sorted(ours)
    assert not any(p.exists() or p.with_suffix(".state").exists() for p in ours)
    assert theirs.exists() and theirs.with_suffix(".state").exists()
    assert _template_owners(lab, settings) == []
