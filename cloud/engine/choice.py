"""Which engine serves the target: the static engine or the HF reference
(``--engine auto|static|hf``), and which flags need the static one."""

from __future__ import annotations

import logging

from eventspec.cloud.engine.static.weights import static_unsupported_reason
from eventspec.cloud.target import TargetModel
from eventspec.shared.contract.errors import InvalidInput

log = logging.getLogger(__name__)


def choose_engine(requested: str, target: TargetModel, batch_invariant: bool = False,
                  fp8: str = "") -> str:
    """``static`` or ``hf``: ``auto`` is static on CUDA (and wherever ``--batch-invariant``
    or an fp8 flag, named by ``fp8``, asks for it); a model the static engine cannot
    serve falls back to the HF reference, with the reason logged, unless one of those
    flags asked for the static engine (then it is an error naming the flag)."""
    flag = "--batch-invariant" if batch_invariant else fp8
    kind = requested
    if kind == "auto":
        kind = "static" if target.device.type == "cuda" or flag else "hf"
    if kind not in ("static", "hf"):
        raise InvalidInput(f"--engine must be auto, static or hf, got {requested!r}")
    if flag and kind != "static":
        raise InvalidInput(f"{flag} needs the static engine (--engine static or auto)")
    if kind == "static":
        reason = static_unsupported_reason(target)
        if reason is not None and flag:
            raise InvalidInput(f"{flag} needs the static engine, which cannot "
                               f"serve {target.model_id}: {reason}")
        if reason is not None:
            log.warning("the static engine cannot serve %s (%s); using the hf engine",
                        target.model_id, reason)
            return "hf"
    log.info("target engine: %s", kind)
    return kind
