"""HTTP/1.1 on httptools (llhttp, the parser uvicorn uses) under hypercorn.

hypercorn's protocol layer is I/O-free: its TCP server hands bytes to a
``ProtocolWrapper``, which picks the HTTP/1.1 class (``H11Protocol``, on the pure-Python
h11 state machine) or HTTP/2. :class:`HttpToolsProtocol` is a drop-in for the first: the
C parser turns bytes into hypercorn's own stream events, and responses are framed here
(``Content-Length`` or chunked) with a byte join instead of h11's checks per event.
Everything else stays hypercorn's: the TCP server, TLS, keep-alive timeouts, lifespan,
graceful shutdown, HTTP/2, and the ASGI side of a request (``HTTPStream``).

:mod:`.protocols` makes hypercorn build it, with a ``send`` that writes straight into
the socket when the kernel takes the bytes (:mod:`.writes`). This module, that one and
:mod:`.writes` hold all of the hypercorn internals we rely on (hypercorn is pinned to
its minor version).

What it does as h11 does: keep-alive (and ``Connection: close``, HTTP/1.0), pipelining
(one request at a time, the next read only after the response), chunked request bodies,
``Expect: 100-continue``, malformed requests answered 400 and oversize request heads 431,
then the connection closed; HTTP/2 prior knowledge (``PRI *``) handed to hypercorn's
HTTP/2. What differs: ``Upgrade`` requests (h2c, WebSocket) are answered in HTTP/1.1, as
a plain request; actorserve serves neither over HTTP/1.1.
"""

from __future__ import annotations

import collections
import http
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import httptools
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.events import Body, EndBody, InformationalResponse, Request, Response, StreamClosed
from hypercorn.protocol.h11 import H2ProtocolAssumedError
from hypercorn.protocol.http_stream import HTTPStream

STREAM_ID: Final = 1
_H2_PREFACE: Final = b"PRI * HTTP/2.0"
_NO_BODY_STATUS: Final = frozenset({204, 304})


def _status_line(code: int) -> bytes:
    try:
        phrase = http.HTTPStatus(code).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {code} {phrase}\r\n".encode("ascii")


_STATUS_LINES: Final = {code: _status_line(code) for code in range(100, 600)}


class _DateHeader:
    """The ``date`` header, formatted once a second rather than once a response."""

    __slots__ = ("second", "value")

    def __init__(self) -> None:
        self.second = -1
        self.value = b""

    def get(self) -> bytes:
        now = time.time()
        if int(now) != self.second:
            self.second = int(now)
            self.value = (
                b"date: " + time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now)).encode() + b"\r\n"
            )
        return self.value


_DATE: Final = _DateHeader()


class HttpToolsProtocol:
    """One HTTP/1.1 connection: httptools parses, hypercorn's ``HTTPStream`` runs the
    ASGI app, this class frames the response. Same interface as hypercorn's H11Protocol."""

    def __init__(
        self,
        app: Any,
        config: Config,
        context: Any,
        task_group: Any,
        connection_state: Any,
        ssl: bool,
        client: Any,
        server: Any,
        send: Callable[[Event], Awaitable[None]],
    ) -> None:
        self.app, self.config, self.context, self.task_group = app, config, context, task_group
        self.connection_state, self.ssl, self.client, self.server = connection_state, ssl, client, server
        self.send = send
        self.can_read = context.event_class()
        self.parser = httptools.HttpRequestParser(self)
        self.stream: HTTPStream | None = None
        self.keep_alive_requests = 0
        self.seen_data = False
        self.closing = False
        # parser output not yet handed to a stream: ("request"|"body"|"end"|"error", value)
        self.events: collections.deque[tuple[str, Any]] = collections.deque()
        # the request being parsed
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_size = 0
        self.upgrade_body = 0  # body bytes of an Upgrade request, which llhttp stops parsing
        # the exchange in flight
        self.method = "GET"
        self.keep_alive = True
        self.request_complete = False
        self.response_complete = False
        self.chunked = False
        self.no_body = False
        self.pending_head = b""
        self.response_started = False
        self.has_length = False
        server_name = b"hypercorn-httptools"
        self.fixed_headers = b"server: " + server_name + b"\r\n" if config.include_server_header else b""
        # the port's own (ServerConfig.fixed_headers: actorserve-replica), rendered once
        self.fixed_headers += b"".join(
            n + b": " + v + b"\r\n" for n, v in getattr(config, "fixed_headers", ())
        )
        self.include_date = config.include_date_header

    # -- hypercorn's protocol interface ------------------------------------------------

    async def initiate(self) -> None:
        pass

    async def handle(self, event: Event) -> None:
        if isinstance(event, RawData):
            if event.data:
                self._feed(event.data)
                await self._dispatch()
        elif isinstance(event, Closed):
            self.closing = True
            await self._close_stream()
            await self.can_read.set()

    # -- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.head_size = 0

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._grow_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))
        self._grow_head(len(name) + len(value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        method = parser.get_method().decode("ascii").upper()
        version = parser.get_http_version()
        self.events.append(("request", (method, version, self.url, self.headers, parser.should_keep_alive())))
        if parser.should_upgrade():
            for name, value in self.headers:
                if name == b"content-length":
                    self.upgrade_body = int(value)

    def on_body(self, body: bytes) -> None:
        self.events.append(("body", body))

    def on_message_complete(self) -> None:
        if not self.upgrade_body:
            self.events.append(("end", None))

    def _grow_head(self, size: int) -> None:
        self.head_size += size
        if self.head_size > self.config.h11_max_incomplete_size:
            raise _HeadTooLarge

    # -- reading -------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        if not self.seen_data:
            self.seen_data = True
            if data.startswith(_H2_PREFACE):
                raise H2ProtocolAssumedError(data)  # hypercorn's wrapper switches to HTTP/2
        while data:
            if self.upgrade_body:
                body, data = data[: self.upgrade_body], data[self.upgrade_body :]
                self.upgrade_body -= len(body)
                self.events.append(("body", body))
                if not self.upgrade_body:
                    self.events.append(("end", None))
                continue
            try:
                self.parser.feed_data(data)
                return
            except httptools.HttpParserUpgrade as upgrade:
                # llhttp stops after the head of an Upgrade request; we serve it as plain
                # HTTP/1.1 and go on parsing after it (and after its body, if it has one)
                data = data[upgrade.args[0] :]
                self.parser = httptools.HttpRequestParser(self)
            except httptools.HttpParserError as error:  # callback errors arrive wrapped
                self.events.append(("error", 431 if isinstance(error.__context__, _HeadTooLarge) else 400))
                return

    async def _dispatch(self) -> None:
        events = self.events
        while events and not self.closing:
            kind, value = events[0]
            if kind == "request":
                if self.stream is not None:  # pipelined: wait until the response before is done
                    await self.can_read.clear()
                    await self.can_read.wait()
                    continue
                events.popleft()
                await self._start_stream(*value)
            elif kind == "body":
                events.popleft()
                if self.stream is not None:
                    await self.stream.handle(Body(stream_id=STREAM_ID, data=value))
            elif kind == "end":
                events.popleft()
                self.request_complete = True
                if self.stream is not None:
                    await self.stream.handle(EndBody(stream_id=STREAM_ID))
            else:  # a parse error: answer it if no response has started, then close
                if self.stream is not None and self.request_complete:  # after the response before it
                    await self.can_read.clear()
                    await self.can_read.wait()
                    continue
                events.clear()
                if self.stream is None or not self.response_started:
                    await self._send_error(value)
                self.closing = True
                await self.send(Closed())

    async def _start_stream(
        self, method: str, version: str, url: bytes, headers: list[tuple[bytes, bytes]], keep_alive: bool
    ) -> None:
        # counted before the first await: _recycle, in the app's task of the response
        # before, arms the idle timeout only if no request has started since it began
        self.keep_alive_requests += 1
        await self.send(Updated(idle=False))
        self.method = method
        self.keep_alive = keep_alive
        self.request_complete = False
        self.response_complete = False
        self.response_started = False
        self.pending_head = b""
        self.stream = HTTPStream(
            self.app,
            self.config,
            self.context,
            self.task_group,
            self.ssl,
            self.client,
            self.server,
            self.stream_send,
            STREAM_ID,
        )
        await self.stream.handle(
            Request(
                stream_id=STREAM_ID,
                headers=headers,
                http_version=version,
                method=method,
                raw_path=url,
                state=self.connection_state,
            )
        )
        await self.context.mark_request()
        if version == "1.1" and (b"expect", b"100-continue") in headers:
            await self.send(RawData(data=b"HTTP/1.1 100 Continue\r\n\r\n"))

    # -- writing -------------------------------------------------------------------------

    async def stream_send(self, event: Any) -> None:
        if isinstance(event, Response):
            if event.status_code < 200:
                await self.send(
                    RawData(data=self._head(event.status_code, event.headers, informational=True))
                )
                return
            self.response_started = True
            head = self._head(event.status_code, event.headers)
            if self.has_length and not self.no_body:
                self.pending_head = head  # sent with the body: one write for a sized response
            else:
                await self.send(RawData(data=head))
        elif isinstance(event, InformationalResponse):
            pass  # HTTP/2 only (103 Early Hints)
        elif isinstance(event, Body):
            if self.no_body or not event.data:
                return
            data = b"%x\r\n%b\r\n" % (len(event.data), event.data) if self.chunked else event.data
            if self.pending_head:
                data, self.pending_head = self.pending_head + data, b""
            await self.send(RawData(data=data))
        elif isinstance(event, EndBody):
            data, self.pending_head = self.pending_head, b""
            if self.chunked:
                data += b"0\r\n\r\n"
            self.response_complete = True
            if data:
                await self.send(RawData(data=data))
        elif isinstance(event, StreamClosed):
            await self._recycle()

    def _head(self, status: int, headers: list[tuple[bytes, bytes]], *, informational: bool = False) -> bytes:
        parts = [_STATUS_LINES.get(status) or _status_line(status)]
        has_length = chunked = False
        for name, value in headers:
            if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name or b":" in name:
                raise ValueError(f"invalid response header {name!r}: {value!r}")
            lowered = name.lower()
            if lowered == b"content-length":
                has_length = True
            elif lowered == b"transfer-encoding":
                chunked = value.lower() == b"chunked"
                if not chunked:
                    raise ValueError(f"unsupported transfer-encoding {value!r}")
            elif lowered == b"connection" and value.lower() == b"close":
                self.keep_alive = False
                continue  # added below, once
            parts.append(name + b": " + value + b"\r\n")
        if self.include_date:
            parts.append(_DATE.get())
        parts.append(self.fixed_headers)
        if informational:
            parts.append(b"\r\n")
            return b"".join(parts)
        self.no_body = self.method == "HEAD" or status in _NO_BODY_STATUS
        self.has_length = has_length
        self.chunked = False
        if not has_length and not self.no_body:
            if chunked or self.parser.get_http_version() == "1.1":
                self.chunked = True
                if not chunked:
                    parts.append(b"transfer-encoding: chunked\r\n")
            else:
                self.keep_alive = False  # HTTP/1.0 without a length: the close ends the body
        if self.keep_alive_requests >= self.config.keep_alive_max_requests or not self.request_complete:
            self.keep_alive = False  # answered before its body arrived (a 401, a 413): say we close
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)

    async def _send_error(self, status: int) -> None:
        self.keep_alive = False
        self.method = "GET"
        head = self._head(status, [(b"content-length", b"0")])
        await self.send(RawData(data=head))

    async def _recycle(self) -> None:
        """The response is done: keep the connection for the next request, or close it.

        Decided before the first await: a next request may start while this runs (this
        runs in the app's task, which quart-trio may also be cancelling). The idle timeout
        is armed only if none has: a request that started meanwhile has disarmed it
        already, and arming it after that closed the connection in the middle of that
        request (issue 35). ``keep_alive_requests`` counts a request before anything of
        it awaits, and the timer changes its state before it yields, so the two tasks'
        calls land in the order they were decided."""
        keep = (
            not self.context.terminated.is_set()
            and self.keep_alive
            and self.request_complete
            and self.response_complete
            and not self.closing
        )
        if not keep:
            self.closing = True
        started = self.keep_alive_requests
        stream, self.stream = self.stream, None
        try:
            if stream is not None:
                await stream.handle(StreamClosed(stream_id=STREAM_ID))
        finally:
            await self.can_read.set()
        if not keep:
            await self.send(Closed())
        elif self.keep_alive_requests == started:  # else the next one started (and said not idle)
            await self.send(Updated(idle=True))

    async def _close_stream(self) -> None:
        if self.stream is not None:
            stream, self.stream = self.stream, None
            await stream.handle(StreamClosed(stream_id=STREAM_ID))


class _HeadTooLarge(Exception):
    """The request line and headers are over hypercorn's ``h11_max_incomplete_size``."""


__all__ = ["HttpToolsProtocol"]
