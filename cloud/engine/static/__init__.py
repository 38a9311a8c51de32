"""The static-KV engine: preallocated KV slots, bucketed shapes and CUDA graphs.

:mod:`.engine` is the :class:`~eventspec.cloud.engine.base.Engine` itself; :mod:`.build`
sizes and allocates it, :mod:`.weights` lifts a Hugging Face model's weights into
:mod:`.layers`, :mod:`.attention` and :mod:`.kernels` do the arithmetic,
:mod:`.buckets` picks the captured shapes and :mod:`.staging` fills their index arrays.
See docs/engine.md.
"""
