"""actorserve's ``vllm`` or ``transformers`` runtime against vLLM's own OpenAI server: the
same checkpoint, the same client, back to back on loopback (prints numbers; not a test).

The full comparison (issue 37's numbers; run it on a quiet machine, nothing else busy: the
two servers share its CPUs with the client), in vLLM's environment (.ci/install-vllm):

    .venv-vllm/bin/python benchmarks/vllm_compare.py

(all three doors, c = 1 / 8 / 32, 128 prompt / 128 output tokens, a 10-turn chat). A short
check that it runs (a tiny model, a few requests a point; its numbers mean nothing):

    .venv-vllm/bin/python benchmarks/vllm_compare.py --width 128 --layers 2 --eager \\
        --points 1,8 --requests 8 --prompt 32 --tokens 16 --turns 3 --answer 8

Runtimes (``--runtime``):
- ``vllm`` (the default; issue 37): actorserve's ``vllm`` runtime with the same engine
  arguments as vLLM's server (``--dtype``, default float32 for both);
- ``transformers`` (issue 36): actorserve's ``transformers`` runtime (its defaults: dtype
  ``auto``, bf16 on a CPU with AVX-512 BF16 or AMX, else fp32; eager decode) against
  vLLM's server with its own defaults (dtype ``auto``: bf16 for this fp32 checkpoint on an
  x86 CPU). That runtime needs transformers >= 5.24 and vLLM < 5.20, so actorserve's
  server runs under the main environment's Python (``--actorserve-python``, default
  ``.venv/bin/python`` for this runtime), the script, its client and vLLM's server under
  ``.venv-vllm``'s. ``--dtype float32`` runs both in fp32 (then both answer as
  ``transformers``' fp32 ``generate``; in bf16 their kernels round differently, so their
  greedy texts may part after a few tokens).
``--pin``: each server's process tree on one CPU (the first the script may use; its
children inherit it), the script's client on the others: issue 36's pinned row is
``--pin --dtype float32``.

Builds a Llama of realistic CPU shape (width 512, 8 layers, a 4,096-token byte-level BPE
vocabulary: ~30 M parameters) in a temporary folder (its weights fp32, its files as the
script's transformers writes them; 5.24 reads them), then for each server in turn
(``python -m actorserve FOLDER`` with a ``vllm`` or ``transformers`` model, then
``python -m vllm.entrypoints.openai.api_server``), after a warm-up at every c:
- c = 1 / 8 / 32, through each door (``--doors``): ``--requests`` (default 2c, at least 4)
  streamed requests of ``--prompt`` Shakespeare tokens (a different offset each),
  ``--tokens`` new tokens, greedy, c at a time, each of the c clients on its own connection:
  - ``openai``: ``/v1/completions``, the request shape of ``vllm bench serve``'s
    openai-completions backend less the two fields actorserve refuses today
    (``repetition_penalty: 1.0``, ``ignore_eos``; see the transformers-runtime issue);
  - ``oip``: OIP REST ``/v2/models/llama/generate_stream`` (SSE), ``text_input`` and the
    parameters ``max_tokens``, ``temperature: 0``, ``usage: true``;
  - ``grpc``: ``ModelStreamInfer`` (the Triton dialect) through tritonclient's asyncio
    client, one call per client, its requests one after another on it: ``text_input``
    BYTES [1], the same parameters, read up to the response with ``finish_reason``;
  vLLM's server has only the ``openai`` door: every actorserve row is compared with
  vLLM's ``openai`` row of the same c. Per row: tokens/s = completion tokens (usage) / wall
  time, TTFT p50, ITL p99 (the gaps between the streamed pieces of a request, pooled, as
  ``vllm bench serve`` counts them), CPU seconds of the server process and its children,
  and how many of its texts equal vLLM's ``openai`` row's texts of the same prompts;
- a ``--turns``-turn chat (0: none; the transcript of ``llm_chat_turns.py``: ``--new``
  tokens of Shakespeare a turn, ``--answer``-token greedy answers), TTFT per turn: on both
  servers resent whole through ``/v1/completions`` (each turn the conversation so far), and
  on actorserve also as a sequence through ``generate_stream`` (each turn only its new
  text; actorserve keeps the rest and gives vLLM the whole history, so vLLM's prefix
  cache serves it). actorserve's two ways run turn by turn one after the other, each
  opened by its own system line so they share no prefix-cache block; the two servers'
  resent chats read the same text (their answers are compared).
Every wait is bounded; the servers are stopped at the end; only 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parents[1]
HERE = str(ROOT / "benchmarks")
# this folder goes last on sys.path, so `import grpc` (tritonclient's) finds grpcio before
# benchmarks/grpc.py, and chat_transcript still imports
sys.path[:] = [str(ROOT), str(ROOT / "tests")] + [
    p for p in sys.path if os.path.abspath(p or os.curdir) != HERE
]
sys.path.append(HERE)

import httpx
import numpy as np
import psutil
from chat_transcript import SYSTEM, Transcript, user_turns
from support.tiny_llm import DATA, build

TIMEOUT = 600.0
HOST = "127.0.0.1"
MODEL = "llama"
DOORS = ("openai", "oip", "grpc")
#: the chats of each server, each opened by its own system line (two chats on one server
#: share no prefix-cache block), and how each is sent: actorserve resends A and sends B as a
#: sequence; vLLM's server resends both, so each of actorserve's answers has vLLM's answer
#: to the same text beside it
CHATS = {"actorserve": {"A": "resent", "B": "sequence"}, "vllm": {"A": "resent", "B": "resent"}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def prompts(tok: Any, n: int, length: int) -> list[str]:
    text = DATA.read_text() if DATA.exists() else "To be, or not to be: that is the question.\n" * 2000
    ids = tok(text[:400_000])["input_ids"]
    return [str(tok.decode(ids[i * 97 : i * 97 + length])) for i in range(n)]


class Server:
    """A server process (its log in a temporary file), on ``cpus`` when given: the child
    sets its own affinity before it runs anything, so every process it starts inherits it."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        port: int,
        grpc_port: int,
        env: dict[str, str],
        cpus: set[int] | None = None,
    ) -> None:
        self.name, self.url, self.grpc_url = name, f"http://{HOST}:{port}", f"{HOST}:{grpc_port}"
        handle, path = tempfile.mkstemp(prefix=f"{name}-", suffix=".log")
        self.log = os.fdopen(handle, "w")
        self.log_path = path
        pin = None if cpus is None else lambda: os.sched_setaffinity(0, cpus)
        self.proc = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, preexec_fn=pin
        )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited; see {self.log_path}")
            try:
                body = {"model": MODEL, "prompt": "a", "max_tokens": 1}
                if httpx.post(self.url + "/v1/completions", json=body, timeout=30).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise SystemExit(f"{self.name} not ready in {TIMEOUT} s; see {self.log_path}")

    def procs(self) -> list[psutil.Process]:
        """The server's process and its children (none once it has gone)."""
        try:
            procs = [psutil.Process(self.proc.pid)]
            return procs + procs[0].children(recursive=True)
        except psutil.Error:
            return []

    def cpus(self) -> list[int]:
        """The CPUs any of the server's processes may run on (``--pin``'s check)."""
        cpus: set[int] = set()
        for p in self.procs():
            try:
                cpus.update(p.cpu_affinity() or [])
            except psutil.Error:
                pass
        return sorted(cpus)

    def cpu(self) -> float:
        total = 0.0
        for p in self.procs():
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self.log.close()


class Arrivals:
    """One streamed request as the client saw it: when each non-empty piece of text came
    (TTFT, the inter-token gaps), the text, and the completion tokens the server counted."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.times: list[float] = []
        self.pieces: list[str] = []
        self.tokens = 0

    def piece(self, text: str) -> None:
        if text:
            self.times.append(time.perf_counter())
            self.pieces.append(text)

    @property
    def ttft(self) -> float:
        return self.times[0] - self.start if self.times else 0.0

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]

    def completion_tokens(self) -> int:
        return self.tokens or len(self.pieces)


class Door(Protocol):
    async def send(self, prompt: str, max_tokens: int, **parameters: Any) -> Arrivals: ...


class OpenAIDoor:
    """Streamed ``/v1/completions`` (greedy, with usage) over one HTTP client."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def send(self, prompt: str, max_tokens: int, **parameters: Any) -> Arrivals:
        body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **parameters,
        }
        got = Arrivals()
        async with self.client.stream("POST", "/v1/completions", json=body) as reply:
            reply.raise_for_status()
            async for line in reply.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    got.tokens = int(chunk["usage"]["completion_tokens"])
                for choice in chunk.get("choices") or []:
                    got.piece(choice.get("text") or "")
        return got


class OIPDoor:
    """OIP REST ``generate_stream`` (SSE; ``usage: true`` counts the tokens) over one HTTP
    client; ``parameters`` go into the request's parameters (a sequence's controls)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def send(self, prompt: str, max_tokens: int, **parameters: Any) -> Arrivals:
        params = {"max_tokens": max_tokens, "temperature": 0.0, "usage": True, **parameters}
        body = {"text_input": prompt, "parameters": params}
        got = Arrivals()
        async with self.client.stream("POST", f"/v2/models/{MODEL}/generate_stream", json=body) as reply:
            reply.raise_for_status()
            async for line in reply.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(f"generate_stream: {event['error']}")
                got.piece(event.get("text_output") or "")
                got.tokens = int(event.get("completion_tokens") or got.tokens)
        return got


class GrpcDoor:
    """One ``ModelStreamInfer`` call (tritonclient's asyncio client, the Triton dialect):
    its requests one after another, each read up to its response with ``finish_reason``."""

    def __init__(self, client: Any) -> None:
        # one request waits to be written at a time: a send puts it, the call takes it
        self.requests: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(1)
        self.replies = client.stream_infer(self._inputs(), stream_timeout=TIMEOUT)
        self.sent = 0

    async def _inputs(self) -> AsyncIterator[dict[str, Any]]:
        while (request := await self.requests.get()) is not None:  # ends at close()
            yield request

    async def send(self, prompt: str, max_tokens: int, **parameters: Any) -> Arrivals:
        from tritonclient.grpc import InferInput

        text_input = InferInput("text_input", [1], "BYTES")
        text_input.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
        self.sent += 1
        params = {"max_tokens": max_tokens, "temperature": 0.0, "usage": True, **parameters}
        got = Arrivals()
        await self.requests.put(
            {"model_name": MODEL, "inputs": [text_input], "request_id": str(self.sent), "parameters": params}
        )
        # a response a token, and perhaps one more with the finish_reason alone
        for _ in range(max_tokens + 2):
            result, error = await anext(self.replies)
            if error is not None:
                raise RuntimeError(f"ModelStreamInfer: {error}")
            got.piece(result.as_numpy("text_output")[0].decode())
            said = result.get_response().parameters
            if "completion_tokens" in said:
                got.tokens = int(said["completion_tokens"].int64_param)
            if "finish_reason" in said:
                return got
        raise RuntimeError(f"ModelStreamInfer: no finish_reason in {max_tokens + 2} responses")

    async def close(self) -> None:
        """Half-close the call and read it to its end (no request is in flight)."""
        await self.requests.put(None)
        for _ in range(8):
            try:
                await anext(self.replies)
            except StopAsyncIteration:
                return
        raise RuntimeError("ModelStreamInfer: responses after the last request")


@asynccontextmanager
async def open_door(server: Server, door: str) -> AsyncIterator[Door]:
    """A client of ``door`` on its own connection, closed on exit."""
    if door == "grpc":
        import tritonclient.grpc.aio as grpc_aio

        async with grpc_aio.InferenceServerClient(server.grpc_url) as client:
            stream = GrpcDoor(client)
            yield stream
            await stream.close()
        return
    async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT) as http:
        yield OpenAIDoor(http) if door == "openai" else OIPDoor(http)


async def point(server: Server, door: str, texts: list[str], c: int, tokens: int) -> dict[str, Any]:
    """``texts`` through ``door``, ``c`` clients at a time, each connected before the clock
    starts; the answers in the order of ``texts``."""
    queue = list(enumerate(texts))
    answers: dict[int, Arrivals] = {}

    async def client(sender: Door) -> None:
        while queue:  # each pass takes one text
            i, text = queue.pop()
            answers[i] = await sender.send(text, tokens)

    async with AsyncExitStack() as stack:
        senders = [await stack.enter_async_context(open_door(server, door)) for _ in range(c)]
        cpu = server.cpu()
        start = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(client(sender) for sender in senders)), TIMEOUT)
        wall = time.perf_counter() - start
        cpu = server.cpu() - cpu
    replies = [answers[i] for i in range(len(texts))]
    total = sum(r.completion_tokens() for r in replies)
    gaps = [g for r in replies for g in r.gaps()]
    return {
        "tok_s": total / wall,
        "ttft_p50_ms": 1000 * statistics.median(r.ttft for r in replies),
        "itl_p99_ms": 1000 * float(np.percentile(gaps, 99)) if gaps else 0.0,
        "cpu_s": cpu,
        "tokens": total,
        "answers": [r.text for r in replies],
    }


async def chat(server: Server, chats: dict[str, str], turns: list[str], answer: int) -> dict[str, Any]:
    """TTFT of each turn of each chat and their answers: resent through ``/v1/completions``,
    or as a sequence through ``generate_stream``. The chats go turn by turn, one after the
    other (a burst of load on the machine falls on all of them alike)."""
    transcripts = {
        name: Transcript(way == "sequence", system=f"[chat {name}] {SYSTEM}") for name, way in chats.items()
    }
    times: dict[str, list[float]] = {name: [] for name in chats}
    async with AsyncExitStack() as stack:
        doors = {
            name: await stack.enter_async_context(open_door(server, "oip" if way == "sequence" else "openai"))
            for name, way in chats.items()
        }
        for i, text in enumerate(turns):
            for name, transcript in transcripts.items():
                control: dict[str, Any] = {}
                if transcript.sequence:
                    control = {"sequence_id": f"chat-{name}", "sequence_start": i == 0}
                    control["sequence_end"] = i == len(turns) - 1
                got = await asyncio.wait_for(
                    doors[name].send(transcript.prompt(text), answer, **control), TIMEOUT
                )
                transcript.answered(text, got.text)
                times[name].append(got.ttft)
    return {
        f"{name} {chats[name]}": {"ttft_s": times[name], "answers": transcripts[name].answers}
        for name in chats
    }


def start(name: str, folder: Path, args: argparse.Namespace, env: dict[str, str]) -> Server:
    port = free_port()
    grpc_port = free_port() if name == "actorserve" and "grpc" in args.doors else 0
    if name == "actorserve":
        argv = [args.actorserve_python, "-m", "actorserve", str(folder), "--host", HOST]
        argv += ["--http-port", str(port), "--grpc-port", str(grpc_port) if grpc_port else "off"]
    else:
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
        argv += ["--served-model-name", MODEL, "--host", HOST, "--port", str(port)]
        argv += ["--dtype", args.dtype, "--max-model-len", "2048", "--max-num-seqs", "32"]
        argv += ["--kv-cache-memory-bytes", str(args.kv_mb * 2**20)]
        if args.eager:
            argv += ["--enforce-eager"]
    return Server(name, argv, port, grpc_port, env, args.server_cpus)


async def measure(
    server: Server, doors: list[str], args: argparse.Namespace, texts: list[str]
) -> dict[str, Any]:
    """Every point through every door of ``server`` (the doors of one c back to back, so a
    change of the machine's load falls on the doors alike), then the chat."""
    points = args.points
    # warm-up at the real sizes: vLLM compiles (inductor) per batch-size range on first use;
    # then one request through each other door (its client's first connection and imports)
    for c in points:
        await point(server, "openai", texts[-c:], c, args.tokens)
    for door in doors:
        if door != "openai":
            await point(server, door, texts[-1:], 1, args.tokens)
    row: dict[str, Any] = {}
    for c in points:
        n = args.requests or max(2 * c, 4)
        for door in doors:
            row[f"{door} c={c}"] = got = await point(server, door, texts[:n], c, args.tokens)
            print(
                server.name,
                door,
                f"c={c}",
                {k: round(v, 1) for k, v in got.items() if k != "answers"},
                flush=True,
            )
    if args.turns:
        row["chat"] = await chat(server, CHATS[server.name], args.chat_turns, args.answer)
        for label, got in row["chat"].items():
            print(server.name, "chat", label, "TTFT ms", [round(1000 * t) for t in got["ttft_s"]], flush=True)
    return row


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def pair(a: float | None, b: float | None, digits: int = 0) -> str:
    return (
        f"{a:.{digits}f} / {b:.{digits}f}" if a is not None and b is not None else f"{a or b or 0:.{digits}f}"
    )


def equal_texts(ours: list[str] | None, theirs: list[str] | None) -> str:
    """How many of ``ours`` equal ``theirs``, text for text (the same prompts)."""
    if not ours or not theirs:
        return "-"
    return f"{sum(a == b for a, b in zip(ours, theirs, strict=True))}/{len(ours)}"


def report(results: dict[str, Any], doors: list[str], points: list[int]) -> None:
    """The side-by-side table: each actorserve door against vLLM's OpenAI row of that c."""
    ours, theirs = results.get("actorserve", {}), results.get("vllm", {})
    print(f"\n{results['config']}")
    print("each cell: actorserve's door / vLLM's OpenAI server at the same c")
    print(
        f"{'door':<7} {'c':>3} {'tok/s':>17} {'ratio':>6} {'TTFT p50 ms':>14} {'ratio':>6} "
        f"{'ITL p99 ms':>14} {'CPU s':>12} {'same':>6}"
    )
    for c in points:
        base = theirs.get(f"openai c={c}", {})
        for door in doors:
            got = ours.get(f"{door} c={c}", {})
            if not got and not (base and door == "openai"):
                continue
            print(
                f"{door:<7} {c:>3} {pair(got.get('tok_s'), base.get('tok_s')):>17} "
                f"{ratio(got.get('tok_s'), base.get('tok_s')):>6} "
                f"{pair(got.get('ttft_p50_ms'), base.get('ttft_p50_ms')):>14} "
                f"{ratio(got.get('ttft_p50_ms'), base.get('ttft_p50_ms')):>6} "
                f"{pair(got.get('itl_p99_ms'), base.get('itl_p99_ms')):>14} "
                f"{pair(got.get('cpu_s'), base.get('cpu_s'), 1):>12} "
                f"{equal_texts(got.get('answers'), base.get('answers')):>6}"
            )
    if not ours.get("chat") and not theirs.get("chat"):
        return
    # the answers of vLLM's server to the same chat (the same text), where it ran
    reference = {label.split()[0]: got["answers"] for label, got in theirs.get("chat", {}).items()}
    print(
        f"\n{'chat':<22} {'turn 1 ms':>10} {'last ms':>8} {'last/1':>7} {'sum ms':>7}  same answers as vLLM's"
    )
    for name in ("actorserve", "vllm"):
        for label, got in results.get(name, {}).get("chat", {}).items():
            t, answers = got["ttft_s"], reference.get(label.split()[0])
            same = "-" if name == "vllm" or answers is None else str(got["answers"] == answers)
            print(
                f"{name + ' ' + label:<22} {1000 * t[0]:>10.0f} {1000 * t[-1]:>8.0f} {ratio(t[-1], t[0]):>7} "
                f"{1000 * sum(t):>7.0f}  {same}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--points", default="1,8,32", help="concurrencies (default 1,8,32)")
    parser.add_argument(
        "--doors", default=",".join(DOORS), help="actorserve's doors (default openai,oip,grpc)"
    )
    parser.add_argument("--requests", type=int, default=0, help="requests a point (default 2c, at least 4)")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    parser.add_argument("--tokens", type=int, default=128, help="max_tokens (default 128)")
    parser.add_argument("--turns", type=int, default=10, help="chat turns (default 10; 0: no chat)")
    parser.add_argument("--new", type=int, default=100, help="new tokens a chat turn (default 100)")
    parser.add_argument("--answer", type=int, default=16, help="tokens a chat answer (default 16)")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--kv-mb", type=int, default=512)
    parser.add_argument("--eager", action="store_true", help="no torch.compile in either server")
    parser.add_argument("--only", choices=["actorserve", "vllm"], default=None)
    parser.add_argument(
        "--threads", type=int, default=0, help="actorserve's parameters.threads (0: the runtime's default)"
    )
    parser.add_argument(
        "--runtime",
        choices=["vllm", "transformers"],
        default="vllm",
        help="actorserve's runtime (default vllm)",
    )
    parser.add_argument(
        "--actorserve-python",
        default="",
        help="the Python that runs actorserve's server (default: this one for --runtime vllm, "
        ".venv/bin/python for --runtime transformers)",
    )
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="",
        help="both servers' dtype (default: float32 for --runtime vllm, each server's own "
        "default, auto, for --runtime transformers)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="each server's processes on one CPU, the client on the others",
    )
    args = parser.parse_args()
    args.points = [int(c) for c in args.points.split(",")]
    args.doors = [d for d in args.doors.split(",") if d]
    if not args.doors or set(args.doors) - set(DOORS) or min(args.points) < 1:
        parser.error(f"--doors: some of {', '.join(DOORS)}; --points: integers >= 1")
    args.dtype = args.dtype or ("float32" if args.runtime == "vllm" else "auto")
    if not args.actorserve_python:
        main_venv = ROOT / ".venv" / "bin" / "python"
        args.actorserve_python = sys.executable if args.runtime == "vllm" else str(main_venv)
    if not Path(args.actorserve_python).is_file():
        parser.error(f"--actorserve-python: no {args.actorserve_python} (make the main venv: DEVELOPERS.md)")
    args.server_cpus = None
    if args.pin:
        # the servers take the first CPU this script may use, the client the rest (or the
        # same one on a one-CPU machine)
        mine = sorted(os.sched_getaffinity(0))
        args.server_cpus = {mine[0]}
        os.sched_setaffinity(0, set(mine[1:]) or args.server_cpus)
    with tempfile.TemporaryDirectory(prefix="vllm-compare-") as tmp:
        results = compare(Path(tmp), args)
    print(json.dumps(shown(results), indent=1))
    report(results, args.doors, args.points)


def shown(results: dict[str, Any]) -> dict[str, Any]:
    """``results`` less the points' texts (the table counts the equal ones)."""
    out: dict[str, Any] = {"config": results["config"]}
    for name in ("actorserve", "vllm"):
        if name in results:
            out[name] = {
                row: {k: v for k, v in got.items() if k != "answers"} if " c=" in row else got
                for row, got in results[name].items()
            }
    return out


def compare(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Build the checkpoint in ``tmp``, then measure each server in turn (stopped after)."""
    folder = build(
        tmp / MODEL,
        "llama",
        width=args.width,
        layers=args.layers,
        vocab_size=4096,
        context=2048,
        std=0.02,
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    texts = prompts(tok, max(2 * max(args.points), args.requests) + 16, args.prompt)
    args.chat_turns = user_turns(tok, args.turns, args.new)
    parameters: dict[str, Any] = {"kv_cache_budget_mb": args.kv_mb, "threads": args.threads}
    if args.runtime == "vllm":
        engine: dict[str, Any] = {"dtype": args.dtype, "max_model_len": 2048, "max_num_seqs": 32}
        if args.eager:
            engine["enforce_eager"] = True
        parameters["engine"] = engine
    else:
        # the runtime's own defaults otherwise: max_context is the checkpoint's 2048
        # positions, the prefix cache on
        parameters["dtype"] = args.dtype
        if args.eager:
            parameters["compile"] = "eager"
    settings = {
        "name": MODEL,
        "implementation": args.runtime,
        "max_batch_size": 32,
        "parameters": parameters,
        "sequence": {"idle_timeout_ms": 600_000},
    }
    (folder / "model-settings.json").write_text(json.dumps(settings))
    # VIRTUAL_ENV and the like stay: each server runs under its own interpreter's prefix
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    pinned = f"pinned to CPU {min(args.server_cpus)}" if args.server_cpus else "not pinned"
    results: dict[str, Any] = {
        "config": f"actorserve runtime {args.runtime}, dtype {args.dtype} in both, {pinned}, "
        f"actorserve under {args.actorserve_python}"
    }
    for name in ("actorserve", "vllm"):
        if args.only not in (None, name):
            continue
        server = start(name, folder, args, env)
        try:
            started = time.monotonic()
            server.wait_ready()
            ready = round(time.monotonic() - started, 1)
            print(name, "ready in", ready, "s; CPUs", server.cpus(), "; log", server.log_path, flush=True)
            doors = args.doors if name == "actorserve" else ["openai"]
            results[name] = {
                "ready_s": ready,
                "cpus": server.cpus(),
                **asyncio.run(measure(server, doors, args, texts)),
            }
        finally:
            server.stop()
    return results


if __name__ == "__main__":
    main()
