"""uvicorn under ``twin serve``: a socket bound up front (a port in use is an error naming it, not uvicorn's
log line and exit), the ``http.server``-style calls the CLI and the tests drive it with, and uvicorn's h11
protocol answering a malformed body the OpenAI way.

uvicorn answers a request it cannot frame (a Content-Length that is not a whole number, a body that ends
short of its length) with a plain-text "Invalid HTTP request received." and closes the connection, and a
client that half-closes its side after sending got no answer at all: :class:`_Protocol` answers both with a
JSON 400 naming the fault, as the twin's server did before it moved onto uvicorn.
"""

from __future__ import annotations

import asyncio
import errno
import json
import re
import socket
import threading
from typing import Any, Callable

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from twin.core.errors import TwinError

BACKLOG = 1024
"""Connections waiting to be accepted (socketserver's default of 5 reset most of a burst of 64 benchmark
clients)."""
GRACE_S = 1
"""How long a stop waits for replies in progress before it cancels them (their requests are aborted)."""
_HEAD_BYTES = 16384
_CONTENT_LENGTH = re.compile(rb"(?im)^content-length:[ \t]*([^\r\n]*?)[ \t]*\r?$")
_SHORT_BODY = re.compile(r"received (\d+) bytes, expected (\d+)")


class HTTPServer:
    """uvicorn serving ``app`` on a socket bound when this is made (``server_port`` is the port, also when
    0 asked for any); ``serve_forever`` runs it on the calling thread until ``shutdown`` from another.
    ``on_stop`` runs on the event loop as the server begins to stop, to end the replies in progress (uvicorn
    would wait for them, then cancel them with a traceback each)."""

    def __init__(self, app: Any, host: str, port: int, on_stop: Callable[[], None] = lambda: None) -> None:
        self.socket = _listen(host, port)
        self.server_port: int = self.socket.getsockname()[1]
        config = uvicorn.Config(app, http=_Protocol, lifespan="off", log_config=None, log_level="error",
                                access_log=False, backlog=BACKLOG, timeout_graceful_shutdown=GRACE_S)
        self._server = _Server(config, on_stop)
        self._serving = threading.Event()
        self._stopped = threading.Event()

    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown` (or Ctrl-C on the main thread: a KeyboardInterrupt)."""
        self._serving.set()
        try:
            asyncio.run(self._server.serve(sockets=[self.socket]))
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop serving and wait for ``serve_forever`` to return."""
        self._server.should_exit = True
        if self._serving.is_set():
            self._stopped.wait(timeout=GRACE_S + 5)

    def server_close(self) -> None:
        self.socket.close()


class _Server(uvicorn.Server):  # type: ignore[misc]
    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_stop = on_stop

    async def shutdown(self, sockets: Any = None) -> None:
        self._on_stop()
        await super().shutdown(sockets)


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port``; a TwinError naming them when it cannot be had."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise TwinError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as uvicorn: a restart reuses the port)
        sock.bind(address)
        sock.listen(BACKLOG)  # (clients connecting before uvicorn runs wait in the backlog)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise TwinError(f"port {port} on {host} is in use (another server is listening there): choose "
                            f"another with --port") from None
        raise TwinError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


class _Protocol(H11Protocol):  # type: ignore[misc]
    """uvicorn's h11 protocol, answering requests it cannot frame with a JSON 400 that names the fault."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head = b""
        """The raw bytes of the request head being received: where a bad Content-Length is read back from
        (h11 says only "bad Content-Length")."""

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._head = (self._head + data)[-_HEAD_BYTES:]
        super().data_received(data)

    def on_response_complete(self) -> None:
        self._head = b""
        super().on_response_complete()

    def eof_received(self) -> None:
        """The client ended its side: while its body is still owed, answer that it ended short (uvicorn
        closed the connection without a word); otherwise as uvicorn (a running request's client is gone)."""
        if self.conn.their_state is h11.SEND_BODY and self.cycle is not None and not self.cycle.response_started:
            self.conn.receive_data(b"")
            try:
                self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                counts = _SHORT_BODY.search(str(exc))
                self.cycle.disconnected = True  # (the application stops waiting for the rest of the body)
                self.cycle.message_event.set()
                self._refuse(f"the body ended after {counts[1]} of its {counts[2]} bytes" if counts else
                             "the body ended before its Content-Length")
                return
        super().eof_received()

    def send_400_response(self, msg: str) -> None:
        """A request head h11 refused; a bad Content-Length is named with its value."""
        length = _CONTENT_LENGTH.findall(self._head)
        text = length[-1].decode("latin-1") if length else ""
        if length and re.fullmatch("[0-9]+", text) is None:
            self._refuse(f"Content-Length must be a whole number of bytes, got {text!r}")
        else:
            self._refuse("the request is not valid HTTP/1.1")

    def _refuse(self, message: str) -> None:
        body = json.dumps({"error": {"message": f"bad request: {message}", "type": "BadRequestError",
                                     "code": 400}}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()
