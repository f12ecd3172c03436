"""Every metric by its OSWorld name, filled once from its families by the package (``metrics/__init__.py``).

A metric that scores with others (``compare_archive`` scores each member of an archive with the metric of its
file type) looks them up here: the package imports every family, so a family cannot import the package.
"""

from __future__ import annotations

from osfleet.tasks.osworld_format.metrics.common import Metric

METRICS: dict[str, Metric] = {}
