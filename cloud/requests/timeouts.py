"""How long a Generate stream may wait on its edge before the verifier gives up.

A stream that never sends Open, or declares aligned features and then trickles them,
holds an RPC slot (and, after Open, a session and a KV slot) while doing nothing.
These bounds end such streams with DEADLINE_EXCEEDED and a message that names the
bound, so a slow or hostile caller cannot keep capacity from everyone else.
"""

from __future__ import annotations

import math

#: Seconds from the start of a Generate call to its Open message.
FIRST_MESSAGE_TIMEOUT_S = 10.0
#: Seconds every aligned-features upload gets before its size is counted: the
#: handshake, a few round trips and scheduling noise.
FEATURES_BASE_TIMEOUT_S = 5.0
#: The uplink assumed when the edge reports none (target-only requests carry no
#: profile; a fresh edge has not measured yet): 1 MiB/s, a slow cellular link.
FLOOR_UPLINK_BYTES_PER_S = float(1 << 20)
#: The measured uplink is an average; an upload may run this many times slower.
UPLINK_SLACK = 4.0
#: No aligned-features upload waits longer than this, whatever it declares.
FEATURES_MAX_TIMEOUT_S = 60.0


def features_timeout_s(
    declared_bytes: int,
    uplink_bytes_per_s: float,
    *,
    base_s: float = FEATURES_BASE_TIMEOUT_S,
    max_s: float = FEATURES_MAX_TIMEOUT_S,
) -> float:
    """Seconds to wait for ``declared_bytes`` of features over the edge's measured uplink.

    ``base_s + UPLINK_SLACK * declared_bytes / uplink``, where an unknown (<= 0 or not
    finite) uplink counts as ``FLOOR_UPLINK_BYTES_PER_S``, capped at ``max_s``: a large
    tensor on a slow link gets the time it needs, a small one cannot hold its slot for
    the worst case, and no declared rate holds it longer than ``max_s``.
    """
    rate = uplink_bytes_per_s
    if not (math.isfinite(rate) and rate > 0):
        rate = FLOOR_UPLINK_BYTES_PER_S
    return min(max_s, base_s + UPLINK_SLACK * max(declared_bytes, 0) / rate)
