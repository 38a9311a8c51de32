"""Checks of ``eventspec ask``'s arguments, all before any network call.

Each check raises :class:`ArgumentProblem` with one line that names the flag. Zero never
silently means "the default": the wire uses 0 for "unset" in several fields
(``max_new_tokens``, ``top_p``, ``event_window_ms``), so the CLI refuses 0 wherever 0
itself is not a meaningful value, and never sends 0 meaning "default".
"""

from __future__ import annotations

import math

#: The wire's int32 fields (``window.latest_ms``, ``max_new_tokens``).
INT32_MAX = 2**31 - 1
#: ``GenerationConfig.seed`` is a uint64.
UINT64_MAX = 2**64 - 1
#: EventGPT refuses event windows of this length or longer.
MAX_EVENT_WINDOW_MS = 100
#: Addresses with one of these schemes are passed to gRPC as they are.
_SCHEMES = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:")


class ArgumentProblem(ValueError):
    """A command-line value that cannot be sent; the message names the flag."""


def check_address(flag: str, address: str) -> str:
    """``HOST:PORT`` (``[V6]:PORT``) with a port in 1..65535, or a gRPC scheme address.

    Without a port gRPC would quietly dial 443, which is never an eventspec port.
    """
    if address.startswith(_SCHEMES):
        return address
    scheme, sep, rest = address.partition("://")
    if sep and scheme.lower() in ("http", "https", "grpc", "grpcs"):
        raise ArgumentProblem(f"{flag} {address!r}: drop the scheme: gRPC takes HOST:PORT "
                              f"({rest.rstrip('/')!r}); for TLS add --tls")
    host, sep, port = address.rpartition(":")
    if not sep or not host or (":" in host and not host.startswith("[")):
        raise ArgumentProblem(f"{flag} {address!r} needs a port: HOST:PORT (e.g. "
                              "127.0.0.1:50062)")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ArgumentProblem(f"{flag} {address!r}: the port must be in 1..65535")
    return address


def check_int_range(flag: str, value: int, lo: int, hi: int, why: str = "") -> int:
    """``lo <= value <= hi`` or one line naming the flag and the range."""
    if not lo <= value <= hi:
        extra = f" ({why})" if why else ""
        raise ArgumentProblem(f"{flag} must be in {lo}..{hi}{extra}, got {value}")
    return value


def check_float_range(flag: str, value: float, lo: float, hi: float, *,
                      lo_open: bool = False, why: str = "") -> float:
    """A finite value in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    low_ok = value > lo if lo_open else value >= lo
    if not math.isfinite(value) or not low_ok or value > hi:
        span = f"({lo:g}, {hi:g}]" if lo_open else f"[{lo:g}, {hi:g}]"
        extra = f" ({why})" if why else ""
        raise ArgumentProblem(f"{flag} must be in {span}{extra}, got {value:g}")
    return value


def check_temperature(value: float) -> float:
    """0 (greedy) or the sampler's usable span (``eventspec.shared.contract.types`` bounds)."""
    from eventspec.shared.contract.types import MAX_TEMPERATURE, MIN_TEMPERATURE

    if value == 0:
        return value
    return check_float_range("--temperature", value, MIN_TEMPERATURE, MAX_TEMPERATURE,
                             why="0 is greedy")


def time_range_us(from_ms: float | None, to_ms: float | None,
                  clip_ms: int | None) -> tuple[int, int] | None:
    """``--from-ms``/``--to-ms`` as a µs range in the source's clock, or None if unset."""
    if from_ms is None and to_ms is None:
        return None
    if from_ms is None or to_ms is None:
        raise ArgumentProblem("--from-ms and --to-ms go together")
    if clip_ms is not None:
        raise ArgumentProblem("give either --clip-ms or --from-ms/--to-ms, not both")
    for flag, value in (("--from-ms", from_ms), ("--to-ms", to_ms)):
        if not math.isfinite(value) or value < 0:
            raise ArgumentProblem(f"{flag} must be >= 0, got {value:g}")
    t0, t1 = round(from_ms * 1000), round(to_ms * 1000)
    if t1 <= t0:
        raise ArgumentProblem(f"--from-ms {from_ms:g} must be before --to-ms {to_ms:g}")
    if t1 >= 2**63:
        raise ArgumentProblem(f"--to-ms {to_ms:g} is beyond any recording's clock")
    return t0, t1
