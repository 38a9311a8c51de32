"""Receiving and checking a Generate stream's Open, before anything is admitted.

The checks here need the server's geometry and limits (the wire-free ones are in
``eventspec.shared.contract.convert_verifier.open_from_pb``): a request that fails them
is refused before it takes a session, a KV slot or any model work. Kept apart from the
stream's flow (``eventspec.cloud.requests.generation``) because they are the verifier's input
rules, read on their own.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

from eventspec.cloud.runtime import VerifierRuntime
from eventspec.shared.contract.convert_verifier import EdgeInbound
from eventspec.shared.contract.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidInput,
    ResourceExhausted,
)
from eventspec.shared.contract.types import AlignedSpec, OpenRequest, ServerInfo
from eventspec.shared.node.imageproc import frame_size
from eventspec.shared.node.logsafe import safe_request_id


async def first_message(rt: VerifierRuntime, messages: AsyncIterator[EdgeInbound]) -> OpenRequest:
    """The stream's Open, within ``first_message_timeout_s`` of the call's start."""
    timeout = rt.settings.first_message_timeout_s
    try:
        first = await asyncio.wait_for(anext(messages), timeout=timeout)
    except StopAsyncIteration:
        raise InvalidInput("the Generate stream ended before its Open message") from None
    except TimeoutError:
        raise DeadlineExceeded(
            f"no Open message within {timeout:g} s of the Generate call (the first-message "
            "timeout); send Open first"
        ) from None
    if not isinstance(first, OpenRequest):
        raise FailedPrecondition(f"the first message must be Open, got {type(first).__name__}")
    return first


def validate_open(open_req: OpenRequest, rt: VerifierRuntime) -> OpenRequest:
    """Check what needs the server's geometry and limits; return with settings filled."""
    if not open_req.question.strip():
        raise InvalidInput("question is empty")
    cap = rt.info.limits.max_question_chars
    if len(open_req.question) > cap:
        raise InvalidInput(
            f"Open.question: {len(open_req.question)} characters exceed the cap of {cap} "
            "(GetServerInfo.limits.max_question_chars)"
        )
    info = rt.info
    settings = open_req.generation.validated(info.limits.max_new_tokens,
                                             max_stop_strings=info.limits.max_stop_strings,
                                             max_stop_chars=info.limits.max_stop_chars)
    if open_req.frames is not None:
        _check_frames(open_req.frames, info)
    if open_req.aligned is not None:
        _check_aligned(open_req.aligned, info)
    return OpenRequest(
        request_id=safe_request_id(open_req.request_id),
        question=open_req.question,
        generation=settings,
        frames=open_req.frames,
        aligned=open_req.aligned,
        edge_cost=open_req.edge_cost,
        deadline_ms=open_req.deadline_ms,
        speculative=open_req.speculative,
        timeline=open_req.timeline,
    )


def _check_frames(frames: tuple[bytes, ...], info: ServerInfo) -> None:
    """As many frames as the target's clip has, each within the byte cap and with a
    header whose size the preprocessing accepts (only the header is read here)."""
    n = len(frames)
    if n != info.geometry.num_frames:
        raise InvalidInput(
            f"frames clip has {n} frames; this verifier needs exactly "
            f"{info.geometry.num_frames}"
        )
    for i, frame in enumerate(frames):
        if len(frame) > info.limits.max_frame_bytes:
            raise ResourceExhausted(
                f"frame {i} is {len(frame)} bytes, over the cap of "
                f"{info.limits.max_frame_bytes}"
            )
        try:
            frame_size(frame)  # the header alone: pixel count and aspect ratio
        except InvalidInput as exc:
            raise InvalidInput(f"frame {i}: {exc.message}") from exc


def _check_aligned(aligned: AlignedSpec, info: ServerInfo) -> None:
    """Declared aligned features of the target's feature shape, in a dtype it reads."""
    if tuple(aligned.shape) != info.geometry.feature_shape:
        raise InvalidInput(
            f"Open declares aligned features of shape {list(aligned.shape)}, "
            f"but this verifier expects {list(info.geometry.feature_shape)}"
        )
    if aligned.dtype not in ("float32", "float16", "bfloat16", "int8"):
        raise InvalidInput(
            f"aligned features must be float32/float16/bfloat16/int8, "
            f"not {aligned.dtype}"
        )


def clamp_to_context(open_req: OpenRequest, prompt_len: int, max_seq_len: int) -> OpenRequest:
    """``open_req`` with ``max_new_tokens`` no larger than the positions a KV slot has
    left after the prompt, so the Plan states the cap the answer will really meet."""
    room = max_seq_len - prompt_len
    if room < 1:
        raise InvalidInput(
            f"the prompt takes {prompt_len} of this verifier's {max_seq_len} positions per "
            "request, leaving none for the answer; shorten Open.question"
        )
    settings = open_req.generation
    if settings.max_new_tokens <= room:
        return open_req
    return dataclasses.replace(
        open_req, generation=dataclasses.replace(settings, max_new_tokens=room)
    )
