"""Finite but extreme numbers are refused with the field named, never an overflow or a
NaN downstream (issue: an edge profile with draft_ms_per_token=5e-324 crashed the
timing model; temperature 1e-300 or 1e300 gave NaN in the sampler)."""

from __future__ import annotations

import pytest

from eventspec.shared.contract import convert
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.timing import EdgeCost
from eventspec.shared.contract.types import GenerationSettings
from eventspec.shared.pb.eventspec.v1 import common_pb2


def edge(**kw: float) -> EdgeCost:
    base = dict(draft_prefill_ms=30.0, draft_ms_per_token=20.0, rtt_ms=5.0,
                uplink_bytes_per_s=1e6, acceptance_prior=0.5)
    base.update(kw)
    return EdgeCost(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("field", "value"), [
    ("draft_ms_per_token", 5e-324), ("draft_prefill_ms", 1e300), ("rtt_ms", 1e308),
    ("uplink_bytes_per_s", 1e300), ("draft_ms_per_token", float("nan")),
])
def test_edge_profile_extremes_name_the_field(field: str, value: float) -> None:
    with pytest.raises(InvalidInput, match=f"EdgeCost.{field} must be a finite number in"):
        edge(**{field: value})


@pytest.mark.parametrize("value", [5e-324, 1e-9, 0.5])
def test_a_vanishing_uplink_is_refused_and_zero_still_means_unknown(value: float) -> None:
    """The slow fuzz run sent uplink_bytes_per_s=5e-324: upload time became infinite and
    the plan's int() raised OverflowError (INTERNAL). Below 1 B/s is no measurement."""
    with pytest.raises(InvalidInput, match=r"EdgeCost\.uplink_bytes_per_s must be 0"):
        edge(uplink_bytes_per_s=value)
    assert edge(uplink_bytes_per_s=0.0).uplink_bytes_per_s == 0.0
    assert edge(uplink_bytes_per_s=1.0).uplink_bytes_per_s == 1.0


def test_edge_profile_extremes_from_the_wire() -> None:
    pb = common_pb2.EdgeProfile(draft_prefill_ms=30, draft_ms_per_token=5e-324, rtt_ms=1,
                                uplink_bytes_per_s=0, acceptance_prior=0.5)
    with pytest.raises(InvalidInput, match="draft_ms_per_token"):
        convert.edge_cost_from_pb(pb)


@pytest.mark.parametrize("temperature", [1e-300, 1e300, -1.0, float("inf")])
def test_extreme_temperatures_are_refused(temperature: float) -> None:
    with pytest.raises(InvalidInput, match=r"temperature must be 0 \(greedy\) or in"):
        GenerationSettings(temperature=temperature).validated(512)


@pytest.mark.parametrize("temperature", [0.0, 1e-3, 0.7, 1e3])
def test_sane_temperatures_pass(temperature: float) -> None:
    assert GenerationSettings(temperature=temperature).validated(512).temperature == temperature
