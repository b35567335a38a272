"""The gRPC transport: Triton's ``inference.GRPCInferenceService`` served by grpclib.

grpclib runs on asyncio only, so this is the one module of actorserve with asyncio code.
A grpclib handler (an asyncio task) reads the message and hands the work to a trio task
(``bridge.to_trio``); trio code reads and writes a stream's messages through
``bridge.to_aio``. Two bridges implement that and pass the same tests:

- ``"trio-asyncio"`` (the default): grpclib on a trio-asyncio loop inside the caller's
  trio run. One thread; nothing can block the other side.
- ``"thread"``: grpclib on a plain asyncio loop in its own thread. asyncio -> trio is
  ``TrioToken.run_sync_soon``, trio -> asyncio is ``call_soon_threadsafe``; neither side
  ever blocks waiting for the other (no ``trio.from_thread.run``).

Measured end to end (``benchmarks/grpc.py``, docs/grpc.md) neither wins everywhere: the
thread bridge does more concurrent unary calls/s, trio-asyncio has lower single-caller
latency and more streamed tokens/s, so the default stays trio-asyncio.

Who owns what:

- :func:`serve_grpc` owns the loop, the listening socket and the grpclib server;
  cancelling it drains (new calls get UNAVAILABLE, in-flight calls get
  ``settings.grace_period`` seconds) and then closes every connection. The trio sides
  of calls live in a nursery that outside cancellation does not reach until then.
- A unary call is one trio task. A client that cancels (or a deadline that expires)
  cancels the asyncio handler, which cancels the trio task, which leaves the engine's
  request: the engine drops it at its next step.
- A ``ModelStreamInfer`` call is a small trio nursery: a reader, a writer, and one task
  per request in flight (at most ``settings.grpc_stream_max_inflight``; past that the
  reader stops reading, which is backpressure all the way to the client). Responses of
  all requests go through one bounded channel to the writer.

Errors: domain errors map to a gRPC status through :mod:`actorserve.transport.errors`;
anything else is a bug, logged with its traceback and sent as INTERNAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
import weakref
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any, Final, Protocol, TypeVar

import trio
import trio_asyncio
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.protocol import H2Protocol
from grpclib.server import Server, Stream

from .. import __version__
from ..engine import Engine
from ..errors import ActorServeError, BadInput, ModelNotFound
from ..proto.convert import request_from_pb, response_to_pb
from ..proto.inference import (
    ModelInferRequest,
    ModelInferResponse,
    ModelMetadataRequest,
    ModelMetadataResponse,
    ModelMetadataResponseTensorMetadata,
    ModelReadyRequest,
    ModelReadyResponse,
    ModelStreamInferResponse,
    RepositoryIndexRequest,
    RepositoryIndexResponse,
    RepositoryIndexResponseModelIndex,
    RepositoryModelLoadRequest,
    RepositoryModelLoadResponse,
    RepositoryModelUnloadRequest,
    RepositoryModelUnloadResponse,
    ServerLiveRequest,
    ServerLiveResponse,
    ServerMetadataRequest,
    ServerMetadataResponse,
    ServerReadyRequest,
    ServerReadyResponse,
)
from ..settings import ModelSettings, Settings, SettingsError
from ..types import InferenceRequest
from .errors import client_message, grpc_status

log = logging.getLogger(__name__)

SERVICE: Final = "/inference.GRPCInferenceService/"

#: What ServerMetadata lists: the same as REST's ``GET /v2``.
EXTENSIONS: Final = ("binary_tensor_data", "generate", "model_repository", "parameters", "sequence", "streaming")

#: Metadata header with which a Triton client asks for a gRPC status instead of an
#: in-band ``error_message`` on ModelStreamInfer.
TRITON_GRPC_ERROR: Final = "triton_grpc_error"

#: Message encodings this server reads and writes (grpclib itself has none).
ENCODINGS: Final = ("gzip", "deflate")
_WBITS: Final = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}

#: Most responses the stream writer hands to the asyncio side in one hop.
_WRITE_BATCH: Final = 64

_PREFIX = struct.Struct(">?I")

#: How grpclib's asyncio meets trio: "thread" (grpclib on its own asyncio thread) or
#: "trio-asyncio" (grpclib on a trio-asyncio loop in the trio thread).
BRIDGES: Final = ("thread", "trio-asyncio")
DEFAULT_BRIDGE: Final = "trio-asyncio"

#: How long the trio side waits for a cancelled asyncio task to finish.
_AIO_CANCEL_TIMEOUT: Final = 5.0

T = TypeVar("T")

#: ``find_models(name)`` -> the settings of every version of model ``name``.
FindModels = Callable[[str], list[ModelSettings]]


async def serve_grpc(
    engine: Engine,
    settings: Settings,
    *,
    find_models: FindModels | None = None,
    bridge: str = DEFAULT_BRIDGE,
    sock: socket.socket | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the engine over gRPC on ``settings.host``:``settings.grpc_port`` until cancelled.

    Start it with ``await nursery.start(serve_grpc, engine, settings)``, which returns
    the bound ``(host, port)`` (port 0 picks a free one). On cancellation it stops
    accepting calls, gives in-flight calls up to ``settings.grace_period`` seconds
    (shielded), then cancels what is left and closes every connection.

    ``find_models(name)`` gives the settings of every version of a model for
    RepositoryModelLoad (default: the models in ``settings``). ``bridge`` chooses how
    grpclib's asyncio meets trio (see :data:`BRIDGES` and the module docstring).
    ``sock``: a bound, listening TCP socket to serve on instead of binding ``settings``'
    address; the caller keeps owning it and closes it.
    """
    if bridge not in BRIDGES:
        raise ValueError(f"bridge must be one of {', '.join(BRIDGES)}, got {bridge!r}")
    service = InferenceService(engine, settings, find_models)
    port = settings.grpc_port if settings.grpc_port is not None else 0
    # asyncio closes the socket it serves on: give it a duplicate, the caller's stays open
    listener = sock.dup() if sock is not None else _bind(settings.host, port)
    try:
        if bridge == "thread":
            async with _asyncio_thread() as thread_bridge:
                await _serve(service, thread_bridge, listener, task_status)
        else:
            async with trio_asyncio.open_loop():
                await _serve(service, _TrioAsyncioBridge(), listener, task_status)
    finally:
        listener.close()


async def _serve(
    service: InferenceService,
    bridge: _Bridge,
    listener: socket.socket,
    task_status: trio.TaskStatus[tuple[str, int]],
) -> None:
    service.bridge = bridge
    server = await bridge.to_aio(service.start, listener)
    host, port = listener.getsockname()[:2]
    log.info("gRPC listening on %s:%d", host, port)
    try:
        task_status.started((host, port))
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            service.drain_started.set()
            await bridge.to_aio(service.shut_down, server)


# --------------------------------------------------------------------------- bridges


class _Bridge(Protocol):
    """How asyncio (grpclib) and trio (the engine) call each other.

    ``to_trio`` is awaited on the asyncio side and runs a trio function in a new trio
    task; cancelling the awaiting asyncio task cancels that trio task. ``to_aio`` is
    awaited on the trio side and runs an asyncio coroutine function on grpclib's loop;
    cancelling the trio side cancels the asyncio task and waits (bounded) for it."""

    def to_trio(self, afn: Callable[..., Awaitable[T]], *args: Any) -> Awaitable[T]: ...

    async def to_aio(self, afn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T: ...


class _TrioAsyncioBridge:
    """grpclib on a trio-asyncio loop inside the trio run: one thread."""

    def to_trio(self, afn: Callable[..., Awaitable[T]], *args: Any) -> Awaitable[T]:
        return trio_asyncio.trio_as_aio(afn)(*args)  # type: ignore[no-any-return]

    async def to_aio(self, afn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        return await trio_asyncio.aio_as_trio(afn)(*args)  # type: ignore[no-any-return]


class _ThreadBridge:
    """grpclib on a plain asyncio loop in its own thread. Nothing blocks either loop:
    asyncio -> trio is ``TrioToken.run_sync_soon``, trio -> asyncio is
    ``call_soon_threadsafe``; each side waits on its own primitive."""

    def __init__(self, loop: asyncio.AbstractEventLoop, token: trio.lowlevel.TrioToken, nursery: trio.Nursery) -> None:
        self.loop = loop
        self.token = token
        #: owns the trio side of every bridged call
        self.nursery = nursery

    async def to_trio(self, afn: Callable[..., Awaitable[T]], *args: Any) -> T:
        done: asyncio.Future[T] = self.loop.create_future()
        call = _TrioCall()
        self.token.run_sync_soon(self._spawn, call, afn, args, done)
        try:
            return await done
        except asyncio.CancelledError:
            with contextlib.suppress(trio.RunFinishedError):
                self.token.run_sync_soon(call.cancel)
            raise

    def _spawn(self, call: _TrioCall, afn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], done: asyncio.Future[Any]) -> None:
        try:
            self.nursery.start_soon(self._run, call, afn, args, done)
        except RuntimeError:  # the nursery is closed: the server is gone
            self._post(done, None, GRPCError(Status.UNAVAILABLE, "the server is shutting down"))

    async def _run(self, call: _TrioCall, afn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], done: asyncio.Future[Any]) -> None:
        result: Any = None
        error: BaseException | None = asyncio.CancelledError()  # unless it finishes
        try:
            with trio.CancelScope() as call.scope:
                if call.cancelled:
                    call.scope.cancel()
                try:
                    result, error = await afn(*args), None
                except Exception as exc:
                    error = exc
        finally:
            self._post(done, result, error)

    def _post(self, done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self.loop.call_soon_threadsafe(_settle, done, result, error)

    async def to_aio(self, afn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        future = asyncio.run_coroutine_threadsafe(afn(*args), self.loop)
        finished = trio.Event()
        token = self.token

        def wake(_: object) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(finished.set)

        future.add_done_callback(wake)
        try:
            await finished.wait()
        except BaseException:
            future.cancel()
            with trio.CancelScope(shield=True), trio.move_on_after(_AIO_CANCEL_TIMEOUT) as waited:
                await finished.wait()
            if waited.cancelled_caught:
                log.error("gRPC: an asyncio task ignored its cancellation for %.0f s", _AIO_CANCEL_TIMEOUT)
            raise
        return future.result()


class _TrioCall:
    """The trio side of one bridged call, cancellable from the asyncio thread (through
    ``run_sync_soon``) before or after it started."""

    __slots__ = ("cancelled", "scope")

    def __init__(self) -> None:
        self.cancelled = False
        self.scope: trio.CancelScope | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if isinstance(error, asyncio.CancelledError):
        future.cancel()
    elif error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


@asynccontextmanager
async def _asyncio_thread() -> AsyncIterator[_ThreadBridge]:
    """A plain asyncio loop running in its own thread for as long as the block lasts.

    On exit: the trio sides of bridged calls are cancelled, then every asyncio task
    left is cancelled and awaited (bounded), then the loop stops and its thread ends."""
    # Made explicitly: importing trio_asyncio installs an event loop policy whose loops
    # only run inside trio.
    loop = asyncio.SelectorEventLoop()
    thread = threading.Thread(target=loop.run_forever, name="actorserve-grpc-asyncio", daemon=True)
    thread.start()
    bridge: _ThreadBridge | None = None
    try:
        async with trio.open_nursery() as nursery:
            # The trio sides of calls must outlive a cancellation of serve_grpc until
            # the drain is over, as trio-asyncio's own task nursery does: shielded,
            # cancelled explicitly at the end.
            calls, calls_scope = await nursery.start(_shielded_nursery)
            bridge = _ThreadBridge(loop, trio.lowlevel.current_trio_token(), calls)
            try:
                yield bridge
            finally:
                calls_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if bridge is not None:
                with trio.move_on_after(_AIO_CANCEL_TIMEOUT):
                    await bridge.to_aio(_cancel_other_tasks)
            loop.call_soon_threadsafe(loop.stop)
            await trio.to_thread.run_sync(thread.join)
            loop.close()


async def _shielded_nursery(
    *, task_status: trio.TaskStatus[tuple[trio.Nursery, trio.CancelScope]] = trio.TASK_STATUS_IGNORED
) -> None:
    with trio.CancelScope(shield=True) as scope:
        async with trio.open_nursery() as nursery:
            task_status.started((nursery, scope))
            await trio.sleep_forever()


async def _cancel_other_tasks() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _bind(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP explicitly: asyncio and grpclib set TCP_NODELAY only on sockets whose
    # proto says TCP; without it every call waits ~40 ms for Nagle + delayed ACKs.
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


class _Server(Server):
    """grpclib's server, plus what it lacks for us: the request headers of a call (its
    ``grpc-encoding`` and ``grpc-accept-encoding``, which grpclib drops) and the
    connections, so shutdown can close them."""

    def __init__(self, handlers: list[Any]) -> None:
        super().__init__(handlers)
        self._protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()

    def _protocol_factory(self) -> H2Protocol:
        protocol: H2Protocol = super()._protocol_factory()
        handler = protocol.handler
        accept = handler.accept

        def accept_keeping_headers(stream: Any, headers: Any, release_stream: Any) -> None:
            stream.headers = headers  # the attribute the client side uses for response headers
            accept(stream, headers, release_stream)

        handler.accept = accept_keeping_headers  # type: ignore[method-assign]
        self._protocols.add(protocol)
        return protocol

    def stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()

    def close_connections(self) -> None:
        for protocol in list(self._protocols):
            connection = getattr(protocol, "connection", None)
            if connection is not None and not connection.is_closing():
                connection.close()


# --------------------------------------------------------------------------- framing


class _Wire:
    """Reads and writes one call's messages.

    Without compression this is grpclib's own ``recv_message`` / ``send_message``.
    grpclib 0.4.9 implements no message compression (it raises on a compressed
    message), so when a client sends gzip or deflate, this reads and writes the
    length-prefixed frames itself on grpclib's HTTP/2 stream.
    """

    __slots__ = ("_headers_sent", "limit", "min_bytes", "recv_type", "request_encoding", "response_encoding", "stream")

    def __init__(self, stream: Stream[Any, Any], recv_type: Any, settings: Settings) -> None:
        self.stream = stream
        self.recv_type = recv_type
        self.min_bytes = settings.gzip_min_bytes
        self.limit = settings.max_body_bytes
        self._headers_sent = False
        encoding = accept = None
        for key, value in getattr(stream._stream, "headers", None) or ():
            if key == "grpc-encoding":
                encoding = value.strip().lower()
            elif key == "grpc-accept-encoding":
                accept = value
        self.request_encoding = None if encoding in (None, "identity") else encoding
        if self.request_encoding is not None and self.request_encoding not in ENCODINGS:
            raise GRPCError(
                Status.UNIMPLEMENTED,
                f"message encoding {encoding!r} is not supported (supported: identity, {', '.join(ENCODINGS)})",
            )
        # A client that compresses its request with an encoding it also accepts gets
        # responses in that encoding. grpc-accept-encoding alone is not asking: grpcio
        # sends "identity, deflate, gzip" on every call.
        accepted = {a.strip().lower() for a in accept.split(",")} if accept else set()
        self.response_encoding = self.request_encoding if self.request_encoding in accepted else None

    async def recv(self) -> Any:
        """The next message, or None when the client has half-closed."""
        if self.request_encoding is None:
            return await self.stream.recv_message()
        h2 = self.stream._stream
        prefix = await h2.recv_data(5)
        if not prefix:
            return None
        compressed, size = _PREFIX.unpack(prefix)
        if size > self.limit:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, f"message of {size} bytes is larger than {self.limit}")
        data = await h2.recv_data(size)
        if compressed:
            data = self._decompress(data)
        return self.recv_type.FromString(data)

    def _decompress(self, data: bytes) -> bytes:
        assert self.request_encoding is not None
        inflater = zlib.decompressobj(_WBITS[self.request_encoding])
        try:
            out = inflater.decompress(data, self.limit + 1)
        except zlib.error as exc:
            raise GRPCError(Status.INTERNAL, f"cannot decompress a {self.request_encoding} message: {exc}") from None
        if len(out) > self.limit:
            raise GRPCError(Status.RESOURCE_EXHAUSTED, f"message decompresses to more than {self.limit} bytes")
        return out

    async def send(self, message: Any) -> None:
        if self.response_encoding is None:
            await self.stream.send_message(message)
            return
        stream = self.stream
        data = message.SerializeToString()
        compressed = len(data) >= self.min_bytes
        if compressed:
            data = zlib.compress(data, 6, _WBITS[self.response_encoding])
        if not self._headers_sent:
            await stream._stream.send_headers([
                (":status", "200"),
                ("content-type", stream._content_type),
                ("grpc-encoding", self.response_encoding),
                ("grpc-accept-encoding", ",".join((*ENCODINGS, "identity"))),
            ])
            # Keep grpclib's own bookkeeping right: it sends the trailers at the end.
            stream._send_initial_metadata_done = True
            self._headers_sent = True
        await stream._stream.send_data(_PREFIX.pack(compressed, len(data)) + data)
        stream._send_message_done = True

    async def send_many(self, messages: list[Any]) -> None:
        for message in messages:
            await self.send(message)


# --------------------------------------------------------------------------- the service


def _status_error(exc: BaseException) -> GRPCError:
    """The gRPC status for an exception (a bug is logged and becomes INTERNAL)."""
    if isinstance(exc, GRPCError):
        return exc
    if not isinstance(exc, ActorServeError):
        log.error("gRPC: unexpected error", exc_info=exc)
    return GRPCError(grpc_status(exc), client_message(exc))


_Method = Callable[[Stream[Any, Any]], Awaitable[None]]


class InferenceService:
    """The grpclib handlers of ``GRPCInferenceService``, registered raw (not through
    betterproto2's generated base, whose bidi method is half-duplex).

    Handlers run on grpclib's asyncio loop and reach the engine only through
    ``bridge.to_trio``; call counting and draining live on the asyncio side too."""

    def __init__(self, engine: Engine, settings: Settings, find_models: FindModels | None = None) -> None:
        if settings.grpc_stream_dialect not in ("triton", "mlserver"):
            raise SettingsError(
                f"grpc_stream_dialect must be 'triton' or 'mlserver', got {settings.grpc_stream_dialect!r}"
            )
        if settings.grpc_stream_max_inflight < 1:
            raise SettingsError("grpc_stream_max_inflight must be >= 1")
        self.engine = engine
        self.settings = settings
        self.find_models = find_models
        self.bridge: _Bridge = _TrioAsyncioBridge()
        #: calls running (asyncio side)
        self.calls = 0
        #: refusing new calls (set on the asyncio side, read on both)
        self.draining = False
        #: set (on the trio side) when draining starts: streams stop reading then.
        self.drain_started = trio.Event()
        self._idle: asyncio.Event | None = None

    # -- lifecycle, on the asyncio side ---------------------------------------------------

    async def start(self, listener: socket.socket) -> _Server:
        self._idle = asyncio.Event()
        server = _Server([self])
        await server.start(sock=listener)
        return server

    async def shut_down(self, server: _Server) -> None:
        """Stop listening, refuse new calls, give the calls in flight the grace period,
        cancel the rest, close the connections."""
        grace = self.settings.grace_period
        self.draining = True
        server.stop_listening()
        if self.calls:
            assert self._idle is not None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace)
        if self.calls:
            log.warning("gRPC: cancelling %d call(s) still running after the grace period", self.calls)
        server.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(server.wait_closed(), max(grace, 1.0))
        server.close_connections()

    def __mapping__(self) -> dict[str, Handler]:
        unary = Cardinality.UNARY_UNARY
        stream_reply = ModelInferResponse if self.settings.grpc_stream_dialect == "mlserver" else ModelStreamInferResponse
        methods: list[tuple[str, _Method, Cardinality, Any, Any, bool]] = [
            ("ServerLive", self._server_live, unary, ServerLiveRequest, ServerLiveResponse, False),
            ("ServerReady", self._server_ready, unary, ServerReadyRequest, ServerReadyResponse, False),
            ("ModelReady", self._model_ready, unary, ModelReadyRequest, ModelReadyResponse, False),
            ("ServerMetadata", self._server_metadata, unary, ServerMetadataRequest, ServerMetadataResponse, False),
            ("ModelMetadata", self._model_metadata, unary, ModelMetadataRequest, ModelMetadataResponse, False),
            ("ModelInfer", self._model_infer, unary, ModelInferRequest, ModelInferResponse, True),
            (
                "ModelStreamInfer", self._model_stream_infer, Cardinality.STREAM_STREAM,
                ModelInferRequest, stream_reply, True,
            ),
            ("RepositoryIndex", self._repository_index, unary, RepositoryIndexRequest, RepositoryIndexResponse, False),
            (
                "RepositoryModelLoad", self._repository_model_load, unary,
                RepositoryModelLoadRequest, RepositoryModelLoadResponse, True,
            ),
            (
                "RepositoryModelUnload", self._repository_model_unload, unary,
                RepositoryModelUnloadRequest, RepositoryModelUnloadResponse, True,
            ),
        ]  # fmt: skip
        return {
            SERVICE + name: Handler(self._tracked(func) if work else func, cardinality, request, reply)
            for name, func, cardinality, request, reply, work in methods
        }

    def _tracked(self, func: _Method) -> _Method:
        """Count the call while it runs; refuse it while draining."""

        async def handler(stream: Stream[Any, Any]) -> None:
            if self.draining:
                raise GRPCError(Status.UNAVAILABLE, "the server is shutting down")
            self.calls += 1
            try:
                await func(stream)
            finally:
                self.calls -= 1
                if not self.calls and self._idle is not None:
                    self._idle.set()
                    self._idle.clear()  # wakes the current waiter; later ones wait again

        return handler

    def _wire(self, stream: Stream[Any, Any], recv_type: Any) -> _Wire:
        return _Wire(stream, recv_type, self.settings)

    async def _request(self, stream: Stream[Any, Any], recv_type: Any) -> tuple[_Wire, Any]:
        wire = self._wire(stream, recv_type)
        message = await wire.recv()
        if message is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "the call carried no request message")
        return wire, message

    async def _on_trio(self, fn: Callable[..., T], *args: Any) -> T:
        """Call a synchronous engine method on the trio side (its state belongs there)."""
        return await self.bridge.to_trio(_call_mapping_errors, fn, *args)

    # -- health and metadata --------------------------------------------------------------

    async def _server_live(self, stream: Stream[Any, Any]) -> None:
        wire, _ = await self._request(stream, ServerLiveRequest)
        await wire.send(ServerLiveResponse(live=True))

    async def _server_ready(self, stream: Stream[Any, Any]) -> None:
        wire, _ = await self._request(stream, ServerReadyRequest)
        ready = await self._on_trio(lambda: self.engine.ready)
        await wire.send(ServerReadyResponse(ready=ready and not self.draining))

    async def _model_ready(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self._request(stream, ModelReadyRequest)
        ready = await self._on_trio(self.engine.model_ready, message.name, message.version or None)
        await wire.send(ModelReadyResponse(ready=ready and not self.draining))

    async def _server_metadata(self, stream: Stream[Any, Any]) -> None:
        wire, _ = await self._request(stream, ServerMetadataRequest)
        await wire.send(ServerMetadataResponse(name="actorserve", version=__version__, extensions=list(EXTENSIONS)))

    async def _model_metadata(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self._request(stream, ModelMetadataRequest)
        meta = await self._on_trio(self.engine.metadata, message.name, message.version or None)
        await wire.send(
            ModelMetadataResponse(
                name=meta["name"],
                versions=list(meta.get("versions", [])),
                platform=meta.get("platform", ""),
                inputs=_tensor_metadata(meta.get("inputs", [])),
                outputs=_tensor_metadata(meta.get("outputs", [])),
            )
        )

    async def _repository_index(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self._request(stream, RepositoryIndexRequest)
        models = [
            RepositoryIndexResponseModelIndex(
                name=entry["name"], version=entry["version"], state=entry["state"], reason=entry["reason"]
            )
            for entry in await self._on_trio(self.engine.repository_index)
            if not message.ready or entry["state"] == "READY"
        ]
        await wire.send(RepositoryIndexResponse(models=models))

    # -- inference and management: trio tasks ------------------------------------------

    async def _model_infer(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self._request(stream, ModelInferRequest)
        reply = await self.bridge.to_trio(self._infer, message)
        await wire.send(reply)

    async def _infer(self, message: Any) -> Any:
        try:
            request = request_from_pb(message)
            response = await self.engine.infer(request)
            return response_to_pb(response)
        except Exception as exc:
            raise _status_error(exc) from None

    async def _repository_model_load(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self._request(stream, RepositoryModelLoadRequest)
        await self.bridge.to_trio(self._load, message)
        await wire.send(RepositoryModelLoadResponse())

    async def _load(self, message: Any) -> None:
        # As over REST: every version the repository has of the model; Triton's load
        # parameters (config overrides) are not supported.
        try:
            name = message.model_name
            if self.find_models is not None:
                versions = self.find_models(name)
            else:
                versions = [m for m in self.settings.models if m.name == name]
                if not versions:
                    raise ModelNotFound(f"model {name!r} is not in the model repository")
            for model_settings in versions:
                await self.engine.load(model_settings)
        except Exception as exc:
            raise _status_error(exc) from None

    async def _repository_model_unload(self, stream: Stream[Any, Any]) -> None:
        wire, message = await self._request(stream, RepositoryModelUnloadRequest)
        await self.bridge.to_trio(self._unload, message)
        await wire.send(RepositoryModelUnloadResponse())

    async def _unload(self, message: Any) -> None:
        try:
            await self.engine.unload(message.model_name, grace=self.settings.grace_period)
        except Exception as exc:
            raise _status_error(exc) from None

    # -- ModelStreamInfer ----------------------------------------------------------------

    async def _model_stream_infer(self, stream: Stream[Any, Any]) -> None:
        wire = self._wire(stream, ModelInferRequest)
        call: _StreamCall
        if self.settings.grpc_stream_dialect == "mlserver":
            call = _MLServerStream(self, wire)
        else:
            metadata: Mapping[str, Any] = stream.metadata or {}
            status_errors = str(metadata.get(TRITON_GRPC_ERROR, "")).strip().lower() in ("true", "1")
            call = _TritonStream(self, wire, status_errors=status_errors)
        await self.bridge.to_trio(call.run)


async def _call_mapping_errors(fn: Callable[..., T], *args: Any) -> T:
    try:
        return fn(*args)
    except Exception as exc:
        raise _status_error(exc) from None


def _tensor_metadata(specs: list[dict[str, Any]]) -> list[Any]:
    return [
        ModelMetadataResponseTensorMetadata(name=s["name"], datatype=s.get("datatype", ""), shape=list(s.get("shape", [])))
        for s in specs
    ]


# --------------------------------------------------------------------------- streams


class _Fatal:
    """Put in a stream's outbox: end the call with this status after what came before."""

    __slots__ = ("error",)

    def __init__(self, error: GRPCError) -> None:
        self.error = error


class _StreamCall:
    """One ``ModelStreamInfer`` call, as trio tasks: a writer draining one bounded
    outbox to the client, and whatever feeds it (see the subclasses).

    A fatal error is queued behind the responses before it (so the client gets them),
    then the writer ends the call with that status. When the server starts draining,
    ``reading`` is cancelled: no new request is read, the ones in flight finish, and
    the call ends with UNAVAILABLE.
    """

    def __init__(self, service: InferenceService, wire: _Wire) -> None:
        self.service = service
        self.engine = service.engine
        self.wire = wire
        self.bridge = service.bridge
        self.max_inflight = service.settings.grpc_stream_max_inflight
        #: subclasses read requests inside it
        self.reading = trio.CancelScope()
        self._cut_short = False
        self._fatal: GRPCError | None = None

    async def run(self) -> None:
        outbox, to_write = trio.open_memory_channel[Any](self.max_inflight)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write, to_write, nursery.cancel_scope)
            async with outbox, trio.open_nursery() as feeding:
                feeding.start_soon(self._stop_reading_on_drain)
                await self.feed(outbox)
                feeding.cancel_scope.cancel()
        if self._fatal is not None:
            raise self._fatal
        if self._cut_short:
            raise GRPCError(Status.UNAVAILABLE, "the server is shutting down")

    async def _stop_reading_on_drain(self) -> None:
        await self.service.drain_started.wait()
        self._cut_short = True
        self.reading.cancel()

    async def feed(self, outbox: trio.MemorySendChannel[Any]) -> None:
        raise NotImplementedError

    async def recv(self) -> Any:
        return await self.bridge.to_aio(self.wire.recv)

    async def _write(self, to_write: trio.MemoryReceiveChannel[Any], call_scope: trio.CancelScope) -> None:
        async with to_write:
            while True:
                try:
                    batch = [await to_write.receive()]
                except trio.EndOfChannel:
                    return
                while len(batch) < _WRITE_BATCH:
                    try:
                        batch.append(to_write.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                fatal = next((i for i, m in enumerate(batch) if isinstance(m, _Fatal)), None)
                messages = batch if fatal is None else batch[:fatal]
                if messages:
                    await self.bridge.to_aio(self.wire.send_many, messages)
                if fatal is not None:
                    self._fatal = batch[fatal].error
                    call_scope.cancel()
                    return


class _TritonStream(_StreamCall):
    """Triton's flavour: requests run concurrently, each answered by its own
    ``ModelStreamInferResponse`` messages; a request's error is in-band
    (``error_message``) and the stream goes on, unless the client sent
    ``triton_grpc_error: true``, which turns the first error into the call's status.

    Requests of one sequence (same ``sequence_id``) on this stream run one after the
    other in arrival order; ``sequence_cancel`` jumps the queue. Requests for a model
    with ``stream_input`` all go, in order, into one ``engine.stream`` call per model
    version, whose input ends when the client half-closes.
    """

    def __init__(self, service: InferenceService, wire: _Wire, *, status_errors: bool) -> None:
        super().__init__(service, wire)
        self.status_errors = status_errors
        self.slots = trio.Semaphore(self.max_inflight)
        #: sequence id -> set when the last request of that sequence read so far is done.
        self._sequence_tail: dict[str, trio.Event] = {}
        self._sessions: dict[tuple[str, str | None], _InputSession] = {}

    async def feed(self, outbox: trio.MemorySendChannel[Any]) -> None:
        async with trio.open_nursery() as requests:
            with self.reading:
                await self._read(requests, outbox)
            for session in self._sessions.values():
                session.inbox.close()  # no more requests: end those models' input

    async def _read(self, requests: trio.Nursery, outbox: trio.MemorySendChannel[Any]) -> None:
        while True:
            await self.slots.acquire()
            try:
                message = await self.recv()
            except BaseException:
                self.slots.release()
                raise
            if message is None:
                self.slots.release()
                return
            try:
                request = request_from_pb(message)
                session = self._session_for(request, requests, outbox)
            except Exception as exc:
                self.slots.release()
                await self._fail(outbox, message, exc)
                continue
            if session is not None:
                self.slots.release()  # the session's own inbox bounds it
                session.last = message
                try:
                    await session.inbox.send(request)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    await self._fail(outbox, message, BadInput(f"the request stream of model {session.key[0]!r} has ended"))
                continue
            wait_for, done = self._sequence_turn(request)
            requests.start_soon(self._serve, message, request, outbox.clone(), wait_for, done)

    def _sequence_turn(self, request: InferenceRequest) -> tuple[trio.Event | None, trio.Event | None]:
        """(what to wait for, what to set when done) to keep a sequence in order."""
        params = request.parameters
        raw_id = params.get("sequence_id") if params else None
        if raw_id is None or raw_id == 0 or raw_id == "" or params.get("sequence_cancel"):
            return None, None
        key = str(raw_id)
        done = trio.Event()
        previous = self._sequence_tail.get(key)
        self._sequence_tail[key] = done
        return previous, done

    async def _serve(
        self,
        message: Any,
        request: InferenceRequest,
        outbox: trio.MemorySendChannel[Any],
        wait_for: trio.Event | None,
        done: trio.Event | None,
    ) -> None:
        try:
            async with outbox:
                if wait_for is not None:
                    await wait_for.wait()
                try:
                    async with self.engine.infer_stream(request) as responses:
                        async for response in responses:
                            await outbox.send(ModelStreamInferResponse(infer_response=response_to_pb(response)))
                except Exception as exc:
                    await self._fail(outbox, message, exc)
        finally:
            self.slots.release()
            if done is not None:
                done.set()
                key = str(request.parameters["sequence_id"])
                if self._sequence_tail.get(key) is done:
                    del self._sequence_tail[key]

    def _session_for(
        self, request: InferenceRequest, requests: trio.Nursery, outbox: trio.MemorySendChannel[Any]
    ) -> _InputSession | None:
        """The stream-in session for the request's model, started on first use, or None
        if the model serves each request on its own."""
        try:
            host = self.engine.host(request.model_name, request.model_version)
        except ActorServeError:
            return None  # engine.infer_stream reports it
        if host.batched or not host.model_class.stream_input:
            return None
        key = (host.name, host.version)
        session = self._sessions.get(key)
        if session is None:
            session = _InputSession(key, self.max_inflight)
            self._sessions[key] = session
            requests.start_soon(self._run_session, session, outbox.clone())
        return session

    async def _run_session(self, session: _InputSession, outbox: trio.MemorySendChannel[Any]) -> None:
        try:
            async with outbox, session.requests:
                name, version = session.key
                try:
                    async with self.engine.stream(session.requests, model=name, version=version) as responses:
                        async for response in responses:
                            await outbox.send(ModelStreamInferResponse(infer_response=response_to_pb(response)))
                except Exception as exc:
                    await self._fail(outbox, session.last, exc)
        finally:
            if self._sessions.get(session.key) is session:
                del self._sessions[session.key]

    async def _fail(self, outbox: trio.MemorySendChannel[Any], message: Any, exc: BaseException) -> None:
        error = _status_error(exc)
        if self.status_errors:
            await outbox.send(_Fatal(error))
            return
        await outbox.send(
            ModelStreamInferResponse(
                error_message=error.message or "",
                infer_response=ModelInferResponse(
                    model_name=message.model_name if message is not None else "",
                    model_version=message.model_version if message is not None else "",
                    id=message.id if message is not None else "",
                ),
            )
        )


class _InputSession:
    """The requests of one stream that go to one stream-in model version."""

    __slots__ = ("inbox", "key", "last", "requests")

    def __init__(self, key: tuple[str, str | None], size: int) -> None:
        self.key = key
        self.inbox, self.requests = trio.open_memory_channel[InferenceRequest](size)
        self.last: Any = None


class _MLServerStream(_StreamCall):
    """MLServer's flavour: the whole request stream goes to one ``engine.stream`` call
    for the model named by the first request; responses are bare
    ``ModelInferResponse`` messages; an error ends the call with its status."""

    async def feed(self, outbox: trio.MemorySendChannel[Any]) -> None:
        inbox, requests = trio.open_memory_channel[InferenceRequest](self.max_inflight)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read, inbox, outbox.clone(), nursery.cancel_scope)
            async with requests:
                try:
                    first = await requests.receive()
                except trio.EndOfChannel:
                    return
                try:
                    async with aclosing(_prepend(first, requests)) as stream_in, self.engine.stream(
                        stream_in, model=first.model_name or "", version=first.model_version
                    ) as responses:
                        async for response in responses:
                            await outbox.send(response_to_pb(response))
                except Exception as exc:
                    await outbox.send(_Fatal(_status_error(exc)))
                    nursery.cancel_scope.cancel()

    async def _read(
        self,
        inbox: trio.MemorySendChannel[InferenceRequest],
        outbox: trio.MemorySendChannel[Any],
        call_scope: trio.CancelScope,
    ) -> None:
        async with inbox, outbox:
            with self.reading:
                while True:
                    message = await self.recv()
                    if message is None:
                        return
                    try:
                        request = request_from_pb(message)
                    except Exception as exc:
                        await outbox.send(_Fatal(_status_error(exc)))
                        call_scope.cancel()
                        return
                    try:
                        await inbox.send(request)
                    except trio.BrokenResourceError:
                        return  # the model stopped reading its input


async def _prepend(
    first: InferenceRequest, rest: AsyncIterator[InferenceRequest]
) -> AsyncGenerator[InferenceRequest, None]:
    yield first
    async for request in rest:
        yield request


__all__ = ["EXTENSIONS", "InferenceService", "serve_grpc"]
