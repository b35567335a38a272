"""Connection surge: 1,500 clients connect at once (REST generate, then gRPC ModelInfer) with --api-workers 0 and 2; every client must get an answer.

    python benchmarks/soak.py surge [--clients 1500] [--shapes 0,2] [--backlog N]

Each client opens its own connection at the same moment and sends one request to the
``streamer`` model (REST ``POST /v2/models/streamer/generate``; gRPC ``ModelInfer``
with grpclib). Two cases per shape and transport: ``open`` (the server runs) and
``held`` (the serving processes are paused for 1 s while the clients connect, as a
server busy at that moment would be: only the listen backlog holds the connections).
A row per case: answered (a status), 2xx, 429, 503 (or RESOURCE_EXHAUSTED /
UNAVAILABLE), resets (connection refused, reset or closed with no answer), timeouts
(none within 60 s), listen overflows (the kernel's ``TcpExt ListenOverflows`` count
during the case: handshakes dropped because a listen queue was full, each retried by its
client 1 s, 3 s, ... later; machine-wide, so another program's overflows would count
too). ``--backlog 100`` shows hypercorn's and grpclib's old default.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time
from pathlib import Path

import numpy as np
import trio
import trio.testing

from ._subprocess_server import Served

BOUND = 60.0
NETSTAT = Path("/proc/net/netstat")


def listen_overflows() -> int:
    """The kernel's count of handshakes dropped on a full listen queue (Linux; else 0)."""
    try:
        header, values = [line.split() for line in NETSTAT.read_text().splitlines() if line.startswith("TcpExt:")][:2]
    except (OSError, ValueError):
        return 0
    return int(dict(zip(header[1:], values[1:], strict=True)).get("ListenOverflows", 0))


async def _rest_client(port: int, start: trio.Event, out: collections.Counter[str]) -> None:
    body = b'{"text_input": "surge", "parameters": {"n_tokens": 2}}'
    request = (
        f"POST /v2/models/streamer/generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    await start.wait()
    outcome = "timeout"
    with trio.move_on_after(BOUND):
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            outcome = "reset"
        else:
            async with stream:
                try:
                    await stream.send_all(request)
                    head = b""
                    while b"\r\n" not in head:
                        chunk = await stream.receive_some(4096)
                        if not chunk:
                            break
                        head += chunk
                    outcome = head.split(b" ", 2)[1].decode() if b"\r\n" in head else "reset"
                except (trio.BrokenResourceError, OSError):
                    outcome = "reset"
    out[outcome] += 1


async def _rest_surge(port: int, clients: int, served: Served, held: bool) -> collections.Counter[str]:
    out: collections.Counter[str] = collections.Counter()
    start = trio.Event()
    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(_rest_client, port, start, out)
        await trio.testing.wait_all_tasks_blocked(0.01)
        if held:
            served.pause()
        start.set()
        if held:
            await trio.sleep(1.0)
            served.resume()
    return out


async def _grpc_surge(port: int, clients: int, served: Served, held: bool) -> collections.Counter[str]:
    from grpclib.client import Channel
    from grpclib.const import Status
    from grpclib.exceptions import GRPCError, StreamTerminatedError

    from actorserve.codecs import tensor_from_numpy
    from actorserve.proto import inference as pb
    from actorserve.proto.convert import request_to_pb
    from actorserve.types import InferenceRequest

    text = tensor_from_numpy("text_input", np.array([b"surge"], dtype=object), "BYTES")
    message = request_to_pb(InferenceRequest(inputs=[text], parameters={"n_tokens": 2}), model_name="streamer")
    out: collections.Counter[str] = collections.Counter()
    start = asyncio.Event()
    names = {Status.RESOURCE_EXHAUSTED: "429", Status.UNAVAILABLE: "503"}

    async def client() -> None:
        await start.wait()
        channel = Channel("127.0.0.1", port)
        try:
            reply = await asyncio.wait_for(pb.GrpcInferenceServiceStub(channel).model_infer(message), BOUND)
            out["200" if reply.outputs else "other"] += 1
        except GRPCError as exc:
            out[names.get(exc.status, f"status {exc.status.name}")] += 1
        except TimeoutError:
            out["timeout"] += 1
        except (OSError, StreamTerminatedError, ConnectionError):
            out["reset"] += 1
        finally:
            channel.close()

    tasks = [asyncio.ensure_future(client()) for _ in range(clients)]
    await asyncio.sleep(0.05)
    if held:
        served.pause()
    start.set()
    if held:
        await asyncio.sleep(1.0)
        served.resume()
    await asyncio.gather(*tasks)
    return out


HEADER = "| shape | transport | case | clients | answered | 2xx | 429 | 503 | resets | timeouts | listen overflows | seconds |"


def _row(shape: int, transport: str, case: str, clients: int, out: collections.Counter[str], seconds: float) -> str:
    answered = sum(n for k, n in out.items() if k.isdigit() or k.startswith("status"))
    twoxx = sum(n for k, n in out.items() if k.startswith("2"))
    cells = [f"--api-workers {shape}", transport, case, clients, answered, twoxx, out["429"], out["503"],
             out["reset"], out["timeout"], out["listen overflows"], f"{seconds:.1f}"]  # fmt: skip
    return "| " + " | ".join(str(c) for c in cells) + " |"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="soak.py surge", description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1500)
    parser.add_argument("--shapes", default="0,2", help="--api-workers values, comma-separated")
    parser.add_argument("--backlog", type=int, default=None, help="the server's --backlog (default: its own)")
    args = parser.parse_args(argv)
    extra = ["--backlog", str(args.backlog)] if args.backlog else []
    print(HEADER)
    print("|---" * 12 + "|")
    failed = False
    for shape in (int(s) for s in args.shapes.split(",")):
        served = Served(shape, *extra)
        try:
            for transport in ("REST", "gRPC"):
                for held in (False, True):
                    began, overflows = time.monotonic(), listen_overflows()
                    if transport == "REST":
                        out = trio.run(_rest_surge, served.http_port, args.clients, served, held)
                    else:
                        out = asyncio.run(_grpc_surge(served.grpc_port, args.clients, served, held))
                    seconds = time.monotonic() - began
                    out["listen overflows"] = listen_overflows() - overflows
                    print(_row(shape, transport, "held 1 s" if held else "open", args.clients, out, seconds), flush=True)
                    failed |= out["reset"] + out["timeout"] > 0
        finally:
            served.stop()
    return 1 if failed else 0
