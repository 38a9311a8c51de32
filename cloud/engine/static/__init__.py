"""The cloud's static engine: Video-LLaVA's language model on the shared static-KV
runtime (:mod:`eventspec.shared.node.static`).

:mod:`.engine` is the :class:`~eventspec.cloud.engine.base.BatchedEngine` itself (the
runtime plus Video-LLaVA's prefill), :mod:`.weights` hands the target's decoder to the
runtime, and :mod:`.build` sizes the KV slots and captures the graphs.
"""
