"""The static-KV runtime both nodes run their LLaMA decoder on (see :mod:`.runtime`).

:mod:`.runtime` holds the KV slots and the forward passes, :mod:`.weights` lifts a
Hugging Face decoder's weights, :mod:`.layers`, :mod:`.attention` and :mod:`.kernels` do
the arithmetic, :mod:`.buckets` and :mod:`.staging` the captured shapes and their index
buffers, :mod:`.batch` the step's input. See docs/engine.md.
"""
