"""``--prefill-dtype``'s values, without torch (the cloud's settings import this before
any model is loaded; :mod:`.fp8` is what "fp8" runs)."""

from __future__ import annotations

from typing import Final

from eventspec.shared.contract.errors import InvalidInput

#: "model": prefill in the model's dtype; "fp8": E4M3 GEMMs (:mod:`.fp8`).
PREFILL_DTYPES: Final[tuple[str, ...]] = ("model", "fp8")


def check_prefill_dtype(value: str) -> str:
    """``value`` if ``--prefill-dtype`` takes it, else InvalidInput naming the flag."""
    if value not in PREFILL_DTYPES:
        raise InvalidInput(f"--prefill-dtype must be one of {', '.join(PREFILL_DTYPES)}, "
                           f"got {value!r}")
    return value
