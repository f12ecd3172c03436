"""Logging is configured once, by the command line: ``osfleet --log-level LEVEL`` or ``$OSFLEET_LOG``
(default WARNING). Library modules only ever call ``logging.getLogger(__name__)``."""

from __future__ import annotations

import logging
import os

ENV_VAR = "OSFLEET_LOG"
DEFAULT_LEVEL = "WARNING"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_HANDLER_NAME = "osfleet-stderr"


def configure(level: str | None = None) -> int:
    """Send log records of ``level`` and above (default: ``$OSFLEET_LOG``, else WARNING) to stderr.

    Idempotent: calling it again changes the level but never adds a second handler.
    """
    name = (level or os.environ.get(ENV_VAR) or DEFAULT_LEVEL).strip().upper()
    if name not in LEVELS:
        raise ValueError(f"unknown log level {name!r} (one of {', '.join(LEVELS)})")
    resolved: int = getattr(logging, name)
    root = logging.getLogger()
    if not any(h.get_name() == _HANDLER_NAME for h in root.handlers):
        handler = logging.StreamHandler()
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(handler)
    root.setLevel(resolved)
    return resolved
