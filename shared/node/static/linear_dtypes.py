"""``--prefill-dtype`` (and the engine's ``step_dtype``): what a prompt's and a step's
linear layers run in, without torch (the cloud's settings import this before any model is loaded;
:mod:`.fp8` is what "fp8" runs)."""

from __future__ import annotations

from typing import Final

from eventspec.shared.contract.errors import InvalidInput

#: "model": the model's dtype; "fp8": E4M3 GEMMs on fp8 copies of the weights.
LINEAR_DTYPES: Final[tuple[str, ...]] = ("model", "fp8")


def check_linear_dtype(flag: str, value: str) -> str:
    """``value`` if ``flag`` takes it, else InvalidInput naming the flag."""
    if value not in LINEAR_DTYPES:
        raise InvalidInput(f"{flag} must be one of {', '.join(LINEAR_DTYPES)}, got {value!r}")
    return value
