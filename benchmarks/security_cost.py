"""What the worst request of each input kind costs a real server (prints numbers; not a test).

    python benchmarks/security_cost.py [--size-mib 8] [--shapes 0,1]

Starts ``python -m actorserve`` on 127.0.0.1 (free ports, ``--no-auth``, ``--max-body-bytes``
set to ``--size-mib``) serving ``identity`` and, when ``transformers`` is installed, a tiny
GPT-2 built as the tests build it, once per process shape (``--api-workers 0``: one
process; ``1``: a front beside the engine). Then sends, one at a time, each input kind's
worst case at the body limit (the cases of ``tests/security/test_sec_cost.py``): short
BYTES strings (answered, and past the count in gzip), numeric zeros, parameter keys,
nested parameters, a prompt (generate and ``/v1/completions``), gRPC raw strings and a
gRPC parameters map. For each it prints the size S after decompression, the status, the
time per MiB of S, the slowest ``/v2/health/live`` probe sent every 10 ms meanwhile
(another client's stall), and each process's peak RSS growth as a multiple of S. The
figures in docs/security.md#cost-bound come from this script.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

# Keep this folder off sys.path, or `import grpc` finds benchmarks/grpc.py.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import grpc
import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
INFER = "/inference.GRPCInferenceService/ModelInfer"
#: the per-request counts (actorserve/limits.py) the cases are sized against
MAX_BYTES_ELEMENTS = 1_000_000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """A server process started with free ports; :meth:`stop` ends its whole tree."""

    def __init__(self, folder: Path, workers: int, body_limit: int) -> None:
        self.http_port, self.grpc_port = _free_port(), _free_port()
        args = [sys.executable, "-m", "actorserve", "--host", "127.0.0.1", "--no-auth"]
        args += ["--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port)]
        args += ["--api-workers", str(workers), "--max-body-bytes", str(body_limit), str(folder)]
        self.process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.http = f"http://127.0.0.1:{self.http_port}"
        self.grpc = f"127.0.0.1:{self.grpc_port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.http}/v2/health/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("the server did not become ready in 120 s")

    def stop(self) -> None:
        tree = [self.process.pid]
        try:
            tree += [p.pid for p in psutil.Process(self.process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        for pid in tree[1:]:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass


def _role(process: psutil.Process) -> str:
    try:
        return process.environ().get("_ACTORSERVE_ROLE", "") or "parent"
    except psutil.Error:
        return "?"


class Watch:
    """Each process's peak RSS growth and the slowest health probe, in threads."""

    def __init__(self, server: Server) -> None:
        root = psutil.Process(server.process.pid)
        self.processes = [root, *root.children(recursive=True)]
        #: pid -> role (the parent names each child's in its environment)
        self.roles = {p.pid: _role(p) for p in self.processes}
        if len(self.processes) == 1:
            self.roles[root.pid] = "one process"
        self.before = {p.pid: p.memory_info().rss for p in self.processes}
        self.growth = dict.fromkeys(self.before, 0)
        self.slowest = 0.0
        self.http = server.http
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._sample), threading.Thread(target=self._probe)]

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            for p in self.processes:
                try:
                    self.growth[p.pid] = max(self.growth[p.pid], p.memory_info().rss - self.before[p.pid])
                except psutil.NoSuchProcess:
                    pass

    def _probe(self) -> None:
        with httpx.Client(base_url=self.http, timeout=30) as client:
            client.get("/v2/health/live")
            while not self._stop.wait(0.01):
                started = time.monotonic()
                client.get("/v2/health/live")
                self.slowest = max(self.slowest, time.monotonic() - started)

    def __enter__(self) -> Watch:
        for thread in self._threads:
            thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.05)
        self._stop.set()
        for thread in self._threads:
            thread.join()


# -- the cases -------------------------------------------------------------------------------


def _strings(count: int, value: str = "ab") -> bytes:
    data = (f'"{value}",' * count)[:-1]
    head = f'{{"inputs":[{{"name":"INPUT0","shape":[{count}],"datatype":"BYTES","data":['
    return (head + data + "]}]}").encode()


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out) + bytes([value])


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _raw_strings(count: int) -> bytes:
    tensor = _field(1, b"INPUT0") + _field(2, b"BYTES") + _field(3, _varint(count))
    return _field(1, b"identity") + _field(5, tensor) + _field(7, b"\x02\x00\x00\x00ab" * count)


Case = tuple[str, str, bytes, dict[str, str], int]  # kind, route, wire bytes, headers, S


def cases(limit: int, llm: bool) -> list[Case]:
    infer = "/v2/models/identity/infer"
    out: list[Case] = []
    count = min(MAX_BYTES_ELEMENTS, (limit - 200) // 5)
    body = _strings(count)
    out.append(("strings (answered)", infer, body, {}, len(body)))
    raw = _strings((limit - 200) // 4, "a")
    out.append(
        ("strings past the count, gzip", infer, gzip.compress(raw), {"Content-Encoding": "gzip"}, len(raw))
    )
    zeros = ",".join(["0"] * ((limit - 200) // 2))
    body = f'{{"inputs":[{{"name":"INPUT0","shape":[{(limit - 200) // 2}],"datatype":"INT64","data":[{zeros}]}}]}}'
    out.append(("numeric zeros (answered)", infer, body.encode(), {}, len(body)))
    keys = ",".join(f'"k{i:07d}":0' for i in range((limit - 200) // 13))
    body = f'{{"inputs":[],"parameters":{{{keys}}}}}'
    out.append(("parameter keys", infer, body.encode(), {}, len(body)))
    tensor = '{"name":"INPUT0","shape":[1],"datatype":"INT32","data":[1]}'
    body = f'{{"inputs":[{tensor}],"parameters":{{"p":{"[" * 9 + "]" * 9}}}}}'
    out.append(("parameters nested 9 deep", infer, body.encode(), {}, len(body)))
    if llm:
        prompt = "To be, or not to be " * ((limit - 200) // 20)
        for kind, path, key in (
            ("prompt, generate", "/v2/models/llm/generate", "text_input"),
            ("prompt, /v1/completions", "/v1/completions", "prompt"),
        ):
            body = json.dumps({key: prompt, "model": "llm", "max_tokens": 1}).encode()
            out.append((kind, path, body, {}, len(body)))
    message = _raw_strings(min(MAX_BYTES_ELEMENTS, (limit - 200) // 6))
    out.append(("gRPC raw strings (answered)", "grpc", message, {}, len(message)))
    entry = _field(4, _field(1, b"k") + _field(2, _field(3, b"v")))
    message = _field(1, b"identity") + entry * ((limit - 100) // len(entry))
    out.append(("gRPC parameters map", "grpc", message, {}, len(message)))
    return out


def send(server: Server, route: str, wire: bytes, headers: dict[str, str]) -> str:
    if route == "grpc":
        options = [("grpc.max_send_message_length", 1 << 30), ("grpc.max_receive_message_length", 1 << 30)]
        with grpc.insecure_channel(server.grpc, options=options) as channel:
            call = channel.unary_unary(INFER, request_serializer=bytes, response_deserializer=lambda b: b)
            try:
                call(wire, timeout=300)
            except grpc.RpcError as error:
                return str(error.code().name)
            return "OK"
    reply = httpx.post(
        f"{server.http}{route}",
        content=wire,
        headers={"Content-Type": "application/json", **headers},
        timeout=300,
    )
    return str(reply.status_code)


def run(workers: int, limit: int, llm: bool, folder: Path, print_row: Callable[[str], None]) -> None:
    server = Server(folder, workers, limit)
    try:
        send(server, "/v2/models/identity/infer", _strings(100_000), {})  # one-time costs first
        for kind, route, wire, headers, size in cases(limit, llm):
            with Watch(server) as watch:
                started = time.monotonic()
                status = send(server, route, wire, headers)
                seconds = time.monotonic() - started
            multiples = ", ".join(
                f"{watch.roles[pid]} {g / size:.1f}" for pid, g in watch.growth.items() if g > 0
            )
            mib = size / 2**20
            print_row(
                f"| {workers} | {kind} | {mib:.1f} | {status} | {seconds / mib * 1000:.0f} | "
                f"{watch.slowest * 1000:.0f} | {multiples} |"
            )
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mib", type=float, default=8.0, help="the body limit, and the cases' size")
    parser.add_argument("--shapes", default="0,1", help="--api-workers values to run")
    args = parser.parse_args(argv)
    limit = int(args.size_mib * 2**20)
    folder = Path(tempfile.mkdtemp(prefix="security-cost-"))
    try:
        (folder / "identity").mkdir()
        (folder / "identity" / "model-settings.json").write_text(
            json.dumps({"name": "identity", "implementation": "actorserve.models.identity.IdentityModel"})
        )
        llm = True
        try:
            sys.path.insert(0, str(ROOT / "tests"))
            from support.tiny_llm import build

            build(folder / "llm", "gpt2", dtype="float32")
        except ImportError:
            llm = False
        print(
            "| api-workers | case | S (MiB) | status | ms per MiB | slowest probe (ms) | peak growth per process (x S) |"
        )
        print("|---|---|---|---|---|---|---|")
        for workers in (int(w) for w in args.shapes.split(",")):
            run(workers, limit, llm, folder, lambda row: print(row, flush=True))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
