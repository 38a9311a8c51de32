"""Generate streams, one per request: receiving the Open and the edge's messages, the
stream end to end, its timeouts, re-planning, log line and timeline, and admission (the
session registry, its capacity and the KV queue)."""
