"""Stalled HTTP/2 uploads: many POSTs on one cleartext HTTP/2 connection (prior knowledge),
each sending part of a body and then holding the stream open without END_STREAM.

This is the slow or hostile client a gateway must survive: every stream makes Envoy (and the
filter, which waits for the whole prompt) hold its body. One thread drives the connection, so
the caller samples whatever it wants (Envoy's RSS, its stats) between steps.
"""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Callable

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions


class StalledUploads:
    """`n` streams on one connection to 127.0.0.1:`port`, each sending `size` body bytes of a
    chat request that never ends. A context manager: leaving it resets every stream still
    open and closes the connection."""

    def __init__(self, port: int, n: int, size: int, model: str, path: str = "/v1/chat/completions") -> None:
        self.port, self.n, self.size, self.model, self.path = port, n, size, model, path
        self.left: dict[int, int] = {}
        self.reset_by_server: set[int] = set()
        self.status: dict[int, str] = {}
        self.goaway = False
        self._sock: socket.socket | None = None
        self._sel = selectors.DefaultSelector()
        self._conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))

    def __enter__(self) -> "StalledUploads":
        self._sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.setblocking(False)
        self._sel.register(self._sock, selectors.EVENT_READ)
        self._conn.initiate_connection()
        # The server's SETTINGS (its stream limit among them) before any stream is opened; until
        # they arrive h2 reports an unbounded limit.
        deadline = time.time() + 10
        while self._conn.remote_settings.max_concurrent_streams > 2**31 and time.time() < deadline:
            self._flush()
            self._read(0.05)
        if self._conn.remote_settings.max_concurrent_streams < self.n:
            raise RuntimeError(f"the server allows {self._conn.remote_settings.max_concurrent_streams} "
                               f"streams per connection, fewer than {self.n}")
        # No content-length: the filter cannot decide at header time and must buffer.
        head = f'{{"model":"{self.model}","messages":[{{"role":"user","content":"'.encode()
        for _ in range(self.n):
            sid = self._conn.get_next_available_stream_id()
            self._conn.send_headers(sid, [
                (":method", "POST"), (":path", self.path), (":scheme", "http"),
                (":authority", f"127.0.0.1:{self.port}"), ("content-type", "application/json"),
            ])
            self._conn.send_data(sid, head)
            self.left[sid] = self.size - len(head)
        self._flush()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def open_streams(self) -> list[int]:
        return [s for s in self.left if s not in self.reset_by_server and s not in self.status]

    @property
    def sent(self) -> int:
        """Body bytes sent so far over all streams."""
        return sum(self.size - max(left, 0) for left in self.left.values())

    def pump(self, seconds: float, each: Callable[[], None] = lambda: None, until_sent: bool = False) -> None:
        """Sends body bytes as flow control allows and reads the server's frames (resets, pings,
        settings) for `seconds`, or, with `until_sent`, only until no open stream has bytes left
        to send; calls `each` after every step."""
        deadline = time.time() + seconds
        filler = b"x" * 16384
        while time.time() < deadline and not self.goaway:
            if until_sent and not any(self.left[s] > 0 for s in self.open_streams):
                return
            moved = False
            for sid in self.open_streams:
                if self.left[sid] <= 0:
                    continue
                try:
                    room = min(self._conn.local_flow_control_window(sid), self._conn.max_outbound_frame_size,
                               self.left[sid])
                    if room > 0:
                        self._conn.send_data(sid, filler[:room])
                        self.left[sid] -= room
                        moved = True
                except h2.exceptions.StreamClosedError:
                    # Closed by the server in frames not read yet; the reset shows up next read.
                    self.reset_by_server.add(sid)
            self._flush()
            self._read(0 if moved else 0.02)
            each()

    def close(self) -> None:
        """Resets every stream still open, says GOAWAY and closes the connection."""
        if self._sock is None:
            return
        try:
            for sid in self.open_streams:
                self._conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
            self._conn.close_connection()
            self._flush()
        except (OSError, h2.exceptions.ProtocolError):
            pass
        self._sel.close()
        self._sock.close()
        self._sock = None

    def _flush(self) -> None:
        out = self._conn.data_to_send()
        while out:
            try:
                sent = self._sock.send(out)
                out = out[sent:]
            except BlockingIOError:
                # The server reads slower than we write: take its frames (window updates) meanwhile.
                self._read(0.01)
                out += self._conn.data_to_send()

    def _read(self, timeout: float) -> None:
        if not self._sel.select(timeout):
            return
        try:
            data = self._sock.recv(1 << 20)
        except BlockingIOError:
            return
        if not data:
            self.goaway = True
            return
        for ev in self._conn.receive_data(data):
            if isinstance(ev, h2.events.StreamReset):
                self.reset_by_server.add(ev.stream_id)
            elif isinstance(ev, h2.events.ResponseReceived):
                self.status[ev.stream_id] = dict(ev.headers).get(":status", "")
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.goaway = True
