"""The one mapping between ``eventspec.shared.contract.errors.ErrorCode`` and
``grpc.StatusCode``."""

from __future__ import annotations

import grpc

from eventspec.shared.contract.errors import ErrorCode


def to_grpc(code: ErrorCode) -> grpc.StatusCode:
    """The gRPC status with the same name as ``code``."""
    return grpc.StatusCode[code.name]


def from_grpc(code: grpc.StatusCode | None) -> ErrorCode:
    """The domain code for a gRPC status (``None``, a broken call, is UNAVAILABLE)."""
    if code is None:
        return ErrorCode.UNAVAILABLE
    return ErrorCode[code.name]
