"""Types for values that arrive as JSON in requests.

Request models are strict (a ``true`` or ``"1"`` is not a number), but JSON Schema counts ``1.0`` as an
integer, so an integer field takes an integral float too: the server accepts exactly what its schema does.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field


def integral(value: Any) -> Any:
    """An integral float as the int it is; anything else unchanged (the strict int check then judges it)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(integral)]
# Bounds of an optional JsonInt go inside, before the validator: ``JsonInt | None = Field(ge=1)`` would reach
# the JSON Schema as the non-standard keywords ge/le, which schema tools ignore (and then send 0).
# e.g. ``Annotated[int, Field(ge=1, le=100), BeforeValidator(integral)] | None``

ImageFormat = Literal["png", "jpeg", "webp"]
"""How a screen is encoded for a client (an observation, a ``screenshot`` action's image)."""
Quality = Annotated[int, Field(ge=1, le=100), BeforeValidator(integral)]
"""JPEG/WebP quality, 1 (smallest) to 100."""
