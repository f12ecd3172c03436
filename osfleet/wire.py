"""Types for values that arrive as JSON in requests.

Request models are strict (a ``true`` or ``"1"`` is not a number), but JSON Schema counts ``1.0`` as an
integer, so an integer field takes an integral float too: the server accepts exactly what its schema does.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(_integral)]
