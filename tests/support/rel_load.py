"""Load, storms and tallies of the overload / disconnect / memory reliability cases
(issue 14), shared by ``tests/reliability/test_rel_*.py`` and the long runs in
``benchmarks/reliability/`` (which put ``tests/`` on ``sys.path``).

Every call ends in exactly one :class:`Tally` bucket:

- ``ok``: the full answer (unary: a 200 with the right outputs; a stream: every expected
  response once, then the end of the stream / of the call);
- ``rejected``: 429 with ``Retry-After`` (REST; in a stream, an ``event: error`` whose
  status is 429) or ``RESOURCE_EXHAUSTED`` (gRPC; in a Triton stream, an
  ``error_message`` naming the bound);
- ``errors[kind]``: any other clear error (a status with a JSON ``error`` body, an
  ``event: error``, a gRPC status with a message); 5xx kinds are defects under overload;
- ``lost[kind]``: no final answer (reset, timeout, a stream cut without its end);
- ``duplicated``: a response repeated in a stream, or a second answer.

REST speaks HTTP/1.1 through ``h11`` on trio sockets (one connection per call, or a
kept-alive :class:`RestConn`), so a call can be cut at an exact point; gRPC uses grpclib
(the stack of the generated stubs) on a plain asyncio loop in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import attrs
import h2.exceptions
import h11
import numpy as np
import psutil
import trio
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from actorserve import InferenceRequest
from actorserve.codecs import tensor_from_numpy
from actorserve.proto import inference as pb
from actorserve.proto.convert import request_to_pb, response_from_pb

T = TypeVar("T")

#: A call that has no final answer after this many seconds is lost (timeout).
CALL_TIMEOUT = 60.0
#: the server's default keep-alive timeout: a connection silent that long may be closed
IDLE_TIMEOUT = 5.0
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
#: words of the Overloaded messages (``errors.Overloaded``): how a Triton stream's
#: in-band ``error_message`` says "rejected" (it has no status of its own)
OVERLOAD_WORDS = ("max_pending", "max_queue", "max_sequences", "already")


@attrs.define
class Tally:
    """Final answers of a run, by kind."""

    offered: int = 0
    ok: int = 0
    rejected: int = 0
    errors: Counter[str] = attrs.field(factory=Counter)
    lost: Counter[str] = attrs.field(factory=Counter)
    duplicated: int = 0
    #: seconds from start to final answer of the ``ok`` calls
    latencies: list[float] = attrs.field(factory=list, repr=False)

    def add(self, outcome: Outcome) -> None:
        self.offered += 1
        if outcome.kind == "ok":
            self.ok += 1
            self.latencies.append(outcome.seconds)
        elif outcome.kind == "rejected":
            self.rejected += 1
        elif outcome.kind == "error":
            self.errors[outcome.detail] += 1
        else:
            self.lost[outcome.detail] += 1
        self.duplicated += outcome.duplicates

    @property
    def answered(self) -> int:
        return self.ok + self.rejected + sum(self.errors.values())

    def p99(self) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]

    def merge(self, other: Tally) -> None:
        self.offered += other.offered
        self.ok += other.ok
        self.rejected += other.rejected
        self.errors.update(other.errors)
        self.lost.update(other.lost)
        self.duplicated += other.duplicated
        self.latencies.extend(other.latencies)


@attrs.frozen
class Outcome:
    kind: str  # ok | rejected | error | lost
    detail: str = ""
    seconds: float = 0.0
    duplicates: int = 0


# --------------------------------------------------------------------------- what to send


@attrs.frozen
class Case:
    """One model over one transport: what a call sends and what a right answer holds."""

    model: str
    #: responses a stream must carry (streamer: its tokens); 1 for unary
    responses: int = 1
    #: a per-call dict of request parameters (a fresh sequence id for stateful models)
    parameters: Callable[[int], dict[str, Any]] = lambda k: {}
    #: inputs as OIP JSON (REST) and as tensors (gRPC), for call number ``k``
    value: Callable[[int], int] = lambda k: k % 1000


def streamer_case(tokens: int = 4, delay: float = 0.0) -> Case:
    params: dict[str, Any] = {"n_tokens": tokens}
    if delay:
        params["delay"] = delay
    return Case("streamer", tokens, lambda k: dict(params))


def accumulator_case(prefix: str, *, end: bool = True) -> Case:
    """A sequence per call: started by it and (``end``) ended by it, or left open for the
    server to expire (so that opening sequences outruns ``max_sequences``)."""
    flags = {"sequence_start": True, "sequence_end": True} if end else {"sequence_start": True}
    return Case("accumulator", 1, lambda k: {"sequence_id": f"{prefix}-{k}", **flags})


def text_case(tokens: int = 4) -> Case:
    return Case("text", tokens, lambda k: {"max_tokens": tokens, "seed": k})


def rest_body(case: Case, k: int) -> bytes:
    if case.model == "accumulator":
        inputs = [{"name": "INPUT", "datatype": "INT64", "shape": [1], "data": [case.value(k)]}]
    else:
        inputs = [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]
    return json.dumps({"inputs": inputs, "parameters": case.parameters(k)}).encode()


def pb_request(case: Case, k: int) -> pb.ModelInferRequest:
    if case.model == "accumulator":
        tensor = tensor_from_numpy("INPUT", np.array([case.value(k)], dtype=np.int64))
    else:
        text = np.empty(1, dtype=object)
        text[0] = b"hi"
        tensor = tensor_from_numpy("text_input", text)
    request = InferenceRequest(inputs=[tensor], id=f"r{k}", parameters=case.parameters(k))
    return request_to_pb(request, model_name=case.model, raw=True)


def _check_outputs(case: Case, k: int, outputs: dict[str, Any]) -> str:
    """'' if the outputs of a unary answer are right, else what is wrong."""
    if case.model == "accumulator":
        got = outputs.get("OUTPUT")
        return "" if got == [case.value(k)] else f"wrong sum {got!r}"
    if case.model == "streamer":
        got = outputs.get("index")
        return "" if got == list(range(case.responses)) else f"wrong tokens {got!r}"
    return "" if "text_output" in outputs else "no text_output"


# --------------------------------------------------------------------------- REST


@attrs.frozen
class Cut:
    """Where a call is cut: ``body`` (half the request body sent), ``first`` (the whole
    request sent, nothing read), ``mid`` (after ``after`` events)."""

    where: str
    after: int = 1


class RestConn:
    """One HTTP/1.1 connection (kept alive across calls while the server allows)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.stream: trio.SocketStream | None = None
        self.conn = h11.Connection(h11.CLIENT)
        #: when the connection was made, and how long after it the request was sent (-1: not yet)
        self.opened_at, self.sent_after = time.monotonic(), -1.0

    async def _open(self) -> trio.SocketStream:
        if self.stream is None or self.conn.our_state is not h11.IDLE:
            await self.aclose()
            self.stream = await trio.open_tcp_stream(self.host, self.port)
            self.conn = h11.Connection(h11.CLIENT)
            self.opened_at = time.monotonic()
            self.sent_after = -1.0
        return self.stream

    async def aclose(self) -> None:
        if self.stream is not None:
            stream, self.stream = self.stream, None
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _send(self, *events: Any) -> None:
        assert self.stream is not None
        await self.stream.send_all(b"".join(self.conn.send(e) or b"" for e in events))

    async def _next(self) -> Any:
        assert self.stream is not None
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                data = await self.stream.receive_some(65536)
                self.conn.receive_data(data)
                continue
            return event

    async def call(
        self, path: str, body: bytes, *, stream: bool, cut: Cut | None = None
    ) -> tuple[int, dict[str, str], list[bytes]]:
        """POST ``body``; (status, headers, body chunks). With a ``cut``, the connection is
        closed at that point and (0, {}, []) returned."""
        await self._open()
        headers = [
            ("Host", f"{self.host}:{self.port}"),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
        ]
        if stream:
            headers.append(("Accept", "text/event-stream"))
        request = h11.Request(method="POST", target=path, headers=headers)
        if cut is not None and cut.where == "body":
            await self._send(request, h11.Data(data=body[: len(body) // 2]))
            await self.aclose()
            return 0, {}, []
        await self._send(request, h11.Data(data=body), h11.EndOfMessage())
        self.sent_after = time.monotonic() - self.opened_at
        if cut is not None and cut.where == "first":
            await self.aclose()
            return 0, {}, []
        response = await self._next()
        assert isinstance(response, h11.Response), response
        chunks: list[bytes] = []
        events = 0
        while True:
            event = await self._next()
            if isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
                events += bytes(event.data).count(b"\n\n")
                if cut is not None and cut.where == "mid" and events >= cut.after:
                    await self.aclose()
                    return 0, {}, []
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise h11.RemoteProtocolError("closed before the end of the response")
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        heads = {k.decode().lower(): v.decode() for k, v in response.headers}
        return response.status_code, heads, chunks


def sse_events(text: str) -> list[tuple[str, str]]:
    """(event, data) of each SSE event (event defaults to ``message``)."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        name, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
        out.append((name, "\n".join(data)))
    return out


def _outputs(answer: dict[str, Any]) -> dict[str, Any]:
    return {o["name"]: o["data"] for o in answer.get("outputs", [])}


def judge_rest(
    case: Case, k: int, stream: bool, status: int, headers: dict[str, str], body: bytes
) -> Outcome:
    if status == 429:
        return (
            Outcome("rejected") if "retry-after" in headers else Outcome("error", "429 without Retry-After")
        )
    if status != 200:
        try:
            message = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            return Outcome("error", f"{status} without a JSON error")
        return Outcome("error", f"{status} {str(message)[:60]}")
    if not stream:
        wrong = _check_outputs(case, k, _outputs(json.loads(body)))
        return Outcome("error", wrong) if wrong else Outcome("ok")
    seen: Counter[int] = Counter()
    for name, data in sse_events(body.decode()):
        if name == "error":
            error = json.loads(data)
            if "429" in str(error.get("status", "")) or any(
                w in str(error.get("error", "")) for w in OVERLOAD_WORDS
            ):
                return Outcome("rejected")
            return Outcome("error", f"event: error {str(error.get('error'))[:60]}")
        if name != "message":
            continue
        answer = json.loads(data)
        index = _outputs(answer).get("index")
        seen[int(index[0]) if index else sum(seen.values())] += 1
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    if case.model == "text":  # ends at max_tokens or a stop: some tokens, each once
        return Outcome("ok" if seen else "lost", "" if seen else "empty stream", duplicates=duplicates)
    if len(seen) < case.responses:
        return Outcome("lost", f"stream ended after {len(seen)} of {case.responses}", duplicates=duplicates)
    return Outcome("ok", duplicates=duplicates)


def rest_path(case: Case, stream: bool) -> str:
    return f"/v2/models/{case.model}/{'infer_stream' if stream else 'infer'}"


async def rest_call(
    host: str, port: int, case: Case, k: int, *, stream: bool, conn: RestConn | None = None
) -> Outcome:
    """One call, judged; on its own connection unless ``conn`` is given."""
    own = conn is None
    conn = conn or RestConn(host, port)
    start = time.monotonic()
    try:
        with trio.fail_after(CALL_TIMEOUT):
            status, headers, chunks = await conn.call(
                rest_path(case, stream), rest_body(case, k), stream=stream
            )
    except trio.TooSlowError:
        await conn.aclose()
        return Outcome("lost", "timeout")
    except (OSError, trio.BrokenResourceError, h11.RemoteProtocolError) as exc:
        await conn.aclose()
        if conn.sent_after < 0 or conn.sent_after > IDLE_TIMEOUT:  # the client's own loop was late
            return Outcome("lost", f"client late: closed idle ({type(exc).__name__})")
        return Outcome("lost", type(exc).__name__)
    finally:
        if own:
            await conn.aclose()
    outcome = judge_rest(case, k, stream, status, headers, b"".join(chunks))
    return attrs.evolve(outcome, seconds=time.monotonic() - start)


# --------------------------------------------------------------------------- gRPC


def judge_grpc_unary(case: Case, k: int, reply: Any) -> Outcome:
    response = response_from_pb(reply)
    outputs = {t.name: t.data.reshape(-1).tolist() for t in response.outputs}
    outputs = {n: [v.decode() if isinstance(v, bytes) else v for v in d] for n, d in outputs.items()}
    wrong = _check_outputs(case, k, outputs)
    return Outcome("error", wrong) if wrong else Outcome("ok")


def judge_grpc_error(exc: GRPCError) -> Outcome:
    if exc.status is Status.RESOURCE_EXHAUSTED:
        return Outcome("rejected")
    if exc.status is Status.CANCELLED or not exc.message:
        return Outcome("lost", f"{exc.status.name} {exc.message or ''}"[:60])
    return Outcome("error", f"{exc.status.name} {exc.message[:60]}")


async def grpc_call(channel: Channel, case: Case, k: int, *, stream: bool, cut: Cut | None = None) -> Outcome:
    """One gRPC call on ``channel`` (asyncio), judged; a ``cut`` cancels the call there."""
    start = time.monotonic()
    try:
        async with asyncio.timeout(CALL_TIMEOUT):
            if not stream:
                async with channel.request(
                    INFER, Cardinality.UNARY_UNARY, pb.ModelInferRequest, pb.ModelInferResponse
                ) as call:
                    await call.send_message(pb_request(case, k), end=True)
                    reply = await call.recv_message()
                outcome = (
                    judge_grpc_unary(case, k, reply) if reply is not None else Outcome("lost", "no reply")
                )
            else:
                outcome = await _grpc_stream(channel, case, k, cut)
    except TimeoutError:
        return Outcome("lost", "timeout")
    except GRPCError as exc:
        return judge_grpc_error(exc)
    except (OSError, StreamTerminatedError, ConnectionError) as exc:
        return Outcome("lost", type(exc).__name__)
    return attrs.evolve(outcome, seconds=time.monotonic() - start)


async def _cancel(call: Any) -> Outcome:
    """Cut the call (reset its HTTP/2 stream); if the server had already closed it, the
    call was done before the cut."""
    try:
        await call.cancel()
    except h2.exceptions.StreamClosedError:
        return Outcome("done")
    return Outcome("cut")


async def _grpc_stream(channel: Channel, case: Case, k: int, cut: Cut | None) -> Outcome:
    async with channel.request(
        STREAM_INFER, Cardinality.STREAM_STREAM, pb.ModelInferRequest, pb.ModelStreamInferResponse
    ) as call:
        await call.send_request()
        if cut is not None and cut.where == "body":
            return await _cancel(call)
        await call.send_message(pb_request(case, k), end=True)
        if cut is not None and cut.where == "first":
            return await _cancel(call)
        seen: Counter[int] = Counter()
        error: str | None = None
        async for message in call:
            if message.error_message:
                error = message.error_message
                continue
            response = response_from_pb(message.infer_response)
            index = next((t for t in response.outputs if t.name == "index"), None)
            seen[int(index.data.reshape(-1)[0]) if index is not None else sum(seen.values())] += 1
            if cut is not None and cut.where == "mid" and sum(seen.values()) >= cut.after:
                return await _cancel(call)
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    if error is not None:
        if any(w in error for w in OVERLOAD_WORDS):
            return Outcome("rejected", duplicates=duplicates)
        return Outcome("error", f"error_message {error[:60]}", duplicates=duplicates)
    if case.model == "accumulator":
        return Outcome(
            "ok" if len(seen) == 1 else "lost", "" if len(seen) == 1 else "no answer", duplicates=duplicates
        )
    if case.model == "text":
        return Outcome("ok" if seen else "lost", "" if seen else "empty stream", duplicates=duplicates)
    if len(seen) < case.responses:
        return Outcome("lost", f"stream ended after {len(seen)} of {case.responses}", duplicates=duplicates)
    return Outcome("ok", duplicates=duplicates)


def in_asyncio_thread(fn: Callable[[], Coroutine[Any, Any, T]]) -> Awaitable[T]:
    """Run ``fn()`` on a plain asyncio loop in a worker thread (from trio)."""

    def run() -> T:
        with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
            return runner.run(fn())

    return trio.to_thread.run_sync(run, abandon_on_cancel=False)


# --------------------------------------------------------------------------- load shapes


async def open_loop_trio(
    rate: float,
    seconds: float,
    limit: int,
    call: Callable[[int], Awaitable[Outcome]],
    *,
    on_time: bool = False,
) -> tuple[Tally, int]:
    """Start ``call(k)`` ``rate`` times a second for ``seconds`` whatever the answers
    (open loop), at most ``limit`` at once; (the tally, calls not started: ``limit``
    were running, or, with ``on_time``, this client could not start them all within
    ``seconds`` and stopped then)."""
    tally, skipped = Tally(), 0
    running = 0

    async def one(k: int) -> None:
        nonlocal running
        try:
            tally.add(await call(k))
        finally:
            running -= 1

    total = int(rate * seconds)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for k in range(total):
            await trio.sleep_until(start + k / rate)
            if on_time and trio.current_time() > start + seconds:  # this client fell behind: stop
                skipped += total - k
                break
            if running >= limit:
                skipped += 1
                continue
            running += 1
            nursery.start_soon(one, k)
    return tally, skipped


async def open_loop_asyncio(
    rate: float,
    seconds: float,
    limit: int,
    call: Callable[[int], Awaitable[Outcome]],
    *,
    on_time: bool = False,
) -> tuple[Tally, int]:
    """:func:`open_loop_trio` on asyncio (for grpclib)."""
    tally, skipped = Tally(), 0
    running: set[asyncio.Task[None]] = set()

    async def one(k: int) -> None:
        try:
            tally.add(await call(k))
        except Exception as exc:  # a bug of this client: counted, so that a test sees it
            tally.add(Outcome("error", f"client {exc!r}"))

    loop = asyncio.get_running_loop()
    total = int(rate * seconds)
    start = loop.time()
    for k in range(total):
        delay = start + k / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if on_time and loop.time() > start + seconds:  # this client fell behind: stop
            skipped += total - k
            break
        if len(running) >= limit:
            skipped += 1
            continue
        task = loop.create_task(one(k))
        running.add(task)
        task.add_done_callback(running.discard)
    if running:
        await asyncio.gather(*running)
    return tally, skipped


async def closed_loop_trio(
    concurrency: int, seconds: float, call: Callable[[int], Awaitable[Outcome]]
) -> Tally:
    """``concurrency`` callers back to back for ``seconds`` (capacity: ok per second)."""
    tally = Tally()
    counter = iter(range(10**9))
    deadline = trio.current_time() + seconds

    async def caller() -> None:
        while trio.current_time() < deadline:
            tally.add(await call(next(counter)))

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(caller)
    return tally


async def closed_loop_asyncio(
    concurrency: int, seconds: float, call: Callable[[int], Awaitable[Outcome]]
) -> Tally:
    tally = Tally()
    counter = iter(range(10**9))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds

    async def caller() -> None:
        while loop.time() < deadline:
            tally.add(await call(next(counter)))

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return tally


def random_cut(rng: random.Random, responses: int) -> Cut:
    where = rng.choice(("body", "first", "mid"))
    return Cut(where, rng.randint(1, max(1, responses - 1)))


# --------------------------------------------------------------------------- storms


async def sse_storm(
    host: str, port: int, case: Case, count: int, seed: int, concurrency: int = 64
) -> Counter[str]:
    """``count`` SSE streams of ``case``, each cut at a random point (half the body sent,
    the request sent and nothing read, or after some events); how many were cut where
    (``done``: the stream ended before its cut point)."""
    rng = random.Random(seed)
    cuts = [random_cut(rng, case.responses) for _ in range(count)]
    done: Counter[str] = Counter()
    limiter = trio.CapacityLimiter(concurrency)

    async def one(k: int, cut: Cut) -> None:
        async with limiter:
            conn = RestConn(host, port)
            try:
                with trio.fail_after(CALL_TIMEOUT):
                    status, _, _ = await conn.call(
                        rest_path(case, True), rest_body(case, k), stream=True, cut=cut
                    )
                done[cut.where if status == 0 else "done"] += 1
            except (OSError, trio.BrokenResourceError, h11.RemoteProtocolError):
                done[cut.where] += 1  # the server saw the cut first (e.g. a half body)
            finally:
                await conn.aclose()

    async with trio.open_nursery() as nursery:
        for k, cut in enumerate(cuts):
            nursery.start_soon(one, k, cut)
    return done


async def grpc_storm(
    host: str, port: int, case: Case, count: int, seed: int, concurrency: int = 64
) -> Counter[str]:
    """:func:`sse_storm` over gRPC ModelStreamInfer (asyncio; run it with
    :func:`in_asyncio_thread`)."""
    rng = random.Random(seed)
    cuts = [random_cut(rng, case.responses) for _ in range(count)]
    done: Counter[str] = Counter()
    limiter = asyncio.Semaphore(concurrency)

    async def one(channel: Channel, k: int, cut: Cut) -> None:
        async with limiter:
            outcome = await grpc_call(channel, case, k, stream=True, cut=cut)
            done[cut.where if outcome.kind == "cut" else "done"] += 1

    channels = [Channel(host, port) for _ in range(4)]  # several connections: both fronts
    try:
        await asyncio.gather(*(one(channels[k % len(channels)], k, cut) for k, cut in enumerate(cuts)))
    finally:
        for channel in channels:
            channel.close()
    return done


async def cut_sequences(host: str, port: int, count: int, prefix: str, within: float = 30.0) -> Counter[str]:
    """``count`` accumulator sequences over REST (a connection per request: a kept-alive
    one may be closed by the server while idle, as the cut runs): a first request (1), a
    second (10) cut at a varying point (half its body, nothing read, mid-answer), then a
    third (100, ending it) by the same id must be answered with a sum that holds the cut
    one or not (101 or 111). Raises AssertionError otherwise; the sums seen."""
    wheres = [Cut("body"), Cut("first"), Cut("mid")]
    case = Case("accumulator")
    seen: Counter[str] = Counter()

    async def call(data: bytes) -> tuple[int, list[bytes]]:
        conn = RestConn(host, port)
        try:
            status, _, chunks = await conn.call(rest_path(case, False), data, stream=False)
        finally:
            await conn.aclose()
        return status, chunks

    def body(value: int, sid: str, **flags: Any) -> bytes:
        inputs = [{"name": "INPUT", "datatype": "INT64", "shape": [1], "data": [value]}]
        return json.dumps({"inputs": inputs, "parameters": {"sequence_id": sid, **flags}}).encode()

    for k in range(count):
        sid = f"{prefix}-{k}"
        status, chunks = await call(body(1, sid, sequence_start=True))
        assert status == 200, (status, chunks)
        cut = RestConn(host, port)
        try:
            await cut.call(rest_path(case, True), body(10, sid), stream=True, cut=wheres[k % 3])
        except (OSError, trio.BrokenResourceError, h11.RemoteProtocolError):
            pass
        finally:
            await cut.aclose()
        with trio.fail_after(within):
            while True:  # the cut request may still run in its sequence: a 409 says so
                status, chunks = await call(body(100, sid, sequence_end=True))
                if status != 409:
                    break
                await trio.sleep(0.05)
        answer = json.loads(b"".join(chunks))
        assert status == 200, (status, answer)
        total = answer["outputs"][0]["data"][0]
        assert total in (101, 111), answer
        seen[str(total)] += 1
    return seen


# --------------------------------------------------------------------------- memory


def tree_rss(pid: int) -> int:
    """Resident bytes of process ``pid`` and every descendant (the whole server)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


class RssSampler:
    """The peak of :func:`tree_rss` sampled every ``interval`` s in a thread while in use."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self.pid, self.interval = pid, interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self.pid))
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


__all__ = [
    "CALL_TIMEOUT",
    "Case",
    "Cut",
    "Outcome",
    "RestConn",
    "RssSampler",
    "Tally",
    "accumulator_case",
    "closed_loop_asyncio",
    "closed_loop_trio",
    "cut_sequences",
    "grpc_call",
    "grpc_storm",
    "in_asyncio_thread",
    "judge_rest",
    "open_loop_asyncio",
    "open_loop_trio",
    "random_cut",
    "rest_call",
    "sse_storm",
    "sse_events",
    "streamer_case",
    "text_case",
    "tree_rss",
]
