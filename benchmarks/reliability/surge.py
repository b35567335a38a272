"""Connection surge: 1,500 clients connect at once (REST generate, then gRPC ModelInfer) with --api-workers 0 and 2; every client must get an answer.

    python benchmarks/soak.py surge [--clients 1500] [--shapes 0,2] [--backlog N]

Each client opens its own connection at the same moment and sends one request to the
``streamer`` model (REST ``POST /v2/models/streamer/generate``; gRPC ``ModelInfer``
with grpclib), with the server running (``open``). A row: answered (an HTTP status or a
gRPC status), 2xx, 429, 503 (or RESOURCE_EXHAUSTED / UNAVAILABLE), resets (connection
refused, reset or closed with no answer), timeouts (none within 60 s).

``held``: what the listen backlog alone holds. The serving processes are paused while
the clients connect (as a server busy at that moment would be): every client starts its
connect, and the row says how many handshakes completed within 0.5 s ("queued"; a
handshake the kernel dropped on a full queue is retried by the client 1 s later, so it
cannot). Then the server resumes; REST clients send their request on the connection they
got and the row counts the answers (gRPC ones just close). ``--backlog 100`` shows
hypercorn's and grpclib's old default.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time

import numpy as np
import trio
from support.rel_surge import Outcome, answers_on, connect_all, generate_request, http_surge

from ._subprocess_server import Served

BOUND = 60.0
HELD_WINDOW = 0.5


def _statuses(outcomes: collections.Counter[Outcome]) -> collections.Counter[str]:
    return collections.Counter({str(k): n for k, n in outcomes.items()})


def held_case(served: Served, port: int, clients: int, rest: bool) -> collections.Counter[str]:
    served.pause()
    try:
        socks = connect_all("127.0.0.1", port, clients, HELD_WINDOW)
    finally:
        served.resume()
    done = [sock for sock, connected in socks if connected]
    for sock, connected in socks:
        if not connected:
            sock.close()
    out: collections.Counter[str] = collections.Counter({"queued": len(done)})
    if rest:
        out.update(_statuses(trio.run(answers_on, done, generate_request("127.0.0.1", port), BOUND)))
    else:
        for sock in done:
            sock.close()
    return out


async def _rest_surge(port: int, clients: int) -> collections.Counter[str]:
    return _statuses(await http_surge("127.0.0.1", port, clients, bound=BOUND))


async def _grpc_surge(port: int, clients: int) -> collections.Counter[str]:
    from grpclib.client import Channel
    from grpclib.const import Status
    from grpclib.exceptions import GRPCError, StreamTerminatedError

    from actorserve.codecs import tensor_from_numpy
    from actorserve.proto import inference as pb
    from actorserve.proto.convert import request_to_pb
    from actorserve.types import InferenceRequest

    text = tensor_from_numpy("text_input", np.array([b"surge"], dtype=object), "BYTES")
    message = request_to_pb(
        InferenceRequest(inputs=[text], parameters={"n_tokens": 2}), model_name="streamer"
    )
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
    start.set()
    await asyncio.gather(*tasks)
    return out


HEADER = "| shape | transport | case | clients | queued (held) | answered | 2xx | 429 | 503 | resets | timeouts | seconds |"


def _row(
    shape: int, transport: str, case: str, clients: int, out: collections.Counter[str], seconds: float
) -> str:
    answered = sum(n for k, n in out.items() if k.isdigit() or k.startswith("status"))
    twoxx = sum(n for k, n in out.items() if k.startswith("2"))
    queued = out["queued"] if case == "held" else "-"
    answers = [answered, twoxx, out["429"], out["503"], out["reset"], out["timeout"]]
    if case == "held" and transport == "gRPC":
        answers = ["-"] * len(answers)  # the held gRPC connections are only counted
    cells = [f"--api-workers {shape}", transport, case, clients, queued, *answers, f"{seconds:.1f}"]
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
                port = served.http_port if transport == "REST" else served.grpc_port
                for case in ("open", "held"):
                    began = time.monotonic()
                    if case == "held":
                        out = held_case(served, port, args.clients, transport == "REST")
                    elif transport == "REST":
                        out = trio.run(_rest_surge, port, args.clients)
                    else:
                        out = asyncio.run(_grpc_surge(port, args.clients))
                    seconds = time.monotonic() - began
                    print(_row(shape, transport, case, args.clients, out, seconds), flush=True)
                    failed |= out["reset"] + out["timeout"] > 0 or (
                        case == "held" and out["queued"] < args.clients
                    )
        finally:
            served.stop()
    return 1 if failed else 0
