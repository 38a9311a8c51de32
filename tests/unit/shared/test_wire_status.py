"""The one mapping between the transport-neutral error codes and gRPC's (shared/wire/status).

Domain code raises ``eventspec.shared.contract.errors`` exceptions without importing grpc; the
servers'
interceptors and the client stubs translate through this mapping, so it must be total
and lossless both ways or some error would reach the other end under a wrong code.
"""

from __future__ import annotations

import grpc
import pytest

from eventspec.shared.contract.errors import (
    ErrorCode,
    EventSpecError,
    FailedPrecondition,
    InvalidInput,
)
from eventspec.shared.wire.status import from_grpc, to_grpc


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda c: c.name)
def test_every_domain_code_round_trips_through_grpc(code: ErrorCode) -> None:
    status = to_grpc(code)
    assert status.name == code.name and from_grpc(status) is code


@pytest.mark.parametrize("status", list(grpc.StatusCode), ids=lambda s: s.name)
def test_every_grpc_status_has_a_domain_code(status: grpc.StatusCode) -> None:
    assert to_grpc(from_grpc(status)) is status


def test_a_broken_call_without_status_is_unavailable() -> None:
    assert from_grpc(None) is ErrorCode.UNAVAILABLE


def test_exceptions_carry_their_codes() -> None:
    assert to_grpc(InvalidInput("x").code) is grpc.StatusCode.INVALID_ARGUMENT
    assert to_grpc(FailedPrecondition("x").code) is grpc.StatusCode.FAILED_PRECONDITION
    assert EventSpecError("x", ErrorCode.NOT_FOUND).code is ErrorCode.NOT_FOUND
