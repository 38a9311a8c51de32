"""Domain exceptions with a transport-neutral error code.

Library code raises these. The code names a gRPC-style status, but this module does
not import grpc: the mapping onto ``grpc.StatusCode`` lives with the server
interceptor and the client stubs (``eventspec.shared.wire.status``), so the pure logic (codec,
timing, sessions) loads and tests without a network stack.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    """What went wrong, in the vocabulary of gRPC status codes (same names)."""

    OK = "OK"
    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"
    DATA_LOSS = "DATA_LOSS"
    UNAUTHENTICATED = "UNAUTHENTICATED"


class EventSpecError(Exception):
    """Base class: a clear message plus the status code it maps to."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidInput(EventSpecError):
    """The caller sent something malformed: shapes, dtypes, ids, NaNs, files."""

    code = ErrorCode.INVALID_ARGUMENT


class FailedPrecondition(EventSpecError):
    """The request is well-formed but out of order (e.g. a message before ``Open``)."""

    code = ErrorCode.FAILED_PRECONDITION


class ResourceExhausted(EventSpecError):
    """A configured cap was hit: sessions, payload size, queue depth."""

    code = ErrorCode.RESOURCE_EXHAUSTED


class NotFound(EventSpecError):
    """An unknown session, model or file."""

    code = ErrorCode.NOT_FOUND


class Unavailable(EventSpecError):
    """A peer (usually the cloud) cannot be reached, or the server is shutting down."""

    code = ErrorCode.UNAVAILABLE


class WarmingUp(Unavailable):
    """The server is up but not ready yet (loading a model, calibrating); ``phase`` says
    what it is doing, so a caller can wait and show progress instead of failing."""

    def __init__(self, phase: str, message: str | None = None) -> None:
        super().__init__(message or f"the server is still warming up ({phase}); retry when "
                                    "its health is SERVING")
        self.phase = phase


class DeadlineExceeded(EventSpecError):
    """The request's deadline passed before it finished."""

    code = ErrorCode.DEADLINE_EXCEEDED


class Cancelled(EventSpecError):
    """The caller cancelled the request."""

    code = ErrorCode.CANCELLED


class Unauthenticated(EventSpecError):
    """No valid credentials were presented."""

    code = ErrorCode.UNAUTHENTICATED


class PermissionDenied(EventSpecError):
    """The caller is authenticated but not allowed to do this."""

    code = ErrorCode.PERMISSION_DENIED


class CodecError(InvalidInput):
    """A tensor stream was malformed (unknown dtype, bad checksum, missing chunk...)."""
