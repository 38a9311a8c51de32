"""The features timeout grows with the declared size and shrinks with the uplink."""

from __future__ import annotations

import math

import pytest

from eventspec.cloud.requests.timeouts import (
    FEATURES_BASE_TIMEOUT_S,
    FEATURES_MAX_TIMEOUT_S,
    FLOOR_UPLINK_BYTES_PER_S,
    UPLINK_SLACK,
    features_timeout_s,
)

MIB = 1 << 20


def test_base_plus_slack_times_the_upload_at_the_measured_uplink() -> None:
    # 7B aligned features in fp16: 8 x 256 x 1024 x 2 bytes = 4 MiB, over 2 MiB/s.
    assert features_timeout_s(4 * MIB, 2 * MIB) == pytest.approx(
        FEATURES_BASE_TIMEOUT_S + UPLINK_SLACK * 2.0)
    assert features_timeout_s(8 * MIB, 2 * MIB) > features_timeout_s(4 * MIB, 2 * MIB)
    assert features_timeout_s(4 * MIB, 4 * MIB) < features_timeout_s(4 * MIB, 2 * MIB)


@pytest.mark.parametrize("uplink", [0.0, -5.0, math.nan, math.inf])
def test_an_unknown_uplink_counts_as_the_floor(uplink: float) -> None:
    expected = FEATURES_BASE_TIMEOUT_S + UPLINK_SLACK * MIB / FLOOR_UPLINK_BYTES_PER_S
    assert features_timeout_s(MIB, uplink) == pytest.approx(expected)


def test_no_declared_rate_holds_the_slot_past_the_cap() -> None:
    assert features_timeout_s(64 * MIB, 1.0) == FEATURES_MAX_TIMEOUT_S
    assert features_timeout_s(64 * MIB, 1e-300, max_s=7.0) == 7.0
