"""Shutdown: SIGTERM under load and idle, --api-workers 0 and 2: in-flight requests finish, new ones get 503, running streams end with a last message, an idle server exits at once.

    python benchmarks/soak.py shutdown [--streams 20] [--grace 2] [--rounds 5] [--shapes 0,2]

Under load: ``--streams`` SSE ``POST generate_stream``, as many ``GET generate_stream``
and as many gRPC ``ModelStreamInfer`` calls (tritonclient) run streams longer than the
grace period, while as many clients send short ``generate`` requests (0.5 s each) in a
loop. SIGTERM; during the drain 50 new requests on new connections. A row per shape:
short requests answered 200 / cut, new requests 503, SSE streams ended with ``event:
error`` (+ ``event: end`` on GET) / cut, gRPC streams ended UNAVAILABLE "the server is
shutting down" / other, seconds from SIGTERM to exit, exit code. Idle: SIGTERM to exit
of a server with a kept-alive connection and nothing in flight, over ``--rounds`` starts.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import statistics
import threading
import time

import httpx
import numpy as np
import trio

from ._subprocess_server import Served

SHUTTING_DOWN = "the server is shutting down"
VERBOSE = False


def _sse(url: str, method: str, out: collections.Counter[str], lock: threading.Lock) -> None:
    query = {"text_input": "g", "n_tokens": 10_000, "delay": 0.01}
    body = {"text_input": "p", "parameters": {"n_tokens": 10_000, "delay": 0.01}}
    try:
        with (
            httpx.Client(base_url=url, timeout=60) as client,
            client.stream(
                method,
                "/v2/models/streamer/generate_stream",
                **({"params": query} if method == "GET" else {"json": body}),
            ) as response,
        ):
            lines = [line for line in response.iter_lines() if line]
        shut = f'data: {{"error":"{SHUTTING_DOWN}","status":503}}'
        want = ["event: error", shut, "event: end", "data: {}"] if method == "GET" else ["event: error", shut]
        outcome = "last message" if lines[-len(want) :] == want else "other end"
    except httpx.HTTPError as exc:
        outcome = f"cut ({type(exc).__name__})"
    with lock:
        out[f"{method} {outcome}"] += 1


async def _grpc_streams(
    port: int, count: int, out: collections.Counter[str], started: threading.Event
) -> None:
    """``count`` ModelStreamInfer calls (grpclib), each one long request; how each ends."""
    from grpclib.client import Channel
    from grpclib.const import Cardinality, Status
    from grpclib.exceptions import GRPCError

    from actorserve.codecs import tensor_from_numpy
    from actorserve.proto import inference as pb
    from actorserve.proto.convert import request_to_pb
    from actorserve.types import InferenceRequest

    text = tensor_from_numpy("text_input", np.array([b"s"], dtype=object), "BYTES")
    message = request_to_pb(
        InferenceRequest(inputs=[text], id="1", parameters={"n_tokens": 10_000, "delay": 0.01}),
        model_name="streamer",
    )

    async def one() -> None:
        channel = Channel("127.0.0.1", port)
        try:
            async with channel.request(
                "/inference.GRPCInferenceService/ModelStreamInfer",
                Cardinality.STREAM_STREAM,
                pb.ModelInferRequest,
                pb.ModelStreamInferResponse,
            ) as call:
                # half-closed at once (the request runs on; the server then ends the call
                # when it is done): grpclib's client reports a status only on a call it ended
                await call.send_message(message, end=True)
                async for _ in call:
                    started.set()
            outcome = "gRPC OK"
        except GRPCError as exc:
            ok = exc.status == Status.UNAVAILABLE and SHUTTING_DOWN in (exc.message or "")
            outcome = (
                "gRPC UNAVAILABLE shutting down" if ok else f"gRPC other: {exc.status.name} {exc.message}"
            )
        except Exception as exc:
            outcome = f"gRPC other: {type(exc).__name__} {exc}"
        finally:
            channel.close()
        out[outcome] += 1

    await asyncio.gather(*(one() for _ in range(count)))


def _short(url: str, stop: threading.Event, out: collections.Counter[str], lock: threading.Lock) -> None:
    body = {"text_input": "u", "parameters": {"n_tokens": 10, "delay": 0.05}}
    while not stop.is_set():
        try:
            with httpx.Client(base_url=url, timeout=60) as client:
                status = client.post("/v2/models/streamer/generate", json=body).status_code
            outcome = f"short {status}"
        except httpx.HTTPError as exc:
            outcome = f"short refused or cut ({type(exc).__name__})"
        with lock:
            out[outcome] += 1
        if not outcome.startswith("short 2"):
            return


async def _newcomers(url: str, count: int, out: collections.Counter[str]) -> None:
    """``count`` new requests at once, each on a new connection (one client: making a
    client per request costs an SSL context each, which made them late)."""

    async def one(client: httpx.AsyncClient) -> None:
        try:
            reply = await client.post(f"{url}/v2/models/streamer/generate", json={"text_input": "n"})
            outcome = f"new {reply.status_code}"
        except httpx.HTTPError as exc:
            outcome = f"new refused ({type(exc).__name__})"
        out[outcome] += 1

    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=10, limits=limits) as client, trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one, client)


def under_load(shape: int, streams: int, grace: float) -> tuple[collections.Counter[str], float, int]:
    served = Served(shape, "--grace-period", str(grace))
    out: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    stop = threading.Event()
    started = threading.Event()
    threads = [
        threading.Thread(target=_sse, args=(served.url, m, out, lock))
        for m in ("POST", "GET")
        for _ in range(streams)
    ]
    threads.append(
        threading.Thread(target=lambda: asyncio.run(_grpc_streams(served.grpc_port, streams, out, started)))
    )
    threads += [threading.Thread(target=_short, args=(served.url, stop, out, lock)) for _ in range(streams)]
    for thread in threads:
        thread.start()
    started.wait(30)
    time.sleep(1.0)
    exited: list[float] = []
    waiter = threading.Thread(target=lambda: (served.process.wait(), exited.append(time.monotonic())))
    served.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    waiter.start()
    time.sleep(0.2)
    stop.set()
    trio.run(_newcomers, served.url, 50, out)  # new requests during the drain, all at once
    waiter.join(timeout=120)
    code = served.process.wait(timeout=1)
    took = exited[0] - signalled
    for thread in threads:
        thread.join(timeout=60)
    served.stop()
    for line in served.lines:  # anything the server found wrong
        if " ERROR " in line or "Traceback" in line:
            out[f"server log: {line[line.find(' ERROR ') + 1 :][:120]}"] += 1
    if VERBOSE:
        print(
            "\n".join(
                line for line in served.lines if "shutting" in line or "WARNING" in line or "stopp" in line
            )
        )
    return out, took, code


def idle(shape: int, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        served = Served(shape, "--grace-period", "10")
        with httpx.Client(base_url=served.url, timeout=10) as client:
            client.get("/v2/health/ready")  # a kept-alive connection
            served.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            served.process.wait(timeout=60)
            times.append(time.monotonic() - signalled)
        served.stop()
    return times


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="soak.py shutdown", description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--grace", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shapes", default="0,2")
    parser.add_argument(
        "--verbose", action="store_true", help="the server's shutdown log lines, every outcome"
    )
    args = parser.parse_args(argv)
    global VERBOSE
    VERBOSE = args.verbose
    shapes = [int(s) for s in args.shapes.split(",")]
    failed = False
    print(
        "| shape | short 200 | short cut | new 503 | new refused | SSE POST last message / cut | SSE GET last message / cut "
        "| gRPC UNAVAILABLE / other | SIGTERM to exit (s) | exit code |"
    )
    print("|---" * 10 + "|")
    for shape in shapes:
        out, took, code = under_load(shape, args.streams, args.grace)
        other = sum(n for k, n in out.items() if k.startswith("gRPC other"))
        cut = (
            out["POST cut"]
            + out["GET cut"]
            + out["POST other end"]
            + out["GET other end"]
            + out["short refused or cut"]
        )
        print(
            f"| --api-workers {shape} | {out['short 200']} | {out['short refused or cut']} | {out['new 503']} "
            f"| {sum(n for k, n in out.items() if k.startswith('new refused'))} | {out['POST last message']} / {out['POST cut'] + out['POST other end']} "
            f"| {out['GET last message']} / {out['GET cut'] + out['GET other end']} "
            f"| {out['gRPC UNAVAILABLE shutting down']} / {other} | {took:.2f} | {code} |",
            flush=True,
        )
        if other or cut or code or args.verbose:
            failed = failed or bool(other or cut or code)
            print("  details:", dict(out))
    print()
    print("| shape | idle: SIGTERM to exit, median (s) | min | max | rounds |")
    print("|---|---|---|---|---|")
    for shape in shapes:
        times = idle(shape, args.rounds)
        print(
            f"| --api-workers {shape} | {statistics.median(times):.3f} | {min(times):.3f} | {max(times):.3f} | {len(times)} |",
            flush=True,
        )
    return 1 if failed else 0
