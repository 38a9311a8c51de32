"""A delay proxy on loopback: one-way delay, jitter, a bandwidth limit and connection cuts.

Why: the speculation protocol's gains and failures depend on the network between edge and
cloud (DESIGN.md, "Performance posture"), and ``tc netem`` is not available where the
project runs (REFERENCE.md). So the benchmark and the fault tests put this proxy between
the edge and the cloud. It forwards TCP bytes without parsing them (gRPC is HTTP/2 over
TCP, TLS or not), per direction:

- every chunk read at time t (on a rate-limited direction, every segment of it, each
  with its own jitter draw, as a link's packets) is written at
  ``max(previous delivery, s + delay + jitter)``, where s is when it has finished
  crossing the bandwidth limit: so order is never changed, jitter only ever adds
  queueing behind an earlier chunk, and one direction's delay does not hold the other up;
- jitter is uniform in ``[-jitter_ms, +jitter_ms]`` (the total delay never below 0), from a
  seeded RNG per connection and direction;
- the bandwidth limit is a serialisation queue per direction shared by every connection
  through the proxy, as one link is: a chunk of n bytes occupies it ``n / rate`` seconds;
- cuts: :meth:`DelayProxy.cut` aborts every live connection at once (both sockets reset,
  nothing buffered is delivered) and can refuse new ones for a while;
  :meth:`DelayProxy.cut_after` arms a cut after so many more bytes.

Bytes are read as fast as they come and held until due (no backpressure between the two
sides), which is what a long, fat link does. On a rate-limited direction a read is cut
into segments (:func:`segment_bytes`) that cross the link one after another, as packets
do: a burst the proxy happened to read at once still arrives spread over its
serialisation time, so the far side sees the first bytes (a message's header) well
before the last.

    python -m benchmarks.delay_proxy --listen 127.0.0.1:0 --target 127.0.0.1:50051 \\
        --delay-ms 10 --jitter-ms 1 --rate-mbit 100 [--seed 0] [--cut-after-bytes N]

prints ``{"host": ..., "port": ...}`` on one line once listening, and its statistics as
JSON on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import random
import signal
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from types import TracebackType
from typing import Literal

log = logging.getLogger(__name__)

Direction = Literal["up", "down"]
READ_BYTES = 64 * 1024
#: The smallest segment a rate-limited direction delivers: one Ethernet MTU.
SEGMENT_MIN_BYTES = 1500
#: A segment takes at most this long to cross the link (above the MTU floor): fine
#: enough that arrival is progressive, coarse enough to keep sleeps few at 100 Mbit/s.
SEGMENT_S = 0.002


def segment_bytes(rate_bytes_per_s: float) -> int:
    """How many bytes one delivery carries at this rate; 0 (unlimited) means whole reads."""
    if rate_bytes_per_s <= 0:
        return READ_BYTES
    return max(SEGMENT_MIN_BYTES, int(rate_bytes_per_s * SEGMENT_S))


@dataclass(frozen=True)
class LinkShape:
    """One direction of the emulated link. ``rate_bytes_per_s`` 0 means unlimited."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    rate_bytes_per_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("delay_ms", "jitter_ms", "rate_bytes_per_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"LinkShape.{name} must be finite and >= 0, got {value!r}")


@dataclass
class ProxyStats:
    """What went through: bytes delivered each way (``up`` is client to target)."""

    bytes_up: int = 0
    bytes_down: int = 0
    connections: int = 0
    live: int = 0
    cuts: int = 0
    refused: int = 0


class Pacer:
    """A serialisation queue: the time a chunk has finished crossing the link."""

    def __init__(self, rate_bytes_per_s: float) -> None:
        self.rate = rate_bytes_per_s
        self.free_at = -math.inf

    def finish(self, now: float, size: int) -> float:
        if self.rate <= 0:
            return now
        self.free_at = max(self.free_at, now) + size / self.rate
        return self.free_at


class Schedule:
    """Delivery times for one direction of one connection: order-preserving.

    ``deliver_at(now, size)`` is ``max(previous, pacer finish + delay + jitter)``; pure
    apart from the pacer and the RNG, so tests can drive it without sockets.
    """

    def __init__(self, shape: LinkShape, pacer: Pacer, rng: random.Random) -> None:
        self.shape = shape
        self.pacer = pacer
        self.rng = rng
        self.last = -math.inf

    def deliver_at(self, now: float, size: int) -> float:
        sent = self.pacer.finish(now, size)
        delay = self.shape.delay_ms
        if self.shape.jitter_ms > 0:
            delay = max(0.0, delay + self.rng.uniform(-self.shape.jitter_ms, self.shape.jitter_ms))
        self.last = max(self.last, sent + delay / 1000.0)
        return self.last


@dataclass(eq=False)
class _Connection:
    index: int
    client: asyncio.StreamWriter
    target: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False

    def abort(self) -> None:
        """Reset both sockets now; whatever is still queued is lost."""
        self.closed = True
        for writer in (self.client, self.target):
            if writer is not None:
                writer.transport.abort()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()


class DelayProxy:
    """An asyncio TCP proxy from ``listen`` to ``target`` with a shaped link.

    ``delay_ms``, ``jitter_ms`` and ``rate_mbit`` apply to both directions unless ``up``
    (client to target) or ``down`` is given. Use as ``async with DelayProxy(...) as p``
    and connect to ``("127.0.0.1", p.port)``; the shapes may be replaced while running
    (new chunks see the new shape).
    """

    def __init__(
        self,
        target: tuple[str, int],
        *,
        delay_ms: float = 0.0,
        jitter_ms: float = 0.0,
        rate_mbit: float = 0.0,
        up: LinkShape | None = None,
        down: LinkShape | None = None,
        listen: tuple[str, int] = ("127.0.0.1", 0),
        seed: int = 0,
        cut_after_bytes: int | None = None,
    ) -> None:
        both = LinkShape(delay_ms, jitter_ms, rate_mbit * 1e6 / 8.0)
        self.shapes: dict[Direction, LinkShape] = {"up": up or both, "down": down or both}
        self.target = target
        self.listen = listen
        self.seed = seed
        self.stats = ProxyStats()
        self._pacers: dict[Direction, Pacer] = {
            d: Pacer(s.rate_bytes_per_s) for d, s in self.shapes.items()
        }
        self._server: asyncio.Server | None = None
        self._conns: set[_Connection] = set()
        self._refuse_until = -math.inf
        self._cut_budget: int | None = None
        self._cut_refuse_s = 0.0
        self._forwarded = 0
        if cut_after_bytes is not None:
            self.cut_after(cut_after_bytes)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> DelayProxy:
        self._server = await asyncio.start_server(self._accept, *self.listen)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.abort()
        tasks = [t for c in self._conns for t in c.tasks]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> DelayProxy:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("DelayProxy is not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def address(self) -> str:
        """``host:port`` to dial."""
        return f"{self.listen[0]}:{self.port}"

    # -- shaping and faults ----------------------------------------------------------

    def set_shape(self, direction: Direction, shape: LinkShape) -> None:
        """Change one direction's link from the next chunk on."""
        self.shapes[direction] = shape
        self._pacers[direction].rate = shape.rate_bytes_per_s

    def cut(self, refuse_for_s: float = 0.0) -> int:
        """Abort every live connection now; refuse new ones for ``refuse_for_s``.

        Returns how many were cut. A refused connection is accepted and reset at once.
        """
        loop = asyncio.get_running_loop()
        if refuse_for_s > 0:
            self._refuse_until = max(self._refuse_until, loop.time() + refuse_for_s)
        live = [c for c in self._conns if not c.closed]
        for conn in live:
            conn.abort()
        self.stats.cuts += len(live)
        return len(live)

    def cut_after(self, n_bytes: int, refuse_for_s: float = 0.0) -> None:
        """Cut every live connection once ``n_bytes`` more have been read (either way)."""
        if n_bytes < 0:
            raise ValueError("n_bytes must be >= 0")
        self._cut_budget = self._forwarded + n_bytes
        self._cut_refuse_s = refuse_for_s

    def refusing(self) -> bool:
        return asyncio.get_running_loop().time() < self._refuse_until

    # -- forwarding ------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing():
            self.stats.refused += 1
            writer.transport.abort()
            return
        conn = _Connection(self.stats.connections, writer)
        self.stats.connections += 1
        self._conns.add(conn)
        self.stats.live += 1
        try:
            try:
                t_reader, t_writer = await asyncio.open_connection(*self.target)
            except OSError as exc:
                log.info("delay proxy: target %s:%d refused: %s", *self.target, exc)
                conn.abort()
                return
            conn.target = t_writer
            if conn.closed:  # cut while connecting
                t_writer.transport.abort()
                return
            conn.tasks = [
                asyncio.create_task(self._pump(conn, "up", reader, t_writer)),
                asyncio.create_task(self._pump(conn, "down", t_reader, writer)),
            ]
            await asyncio.gather(*conn.tasks, return_exceptions=True)
            if not conn.closed:
                conn.closed = True
                for w in (writer, t_writer):
                    w.close()
        finally:
            self._conns.discard(conn)
            self.stats.live -= 1

    async def _pump(
        self,
        conn: _Connection,
        direction: Direction,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        loop = asyncio.get_running_loop()
        rng = random.Random(f"{self.seed}/{conn.index}/{direction}")
        sched = Schedule(self.shapes[direction], self._pacers[direction], rng)
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(self._send(conn, direction, queue, writer))
        try:
            while True:
                try:
                    data = await reader.read(READ_BYTES)
                except (ConnectionError, OSError):
                    conn.abort()
                    return
                sched.shape = self.shapes[direction]
                now = loop.time()
                if not data:
                    queue.put_nowait((sched.deliver_at(now, 0), data))
                    break
                step = segment_bytes(sched.shape.rate_bytes_per_s)
                for at in range(0, len(data), step):
                    piece = data[at:at + step]
                    queue.put_nowait((sched.deliver_at(now, len(piece)), piece))
                self._forwarded += len(data)
                if self._cut_budget is not None and self._forwarded >= self._cut_budget:
                    self._cut_budget = None
                    self.cut(self._cut_refuse_s)
                    return
            await sender
        finally:
            if not sender.done():
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sender

    async def _send(
        self,
        conn: _Connection,
        direction: Direction,
        queue: asyncio.Queue[tuple[float, bytes]],
        writer: asyncio.StreamWriter,
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if conn.closed:
                return
            try:
                if not data:  # the sender closed its side: pass the half-close on
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
            except (ConnectionError, OSError):
                conn.abort()
                return
            if direction == "up":
                self.stats.bytes_up += len(data)
            else:
                self.stats.bytes_down += len(data)


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.delay_proxy",
                                description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--listen", type=_host_port, default=("127.0.0.1", 0))
    p.add_argument("--target", type=_host_port, required=True)
    p.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay, each way")
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--rate-mbit", type=float, default=0.0, help="each way; 0 is unlimited")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cut-after-bytes", type=int, default=None)
    return p


async def _serve(args: argparse.Namespace) -> ProxyStats:
    proxy = DelayProxy(args.target, delay_ms=args.delay_ms, jitter_ms=args.jitter_ms,
                       rate_mbit=args.rate_mbit, listen=args.listen, seed=args.seed,
                       cut_after_bytes=args.cut_after_bytes)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with proxy:
        print(json.dumps({"host": args.listen[0], "port": proxy.port}), flush=True)
        await stop.wait()
    return proxy.stats


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    stats = asyncio.run(_serve(args))
    print(json.dumps(asdict(stats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
