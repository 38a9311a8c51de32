"""Refuse an oversize Ask or Open from its bytes, before protobuf parses it.

Why: parsing is not the cheap part of a refusal. An Ask or a Generate ``Open`` whose
generation settings carry 10^6 one-character stop strings is 3 MB, well within the 8 MiB
message cap; refusing it after parsing cost the node's event loop about 13 ms to parse,
20 ms to make a tuple of 10^6 strings and 100 ms to check them, while every other call
on that node waited (issue 38, red-team finding 2: a flood of such requests made other
clients 4.9x slower through the edge and 12.95x against the cloud).

The caps bound the bytes a legitimate field takes: ``MAX_STOP_STRINGS`` strings of
``MAX_STOP_CHARS`` characters in all, a question of ``max_question_chars`` characters, at
most 4 bytes a character in UTF-8. In protobuf's wire format a message field's length
comes before its contents, so walking a request's top-level fields (a handful of
headers) finds an oversize field without reading it. These bounds use this build's
caps and are coarse on purpose: within them, the exact (advertised) caps are checked
after parsing, on a list too short to cost anything.

Bytes the walk cannot read are let through: the parser refuses them in its own words, and
it stops where the walk stopped (both read the fields in order), so an oversize field
after that point costs nothing either; the walk refuses a field as soon as it is past
its bound, before reading further. Groups, which the parser skips in unknown fields, are
followed, so they cannot hide a field from the walk.
"""

from __future__ import annotations

from collections.abc import Iterator

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.types import MAX_STOP_CHARS, MAX_STOP_STRINGS, ServerLimits
from eventspec.shared.pb.eventspec.v1 import edge_pb2, verifier_pb2

#: Field headers the walk reads in one request (its top-level fields, an Open's, and
#: any group's). A protobuf encoder writes each field once (AskRequest has 7, Open 9,
#: EdgeMessage 1); past this the walk would be the attacker's loop, so it refuses.
MAX_FIELDS = 256
#: UTF-8 takes at most this many bytes for one character (a code point).
UTF8_MAX = 4
#: The generation settings' scalars at their widest: four tags, a 10-byte varint for
#: max_new_tokens (a negative int32) and for seed, two 8-byte doubles.
GENERATION_SCALAR_BYTES = 4 + 10 + 8 + 8 + 10

_LENGTH_DELIMITED = 2
_START_GROUP = 3
_END_GROUP = 4
#: Bytes of a fixed64 (1) and a fixed32 (5) value.
_FIXED_SIZE = {1: 8, 5: 4}
_ASK = edge_pb2.AskRequest.DESCRIPTOR.fields_by_name
_OPEN = verifier_pb2.Open.DESCRIPTOR.fields_by_name
_EDGE_OPEN = verifier_pb2.EdgeMessage.DESCRIPTOR.fields_by_name["open"].number


class _Unreadable(Exception):
    """Not protobuf the walk can follow; the parser will say what is wrong."""


def _varint_size(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def generation_wire_bytes(max_strings: int, max_chars: int) -> int:
    """The most bytes a GenerationConfig within the stop caps takes on the wire: each
    string a tag and a length, the characters at 4 bytes each, the scalars at their
    widest."""
    chars = UTF8_MAX * max_chars
    per_string = 1 + _varint_size(chars)
    return max_strings * per_string + chars + GENERATION_SCALAR_BYTES


def question_wire_bytes(max_chars: int) -> int:
    """The most bytes a question within ``max_chars`` characters takes (UTF-8)."""
    return UTF8_MAX * max_chars


GENERATION_BYTES = generation_wire_bytes(MAX_STOP_STRINGS, MAX_STOP_CHARS)
QUESTION_BYTES = question_wire_bytes(ServerLimits().max_question_chars)


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    value = shift = 0
    for i in range(pos, min(pos + 10, len(data))):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i + 1
        shift += 7
    raise _Unreadable


class _Walk:
    """Field headers read so far, at most ``MAX_FIELDS`` in all (groups' included): past
    that the walk would be the attacker's loop, so the request is refused."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.left = MAX_FIELDS

    def fields(self, data: memoryview) -> Iterator[tuple[int, int, int, int]]:
        """(field number, wire type, value start, value end) of each field of ``data``."""
        pos = 0
        while pos < len(data):
            number, wire_type, start, pos = self._field(data, pos)
            if wire_type == _END_GROUP:
                raise _Unreadable  # an end without its start
            yield number, wire_type, start, pos

    def _field(self, data: memoryview, pos: int) -> tuple[int, int, int, int]:
        self.left -= 1
        if self.left < 0:
            raise InvalidInput(
                f"{self.what}: more than {MAX_FIELDS} fields on the wire; a request has a "
                "handful (refused before parsing)")
        key, pos = _varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == _LENGTH_DELIMITED:
            length, pos = _varint(data, pos)
            end = pos + length
        elif wire_type == _START_GROUP:  # valid for unknown fields: the parser skips it
            end = self._group_end(data, pos, number)
        elif wire_type in _FIXED_SIZE:
            end = pos + _FIXED_SIZE[wire_type]
        elif wire_type == 0:
            end = _varint(data, pos)[1]
        elif wire_type == _END_GROUP:
            end = pos
        else:
            raise _Unreadable
        if end > len(data):
            raise _Unreadable
        return number, wire_type, pos, end

    def _group_end(self, data: memoryview, pos: int, number: int) -> int:
        while pos < len(data):
            inner, wire_type, _, pos = self._field(data, pos)
            if wire_type == _END_GROUP:
                if inner != number:
                    raise _Unreadable
                return pos
        raise _Unreadable


class _Sizes:
    """The bytes of a request's question and generation settings so far (protobuf merges
    repeated occurrences of a field, so they count together), refused as soon as one is
    past its bound: what follows cannot make it smaller."""

    def __init__(self, what: str, question: int, generation: int) -> None:
        self.what, self.question, self.generation = what, question, generation
        self.sizes = {question: 0, generation: 0}

    def add(self, walk: _Walk, data: memoryview) -> None:
        for field, wire_type, start, end in walk.fields(data):
            if field in self.sizes and wire_type == _LENGTH_DELIMITED:
                self.sizes[field] += end - start
                self._check()

    def _check(self) -> None:
        generation, question = self.sizes[self.generation], self.sizes[self.question]
        if generation > GENERATION_BYTES:
            raise InvalidInput(
                f"generation.stop: the generation settings take {generation} bytes, more "
                f"than {MAX_STOP_STRINGS} stop strings of {MAX_STOP_CHARS} characters in all "
                "can (GetServerInfo.limits.max_stop_strings, max_stop_chars); refused before "
                "parsing")
        if question > QUESTION_BYTES:
            raise InvalidInput(
                f"{self.what}.question: {question} bytes, more than "
                f"{ServerLimits().max_question_chars} characters can take "
                "(GetServerInfo.limits.max_question_chars); refused before parsing")


def check_ask_bytes(data: bytes) -> None:
    """Refuse a serialized AskRequest whose stop strings or question are past any cap,
    naming the field, without parsing it."""
    sizes = _Sizes("AskRequest", _ASK["question"].number, _ASK["generation"].number)
    try:
        sizes.add(_Walk("AskRequest"), memoryview(data))
    except _Unreadable:
        return


def check_edge_message_bytes(data: bytes) -> None:
    """Refuse a serialized EdgeMessage whose Open carries stop strings or a question
    past any cap, naming the field, without parsing it. Other messages pass."""
    walk = _Walk("EdgeMessage")
    sizes = _Sizes("Open", _OPEN["question"].number, _OPEN["generation"].number)
    try:
        for field, wire_type, start, end in walk.fields(memoryview(data)):
            if field == _EDGE_OPEN and wire_type == _LENGTH_DELIMITED:
                sizes.add(walk, memoryview(data)[start:end])
    except _Unreadable:
        return
