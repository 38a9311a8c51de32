"""The server's startup heap kept out of the garbage collector's oldest generation.

Why: the cyclic collector's full (generation-2) pass stops the world and walks every
tracked object, and a warm verifier holds hundreds of thousands that live as long as it
does (the model's modules, the tokenizer, the engine's graphs and buffers, gRPC's
machinery). Each such pass is a pause in the engine loop, so it lands in some answer's
inter-token latency. ``gc.freeze()`` moves everything alive at the end of warm-up into
a permanent generation the collector never walks; what the loop allocates later is still
collected. In a warm verifier a full pass took 130 ms over 393,058 objects, and 0.2 ms
over 1,170 with the heap frozen (``benchmarks/results/gc-freeze-cpu.json``, toy target on
a 2-core machine). vLLM freezes its engine core after start-up for this reason (P99 ITL,
PRs 14902 and 24008), and SGLang does after warm-up (PR 34999).

Freezing is process-wide, so with several servers in one process (tests, benchmarks)
each start freezes again (taking in its own heap) and the last to stop unfreezes:
objects it held become collectable again.
"""

from __future__ import annotations

import gc

from eventspec.cloud.process.process_wide import HeldSetting

_setting = HeldSetting("the garbage collector's freeze")


def _freeze(first: bool) -> None:
    gc.collect()
    gc.freeze()


def hold() -> None:
    """A server is warm: collect once, then freeze everything alive now."""
    _setting.hold(_freeze)


def let_go() -> None:
    """A server that held the freeze stopped; the last one unfreezes."""
    _setting.let_go(gc.unfreeze)


def holders() -> int:
    """Servers holding the freeze now."""
    return _setting.holders
