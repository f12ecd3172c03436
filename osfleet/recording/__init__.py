"""Recorded episodes ("trajectories"): the recorder the host agent feeds, the store on disk, and export."""

from __future__ import annotations

from pathlib import Path

from osfleet.recording.recorder import Recorder
from osfleet.recording.store import StepRecord, TrajectoryError, TrajectoryMeta, TrajectoryStore

TRAJECTORIES_DIR = "trajectories"


def store_dir(home: Path) -> Path:
    """Where a host keeps its recorded episodes: ``$OSFLEET_HOME/trajectories``."""
    return home / TRAJECTORIES_DIR


__all__ = ["Recorder", "StepRecord", "TrajectoryError", "TrajectoryMeta", "TrajectoryStore", "store_dir"]
