"""The connection-level limits uvicorn's HTTP/1.1 protocol (h11) leaves to the application, for a server a
hostile or careless local client must not be able to tie up:

- a request's line and headers must all arrive within ``request_timeout`` seconds of the connection being
  made (or of the previous answer, on a kept-alive connection), else the connection is closed: uvicorn's own
  keep-alive timer is reset by every byte, so a client sending a byte a second would hold it for ever;
- at most ``max_connections`` are open at once; one more is answered 503 (``too_many_connections``) at once;
- those are the server owner's: another local user (the uid at the client's end, from /proc/net/tcp; the
  key is the owner's alone, so theirs cannot authenticate anyway) holds at most ``OTHER_USERS`` connections
  at once, all of them together, and never one of the owner's slots;
- what h11 refuses as HTTP (a Content-Length that is not one whole number, two that differ, a header line
  that is not one) is answered with an OpenAI-style JSON error saying why, rather than uvicorn's plain text.

A request's body, its time limit and size, are the application's (``app.py``), which sees the headers.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def error_body(
    message: str, param: str | None = None, kind: str = "invalid_request_error", code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


OTHER_USERS = 4  # connections other local users may hold at once, all together
LINGER_S = 1.0  # how long a refused connection may stay open for its client to read the answer and close
BAD_HTTP = (
    "the request is not valid HTTP/1.1; send one request line, header lines, and the JSON body with one "
    "Content-Length of its whole number of bytes"
)


class _Connection(h11.Connection):
    """h11's connection, keeping why it refused the peer's bytes (uvicorn's answer does not say)."""

    refused = ""

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as e:
            self.refused = str(e)
            raise


def _hex_v4(address: tuple[Any, ...]) -> str:
    """An IPv4 (address, port) as /proc/net/tcp writes it: the address in host byte order, then the port."""
    packed = socket.inet_aton(address[0])
    return f"{int.from_bytes(packed, sys.byteorder):08X}:{address[1]:04X}"


def peer_uid(peer: Any, local: Any) -> int | None:
    """The uid of the process at the client's end of a loopback TCP connection (its socket's owner in
    /proc/net/tcp: the line whose local end is ``peer`` and remote end ``local``); None where it cannot be
    read (not Linux, not IPv4, gone already)."""
    if not (isinstance(peer, tuple) and isinstance(local, tuple) and len(peer) == 2):
        return None
    try:
        want = (_hex_v4(peer), _hex_v4(local))
        with open("/proc/net/tcp", encoding="ascii") as f:
            next(f)
            for line in f:
                cols = line.split()
                if (cols[1], cols[2]) == want:
                    return int(cols[7])
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return None


def protocol(request_timeout: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol class with these limits (uvicorn takes the class as ``http=``)."""

    class Protocol(H11Protocol):
        _headers_due: asyncio.TimerHandle | None = None
        _refused = False  # answered and closing: what else comes is dropped
        _other = False  # the client runs as another local user

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            size = self.config.h11_max_incomplete_event_size
            self.conn = _Connection(h11.SERVER) if size is None else _Connection(h11.SERVER, size)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            uid = peer_uid(transport.get_extra_info("peername"), transport.get_extra_info("sockname"))
            self._other = uid is not None and uid != os.getuid()
            super().connection_made(transport)
            # the owner's connections and other users' are counted apart: theirs never take one of the owner's
            same = sum(1 for c in self.connections if getattr(c, "_other", False) == self._other)
            if self._other and same > OTHER_USERS:
                why = f"another user's connections to this server are limited to {OTHER_USERS} at once"
            elif not self._other and same > max_connections:
                why = f"the server has {max_connections} connections open; retry shortly"
            else:
                self._arm()
                return
            body = error_body(why, kind="server_error", code="too_many_connections")
            self._refuse(503, body, [(b"Retry-After", b"1")])

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()  # a kept-alive connection: the next request's headers are due in time too

        def connection_lost(self, exc: Exception | None) -> None:
            if self._headers_due is not None:
                self._headers_due.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._headers_due is not None:
                self._headers_due.cancel()
            self._headers_due = self.loop.call_later(request_timeout, self._headers_late)

        def _headers_late(self) -> None:
            # IDLE: the request line and headers have not all come (after them h11 is in SEND_BODY or DONE,
            # and the body's time is the application's to keep).
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
            why = getattr(self.conn, "refused", "") or msg  # msg: uvicorn's "Invalid HTTP request received."
            self._refuse(400, error_body(f"{BAD_HTTP} ({why})", code="bad_http"), [])

        def _refuse(self, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> None:
            # Written as it is, not through h11: the connection closes after it, whatever state h11 is in
            # (before any request, h11 has no response to send).
            data = json.dumps(body).encode()
            lines = [
                f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode(),
                b"Content-Type: application/json",
                b"Content-Length: " + str(len(data)).encode(),
                b"Connection: close",
                *(k + b": " + v for k, v in headers),
            ]
            self.transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + data)
            # Closing now, with the request's bytes unread, would reset the connection and could lose the
            # answer: end our side, drop what still comes, and close once the client has (or in a second).
            self._refused = True
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)

        def data_received(self, data: bytes) -> None:
            if not self._refused:
                super().data_received(data)

        def eof_received(self) -> None:
            if self._refused:
                self.transport.close()

    return Protocol
