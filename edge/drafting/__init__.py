"""Drafting on the edge: the EventGPT draft model, the drafting backends behind one role
(the model itself, the static-KV runtime, a token head, the benchmarks' oracle), one
request's draft cache, the batcher that runs every session in one forward, and the
draft tree."""
