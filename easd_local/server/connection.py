"""The server's HTTP connections: uvicorn's h11 protocol with two answers of its own.

- A request whose line and headers stop arriving is answered 408 after ``--timeout`` seconds
  without a byte, and its connection closed, as a stalled body already is (``app.read_json``).
  uvicorn starts no timer before a request's head is complete, so a client that sends part of a
  head (or opens a connection and sends nothing) would hold the connection for good; llama-server
  closes it after its ``--timeout``. A connection that sent nothing of a new request is closed
  without an answer (nobody is waiting for one).
- A request line or headers that h11 cannot parse get the API's JSON error (400), not uvicorn's
  plain text, so every error a client meets has the one shape.

The h11 protocol is named, not left to uvicorn's "auto" (httptools where it is installed), so
these answers do not depend on what else is installed.
"""

from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .protocol import ApiError


def _raw_response(status: int, reason: str, err: ApiError) -> bytes:
    body = json.dumps(err.body()).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def protocol_class(head_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, a request head that stalls ``head_timeout`` seconds answered 408."""

    class Connection(H11Protocol):
        _head_timer = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _arm(self) -> None:
            """Start the clock again while the connection waits for a request's head (h11's
            client state IDLE: between requests, or in the middle of a head); a request being
            read or answered stops it."""
            self._disarm()
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self._head_timer = self.loop.call_later(head_timeout, self._head_timed_out)

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.conn.trailing_data[0]:  # part of a head, which h11 holds until it is whole
                self.transport.write(_raw_response(408, "Request Timeout", ApiError(
                    408, f"the request's headers did not arrive in full: no byte for {head_timeout:g} s (--timeout)",
                    code="request_timeout")))
            self.transport.close()

        def send_400_response(self, msg: str) -> None:
            self._disarm()
            self.transport.write(_raw_response(400, "Bad Request", ApiError(
                400, "invalid HTTP request: its request line or headers could not be parsed",
                code="invalid_http")))
            self.transport.close()

    return Connection
