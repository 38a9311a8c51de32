"""The static runtime's slot bookkeeping (``shared/node/static/slot_occupancy.py``): the
checks every call makes before model work, with fixed slots and KV by length."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.batch import StepBatch
from eventspec.shared.node.static.slot_occupancy import SlotOccupancy


def _batch(slots: tuple[int, ...], starts: tuple[int, ...], counts: tuple[int, ...]
           ) -> StepBatch:
    return StepBatch(slots, starts, counts, torch.zeros(sum(counts), dtype=torch.long))


def test_a_step_needs_live_sessions_that_fit_their_room() -> None:
    occ = SlotOccupancy(num_slots=4, max_seq_len=16)
    with pytest.raises(InvalidInput, match="slot 2 holds no prefilled session"):
        occ.check_step(_batch((2,), (5,), (1,)))
    occ.fill([2], [0], [5])
    occ.check_step(_batch((2,), (5,), (3,)))
    with pytest.raises(InvalidInput, match=r"slot 2: tokens \[15, 17\) outside 1..16"):
        occ.check_step(_batch((2,), (15,), (2,)))
    with pytest.raises(InvalidInput, match="names a slot twice"):
        occ.check_step(_batch((2, 2), (5, 5), (1, 1)))
    with pytest.raises(InvalidInput, match=r"token_ids must be \[2\]"):
        occ.check_step(StepBatch((2,), (5,), (2,), torch.zeros(3, dtype=torch.long)))


def test_slots_out_of_range_and_a_released_runtime_fail_their_checks() -> None:
    occ = SlotOccupancy(num_slots=2, max_seq_len=16)
    assert occ.scratch_slot == 2
    with pytest.raises(InvalidInput, match=r"slot 2 outside 0..1"):
        occ.check_runs([2], [0], [3])
    occ.fill([0], [0], [3])
    occ.release()
    assert not occ.is_live(0) and occ.filled(0) == 0
    for check in (lambda: occ.check_slot(0), lambda: occ.check_runs([0], [0], [3]),
                  lambda: occ.reserve(0, 4), lambda: occ.free(0)):
        with pytest.raises(InvalidInput, match="released"):
            check()


def test_by_length_a_slot_has_only_the_run_it_reserved() -> None:
    occ = SlotOccupancy(num_slots=2, max_seq_len=16, kv_positions=40)
    assert occ.scratch_slot == 40 and occ.room(10) == 0
    with pytest.raises(InvalidInput, match="does not fit a slot of 0"):
        occ.check_runs([10], [0], [3])
    occ.reserve(10, 8)
    assert occ.room(10) == 8
    occ.check_runs([10], [0], [7])
    with pytest.raises(InvalidInput, match="does not fit a slot of 8"):
        occ.check_runs([10], [0], [8])
    with pytest.raises(InvalidInput, match="passes the arena's end"):
        occ.reserve(35, 8)
    with pytest.raises(InvalidInput, match=r"1..16 per session"):
        occ.reserve(0, 17)
    occ.free(10)
    assert occ.room(10) == 0


def test_a_failed_step_of_prompt_rows_leaves_no_slot_live() -> None:
    occ = SlotOccupancy(num_slots=4, max_seq_len=16)
    occ.fill([0], [0], [4])
    occ.prompt_written_to(1, 4)  # a copied prefix: continues, but is no session yet
    assert not occ.is_live(1)
    added = occ.open_for_prompt_rows([0, 1])
    assert added == [1] and occ.is_live(1)
    occ.close(added)
    assert occ.is_live(0) and not occ.is_live(1) and occ.filled(1) == 4


@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), min_size=1,
                       max_size=12),
       probe=st.integers(1, 40))
def test_a_chunk_continues_exactly_where_its_slot_ended(pieces: list[tuple[int, int]],
                                                        probe: int) -> None:
    """Fill slots chunk by chunk; a piece is accepted only at its slot's end."""
    occ = SlotOccupancy(num_slots=6, max_seq_len=128)  # 12 pieces of 6 rows fit a slot
    ends: dict[int, int] = {}
    for slot, n in pieces:
        start = ends.get(slot, 0)
        occ.check_runs([slot], [start], [n])
        occ.fill([slot], [start], [n])
        ends[slot] = start + n
    for slot, end in ends.items():
        assert occ.filled(slot) == end and occ.is_live(slot)
        if probe != end:
            with pytest.raises(InvalidInput, match="must continue where the last ended"):
                occ.check_runs([slot], [probe], [1])
