"""The errors of a task that osfleet cannot run: raised wherever a task is read or converted (its own format,
OSWorld's, a metric's requirements), so they sit below all of those modules."""

from __future__ import annotations

from osfleet.errors import OsfleetError


class TaskError(OsfleetError):
    """A task file is invalid."""


class UnsupportedTaskError(TaskError):
    """A task uses a set-up step, getter or metric that osfleet does not run; the message names it."""
