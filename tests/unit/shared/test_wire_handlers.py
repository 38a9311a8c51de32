"""A wrapped behaviour always closes its call's request stream and drops an abort's frames
(``shared/wire/handlers.py``), even when ``around`` refuses the call before the behaviour
runs, as the refusal budget does at HEADERS: a stream left unread kept the call's state
and its buffered request alive in ``grpc.aio`` (issue 38)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from grpc import aio

from eventspec.shared.wire.handlers import close_request_stream, wrap_behaviour


class _Requests:
    """A request stream that records whether it was closed."""

    def __init__(self) -> None:
        self.closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[bytes]:
        try:
            yield b"request"
        finally:
            self.closed = True


def _refusing(_context: Any) -> contextlib.AbstractAsyncContextManager[None]:
    @contextlib.asynccontextmanager
    async def around() -> AsyncIterator[None]:
        try:
            raise ValueError("the frame that held the request")
        except ValueError:
            raise aio.AbortError() from None
        yield  # pragma: no cover

    return around()


class _Stream:
    """``grpc.aio``'s receiver: one generator for the call, so closing it is seen."""

    def __init__(self) -> None:
        self.requests = _Requests()
        self._gen = self.requests.__aiter__()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._gen


async def test_a_call_refused_before_its_behaviour_still_closes_its_stream() -> None:
    ran: list[bool] = []

    async def behaviour(requests: Any, _context: Any) -> bytes:
        ran.append(True)
        return b""

    stream = _Stream()
    await stream._gen.__anext__()  # the gate had read the first message
    with pytest.raises(aio.AbortError) as err:
        await wrap_behaviour(behaviour, _refusing)(stream, None)
    assert not ran and stream.requests.closed
    assert err.value.__context__ is None  # the exception it was raised while handling
    frames, tb = [], err.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert "around" not in frames, frames  # the refusing frame was dropped


async def test_a_generator_behaviour_refused_closes_its_stream_too() -> None:
    async def behaviour(requests: Any, _context: Any) -> AsyncIterator[bytes]:
        yield b""  # pragma: no cover

    stream = _Stream()
    await stream._gen.__anext__()
    with pytest.raises(aio.AbortError):
        async for _ in wrap_behaviour(behaviour, _refusing)(stream, None):
            pass  # pragma: no cover
    assert stream.requests.closed


async def test_a_single_message_request_is_left_alone() -> None:
    await close_request_stream(b"a unary request")  # nothing to close, nothing raised
