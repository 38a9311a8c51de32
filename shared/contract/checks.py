"""Validation of numbers in profiles, plans and estimators, with messages that name the field.

Cost profiles arrive from the other node; a NaN, a negative time or a probability above 1
must be refused with a message that says which field of which object was wrong.
"""

from __future__ import annotations

import math

from eventspec.shared.contract.errors import InvalidInput


def check_finite_nonneg(owner: str, field: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{owner}.{field} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise InvalidInput(f"{owner}.{field} must be finite, got {value!r}")
    if value < 0:
        raise InvalidInput(f"{owner}.{field} must be >= 0, got {value!r}")


def check_positive(owner: str, field: str, value: float) -> None:
    check_finite_nonneg(owner, field, value)
    if value <= 0:
        raise InvalidInput(f"{owner}.{field} must be > 0, got {value!r}")


def check_int(owner: str, field: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{owner}.{field} must be an int, got {value!r}")
    if value < minimum:
        raise InvalidInput(f"{owner}.{field} must be >= {minimum}, got {value}")


def check_probability(owner: str, field: str, value: float) -> None:
    check_finite_nonneg(owner, field, value)
    if value > 1:
        raise InvalidInput(f"{owner}.{field} must be in [0, 1], got {value!r}")


def check_range(owner: str, field: str, value: float, low: float, high: float) -> None:
    """A finite number in [low, high]: the physically sensible span of a measured cost or
    rate. Extreme but finite values (5e-324 ms per token) would otherwise overflow the
    arithmetic that uses them."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{owner}.{field} must be a number, got {value!r}")
    if not math.isfinite(value) or not low <= value <= high:
        raise InvalidInput(
            f"{owner}.{field} must be a finite number in [{low:g}, {high:g}], got {value!r}"
        )
