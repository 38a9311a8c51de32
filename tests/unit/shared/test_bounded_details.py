"""Status messages are bounded (issue 38, red-team finding 8): any message fits the
limit give or take the marker, keeps its start (the field's name) and its end, and a
short one is untouched."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from eventspec.shared.wire.interceptors import bounded_details


@given(text=st.text(max_size=5000), limit=st.integers(64, 2048))
def test_any_message_fits_and_keeps_its_ends(text: str, limit: int) -> None:
    out = bounded_details(text, limit)
    if len(text) <= limit:
        assert out == text
        return
    assert len(out) <= limit
    keep = limit // 2 - 20
    assert out.startswith(text[:keep]) and out.endswith(text[-keep:])
    assert f"({len(text) - 2 * keep} characters cut)" in out
