"""Every metric by its OSWorld name, filled once by the package (``osfleet.tasks.evaluators``) from its families.

A metric that scores with others (``compare_archive`` scores each member of an archive with the metric of its
file type) looks them up here: the package imports every family, so a family cannot import the package.
"""

from __future__ import annotations

from osfleet.tasks.evaluators.common import Metric

METRICS: dict[str, Metric] = {}
