"""Refusing an oversize Ask or Open from its bytes, before protobuf parses them (issue 38,
red-team finding 2): the walk reads a handful of field headers, never the stop strings
themselves, and lets through everything within the caps (and anything it cannot read,
for the parser to refuse with its own words)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from eventspec.shared.contract import convert, convert_ask, convert_verifier, types, wire_bounds
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.types import (
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    AskSpec,
    GenerationSettings,
    OpenRequest,
    ServerLimits,
)
from eventspec.shared.pb.eventspec.v1 import common_pb2, edge_pb2, verifier_pb2

#: The most a legitimate request carries: every cap met with 4-byte UTF-8 characters.
WIDE = "\U0001f600"
FULL_STOP = tuple(WIDE * (MAX_STOP_CHARS // MAX_STOP_STRINGS) for _ in range(MAX_STOP_STRINGS))
FULL_QUESTION = WIDE * ServerLimits().max_question_chars
MILLION = tuple("abcdefgh"[i % 8] for i in range(1_000_000))
Check = Callable[[bytes], None]
Build = Callable[..., bytes]


def _generation(stop: tuple[str, ...]) -> GenerationSettings:
    """Every scalar at its widest on the wire, too."""
    return GenerationSettings(max_new_tokens=2**31 - 1, temperature=0.5, top_p=0.9,
                              seed=2**64 - 1, stop=stop)


def ask_bytes(question: str = "What is moving?", stop: tuple[str, ...] = ()) -> bytes:
    spec = AskSpec(question, generation=_generation(stop), latest_ms=1000, timeline=True)
    return convert_ask.ask_spec_to_pb(spec).SerializeToString()


def open_bytes(question: str = "What is moving?", stop: tuple[str, ...] = ()) -> bytes:
    req = OpenRequest(request_id="r" * 64, question=question, generation=_generation(stop),
                      frames=(b"\xff" * 4096,) * 8, deadline_ms=60_000)
    return verifier_pb2.EdgeMessage(open=convert_verifier.open_to_pb(req)).SerializeToString()


@pytest.mark.parametrize("check, build", [(wire_bounds.check_ask_bytes, ask_bytes),
                                          (wire_bounds.check_edge_message_bytes, open_bytes)],
                         ids=["ask", "open"])
def test_requests_at_every_cap_pass(check: Check, build: Build) -> None:
    check(build(FULL_QUESTION, FULL_STOP))
    check(build())


@pytest.mark.parametrize("check, build", [(wire_bounds.check_ask_bytes, ask_bytes),
                                          (wire_bounds.check_edge_message_bytes, open_bytes)],
                         ids=["ask", "open"])
def test_a_million_stop_strings_are_refused_naming_the_field(check: Check, build: Build) -> None:
    with pytest.raises(InvalidInput) as err:
        check(build(stop=MILLION))
    assert err.value.message.startswith("generation.stop:"), err.value.message
    assert "stop strings" in err.value.message and "before parsing" in err.value.message


@pytest.mark.parametrize("check, build", [(wire_bounds.check_ask_bytes, ask_bytes),
                                          (wire_bounds.check_edge_message_bytes, open_bytes)],
                         ids=["ask", "open"])
def test_a_question_beyond_any_cap_is_refused(check: Check, build: Build) -> None:
    with pytest.raises(InvalidInput) as err:
        check(build(question="x" * (4 * ServerLimits().max_question_chars + 1)))
    assert "question" in err.value.message and "max_question_chars" in err.value.message


def test_the_walk_never_reads_the_stop_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The field headers it reads are a handful, whatever the list's length: the cost of
    a refusal does not grow with what the attacker sent."""
    reads: list[int] = []
    real = wire_bounds._varint

    def counting(data: memoryview, pos: int) -> tuple[int, int]:
        reads.append(pos)
        return real(data, pos)

    monkeypatch.setattr(wire_bounds, "_varint", counting)
    with pytest.raises(InvalidInput):
        wire_bounds.check_edge_message_bytes(open_bytes(stop=MILLION))
    assert len(reads) < 40, len(reads)


def test_a_field_split_into_many_occurrences_is_summed() -> None:
    """Protobuf merges repeated occurrences of a message field, so each piece may be
    small while the whole is not."""
    piece = common_pb2.GenerationConfig(stop=["s"] * 1000).SerializeToString()
    field = edge_pb2.AskRequest(generation=common_pb2.GenerationConfig(stop=["s"]))
    header = field.SerializeToString()[:1]  # the generation field's tag
    data = b"".join(header + _varint_bytes(len(piece)) + piece for _ in range(5))
    assert len(edge_pb2.AskRequest.FromString(data).generation.stop) == 5000
    with pytest.raises(InvalidInput, match=r"generation\.stop"):
        wire_bounds.check_ask_bytes(data)


def test_too_many_fields_are_refused() -> None:
    data = edge_pb2.AskRequest(jpeg_quality=1).SerializeToString() * (wire_bounds.MAX_FIELDS + 1)
    with pytest.raises(InvalidInput, match="fields"):
        wire_bounds.check_ask_bytes(data)


def test_a_group_cannot_hide_the_stop_strings() -> None:
    """The parser skips an unknown field of the group wire type, so the walk must too:
    giving up on it would let the stop strings behind it through to the parser."""
    group = b"\x9b\x06" + b"\xa0\x06\x01" + b"\x9c\x06"  # field 99: start, a varint, end
    data = group + ask_bytes(stop=MILLION)
    assert len(edge_pb2.AskRequest.FromString(data).generation.stop) == len(MILLION)
    with pytest.raises(InvalidInput, match=r"generation\.stop"):
        wire_bounds.check_ask_bytes(data)


def test_an_oversize_field_is_refused_before_an_unreadable_tail() -> None:
    """The parser would read the stop strings, then fail on the tail: the walk refuses
    them first instead of leaving the whole message to it."""
    with pytest.raises(InvalidInput, match=r"generation\.stop"):
        wire_bounds.check_ask_bytes(ask_bytes(stop=MILLION) + b"\x0a\x7f")
    with pytest.raises(InvalidInput, match=r"generation\.stop"):
        wire_bounds.check_edge_message_bytes(open_bytes(stop=MILLION) + b"\xff" * 11)


@pytest.mark.parametrize("data", [b"\x0a\x7f\x01\x02", b"\xff" * 12, b"\x0b", b"\x0c",
                                  b"\x0b\x14", b"\x0f", b""],
                         ids=["short", "long-varint", "open-group", "lone-end-group",
                              "wrong-end-group", "wire-type-7", "empty"])
def test_bytes_it_cannot_read_are_left_to_the_parser(data: bytes) -> None:
    wire_bounds.check_ask_bytes(data)
    wire_bounds.check_edge_message_bytes(data)


def test_other_edge_messages_pass() -> None:
    drafts = verifier_pb2.EdgeMessage(drafts=verifier_pb2.Drafts(base=3, token_ids=[1] * 5000))
    wire_bounds.check_edge_message_bytes(drafts.SerializeToString())


def test_the_bound_holds_the_caps() -> None:
    """Within the caps always fits, whatever the characters; beyond the bound is beyond
    the caps (or not what a protobuf encoder writes)."""
    within = convert.generation_to_pb(_generation(FULL_STOP)).ByteSize()
    assert within <= wire_bounds.generation_wire_bytes(MAX_STOP_STRINGS, MAX_STOP_CHARS)


def _varint_bytes(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


class _Unread(tuple[str, ...]):
    """A stop list that fails the test if anything iterates it."""

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("the stop strings were read before their count was checked")


def test_check_stop_counts_before_reading_the_strings() -> None:
    """A list past the count cap costs O(1) to refuse: no pass over attacker data first."""
    many = _Unread(("",) * 1000)
    with pytest.raises(InvalidInput, match="1000 stop strings exceed the cap of 16"):
        types.check_stop(many, MAX_STOP_STRINGS, MAX_STOP_CHARS)
