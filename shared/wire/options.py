"""gRPC channel and server options that both ends agree on.

Keepalive: clients ping every ``KEEPALIVE_TIME_MS``; servers permit pings that often
(``min_ping_interval_without_data_ms``), otherwise clients get ``too_many_pings``. A peer
that stops answering pings (a frozen process still holds its TCP connection) is declared
dead after at most ``KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS`` (15 s), which ends its
streams with UNAVAILABLE so the edge fails over.

Reconnect backoff: gRPC's default grows to 120 s, so an edge went on failing for 23-38 s
after its cloud came back. Clients here retry a lost connection within
``MAX_RECONNECT_BACKOFF_MS`` (1 s).

Message limits are explicit on both sides; large tensors are always chunked below them.

Streams per connection are capped at ``MAX_STREAMS_PER_CONNECTION`` (HTTP/2's
``MAX_CONCURRENT_STREAMS``, grpc core's ``grpc.max_concurrent_streams``): with the
first-message bound of ``eventspec.shared.wire.gate`` it bounds what one connection of stalled
streams can hold.
"""

from __future__ import annotations

KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000
INITIAL_RECONNECT_BACKOFF_MS = 100
MAX_RECONNECT_BACKOFF_MS = 1_000
DEFAULT_MAX_MESSAGE_BYTES = 8 << 20
#: The largest request a server whose methods all take small requests accepts (the
#: edge: an Ask within every cap is under 25 KiB). gRPC refuses a larger message from its
#: length prefix with RESOURCE_EXHAUSTED, before any of it reaches Python: a flood of
#: multi-megabyte requests then costs the node's event loop almost nothing (issue 38).
SMALL_REQUEST_BYTES = 1 << 20
#: HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS a server grants each connection: one client
#: connection cannot hold more streams than this. gRPC shares one connection among a
#: process's channels to the same address, so it leaves room for a busy client process
#: (an edge's link, a benchmark's many callers); a stalled stream costs only its
#: first-message bound.
MAX_STREAMS_PER_CONNECTION = 256


def server_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                   max_receive_bytes: int | None = None) -> list[tuple[str, int]]:
    """Options for ``grpc.aio.server``; requests are capped at ``max_receive_bytes``
    (default ``max_message_bytes``)."""
    return [
        ("grpc.max_receive_message_length", max_receive_bytes or max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        # Off, so a second server on a busy port fails to start instead of sharing it.
        ("grpc.so_reuseport", 0),
    ]


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Options for ``grpc.aio.insecure_channel`` / ``secure_channel``."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Not grpc.min_reconnect_backoff_ms: gRPC also takes it as the minimum connect
        # timeout, and 100 ms would fail a TLS handshake over a slow link.
        ("grpc.initial_reconnect_backoff_ms", INITIAL_RECONNECT_BACKOFF_MS),
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    ]
