"""A decoder in a child process, with a deadline on every request.

Why: a library decoding a damaged file can spin forever in native code while holding
the GIL (dv-processing 2.0.4 does, see ``aedat4_worker``). No timeout inside the
process can end that: the thread cannot be interrupted, and with the GIL held neither
gRPC's callbacks nor the SIGTERM handler run. A child process can always be killed.
So the library runs in a child, the parent waits on a pipe with ``select`` (GIL
released, deadline enforced), and a request that misses its deadline kills the child:
the caller gets :class:`DecodeTimeout` at the deadline, and the next request starts a
fresh child, which first replays the request that opened the file.

The replies are JSON plus ``.npy`` blobs read with ``allow_pickle=False``, so a child
that went wrong can send wrong numbers, never code.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np


class DecodeTimeout(Exception):
    """The child did not answer within the request's deadline; it has been killed."""


class DecodeFailed(Exception):
    """The child answered with an error, or died; the text says what the library said."""


class DecoderProcess:
    """One child running ``script``; :meth:`request` is serialised by a lock.

    ``open_request`` is sent first to every child this object starts (a restart after a
    timeout included), with ``open_deadline_s``. :meth:`close` may be called from any
    thread at any time: it kills the child, which wakes a request waiting on it. Setting
    ``cancel`` does the same for a caller that holds no reference yet (a node stopping
    while the file is still being opened).
    """

    def __init__(self, script: Path, open_request: dict[str, Any], open_deadline_s: float,
                 *, cancel: threading.Event | None = None) -> None:
        self._script = script
        self._cancel = cancel
        self._open_request = open_request
        self._open_deadline_s = open_deadline_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self._buf = b""
        self._closed = False
        self.opened: dict[str, Any] = {}
        self.restarts = 0

    def start(self) -> dict[str, Any]:
        """Start the child and open the file; the child's reply to the open request."""
        with self._lock:
            self._ensure_started()
        return self.opened

    def request(self, req: dict[str, Any], deadline_s: float
                ) -> tuple[dict[str, Any], list[np.ndarray]]:
        """Send ``req``; the reply and its arrays, or DecodeTimeout/DecodeFailed."""
        with self._lock:
            self._ensure_started()
            return self._exchange(req, deadline_s)

    def close(self) -> None:
        """Kill the child (idempotent); later requests fail with DecodeFailed.

        A request waiting on the child wakes at once (its pipe ends), or within 0.1 s
        when something else holds the pipe open (a process forked meanwhile); the pipes are
        closed here only when no request holds them.
        """
        self._closed = True
        self._kill()
        if self._lock.acquire(blocking=False):
            try:
                self._close_pipes()
            finally:
                self._lock.release()

    def _ensure_started(self) -> None:
        if self._closed:
            raise DecodeFailed("the decoder was closed")
        if self._proc is not None and self._proc.poll() is None:
            return
        if self._proc is not None:
            self.restarts += 1
            self._close_pipes()
        # The child's stderr, for the last line when it dies; closed with the pipes.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        # -P: the script's folder (edge/events, with a types.py) must not shadow the
        # standard library. A new session: a terminal's Ctrl-C goes to the parent,
        # which ends the child itself.
        self._proc = subprocess.Popen(
            [sys.executable, "-P", str(self._script), str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            start_new_session=True,
        )
        self._buf = b""
        head, _ = self._exchange(self._open_request, self._open_deadline_s)
        self.opened = head

    def _exchange(self, req: dict[str, Any], deadline_s: float
                  ) -> tuple[dict[str, Any], list[np.ndarray]]:
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        deadline = time.monotonic() + deadline_s
        try:
            proc.stdin.write(json.dumps(req).encode() + b"\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise self._died() from exc
        head = json.loads(self._read_line(deadline))
        if not head.get("ok"):
            raise DecodeFailed(str(head.get("error", "unknown error")))
        arrays = [np.load(io.BytesIO(self._read_exact(int(n), deadline)), allow_pickle=False)
                  for n in head.get("blobs", [])]
        return head, arrays

    def _fill(self, deadline: float) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._kill()
                raise DecodeTimeout("no answer within the deadline; the decoder was ended")
            if self._cancel is not None and self._cancel.is_set():
                self._kill()
                raise DecodeFailed("cancelled: the node is stopping")
            if self._closed:  # close() ran: do not rely on the pipe's end-of-file alone,
                raise DecodeFailed("the decoder was closed")  # a forked process may hold it
            # Short waits, so a cancel or a close is seen within 0.1 s.
            if select.select([fd], [], [], min(left, 0.1))[0]:
                break
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            raise self._died()
        self._buf += chunk

    def _read_line(self, deadline: float) -> bytes:
        while (i := self._buf.find(b"\n")) < 0:
            self._fill(deadline)
        line, self._buf = self._buf[:i], self._buf[i + 1:]
        return line

    def _read_exact(self, n: int, deadline: float) -> bytes:
        while len(self._buf) < n:
            self._fill(deadline)
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _died(self) -> DecodeFailed:
        """The child is gone: why, from its exit status and the end of its stderr."""
        if self._closed:
            return DecodeFailed("the decoder was closed")
        proc = self._proc
        code = proc.wait() if proc is not None else None
        tail = ""
        if self._stderr is not None:
            self._stderr.seek(0)
            lines = self._stderr.read().decode(errors="replace").strip().splitlines()
            tail = f": {lines[-1][:300]}" if lines else ""
        return DecodeFailed(f"the decoder process died (exit status {code}){tail}")

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def _close_pipes(self) -> None:
        proc = self._proc
        if proc is None:
            return
        for pipe in (proc.stdin, proc.stdout, self._stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
