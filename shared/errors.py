"""Domain exceptions that carry a gRPC status code.

Library code raises these; one server interceptor (``shared.interceptors``) maps
them onto gRPC statuses for unary and streaming RPCs alike, so servicers stay thin
and the pure logic can be tested without a network.
"""

from __future__ import annotations

import grpc


class EventSpecError(Exception):
    """Base class: a clear message plus the gRPC status it maps to."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(EventSpecError):
    """The caller sent something malformed: shapes, dtypes, ids, NaNs, files."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class FailedPrecondition(EventSpecError):
    """The request is well-formed but out of order (e.g. a message before ``Open``)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(EventSpecError):
    """A configured cap was hit: sessions, payload size, queue depth."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class NotFound(EventSpecError):
    """An unknown session, model or file."""

    code = grpc.StatusCode.NOT_FOUND


class Unavailable(EventSpecError):
    """A peer (usually the cloud) cannot be reached, or the server is shutting down."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(EventSpecError):
    """The request's deadline passed before it finished."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(EventSpecError):
    """The caller cancelled the request."""

    code = grpc.StatusCode.CANCELLED


class CodecError(InvalidInput):
    """A tensor stream was malformed (unknown dtype, bad checksum, missing chunk...)."""
