"""The dashboard at ``/ui`` on the host agent and the fleet gateway (routes.py; what it shows: backend.py)."""

from __future__ import annotations

from osfleet.ui.backend import Backend, FleetBackend, LocalBackend
from osfleet.ui.routes import install

__all__ = ["Backend", "FleetBackend", "LocalBackend", "install"]
