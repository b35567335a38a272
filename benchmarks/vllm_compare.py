"""actorserve's ``vllm`` runtime against vLLM's own OpenAI server: the same checkpoint, the
same engine arguments, the same client, back to back on loopback (prints numbers; not a test).

    .venv-vllm/bin/python benchmarks/vllm_compare.py [--points 1,8,32] [--prompt 128]
        [--tokens 128] [--turns 10] [--width 512] [--layers 8] [--eager] [--threads N]

Runs in vLLM's environment (.ci/install-vllm). Builds a Llama of realistic CPU shape (width
512, 8 layers, a 4,096-token byte-level BPE vocabulary: ~30 M parameters) in a temporary
folder, then for each server in turn (``python -m actorserve FOLDER`` with a ``vllm`` model,
then ``python -m vllm.entrypoints.openai.api_server``):
- c = 1 / 8 / 32: 2c (at least 4) streamed ``/v1/completions`` requests of ``--prompt``
  Shakespeare tokens (a different offset each), ``max_tokens`` ``--tokens``, greedy, c at a
  time, the request shape of ``vllm bench serve``'s openai-completions backend less the two
  fields actorserve refuses today (``repetition_penalty: 1.0``, ``ignore_eos``; see the
  transformers-runtime issue): tokens/s = completion tokens (usage) / wall time, TTFT p50;
- a 10-turn chat over ``/v1/chat/completions`` resending the history (~``--tokens`` new
  tokens a turn), TTFT per turn; for actorserve also the same chat as a sequence through
  ``generate_stream`` (each turn sends only its new text);
- CPU seconds of each server process (and its children) per point.
Every wait is bounded; the servers are stopped at the end.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import httpx
import psutil
from support.tiny_llm import DATA, build

TIMEOUT = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prompts(tok: Any, n: int, length: int) -> list[str]:
    text = DATA.read_text() if DATA.exists() else "To be, or not to be: that is the question.\n" * 2000
    ids = tok(text[:400_000])["input_ids"]
    return [str(tok.decode(ids[i * 97 : i * 97 + length])) for i in range(n)]


class Server:
    def __init__(self, name: str, argv: list[str], url: str, env: dict[str, str]) -> None:
        self.name, self.url = name, url
        handle, path = tempfile.mkstemp(prefix=f"{name}-", suffix=".log")
        self.log = os.fdopen(handle, "w")
        self.log_path = path
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)

    def wait_ready(self, model: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited; see {self.log_path}")
            try:
                body = {"model": model, "prompt": "a", "max_tokens": 1}
                if httpx.post(self.url + "/v1/completions", json=body, timeout=30).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise SystemExit(f"{self.name} not ready in {TIMEOUT} s; see {self.log_path}")

    def cpu(self) -> float:
        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.Error:
            return 0.0
        total = 0.0
        for p in procs:
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


async def stream(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> tuple[float, int, str]:
    """(TTFT, completion tokens, text) of one streamed OpenAI request."""
    start = time.perf_counter()
    ttft, tokens, chunks, text = 0.0, 0, 0, ""
    async with client.stream("POST", path, json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            for choice in chunk.get("choices") or []:
                piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                if piece:
                    if not ttft:
                        ttft = time.perf_counter() - start
                    chunks += 1
                    text += piece
    return ttft, tokens or chunks, text


async def point(server: Server, model: str, texts: list[str], c: int, tokens: int) -> dict[str, float]:
    queue = list(texts)
    ttfts: list[float] = []
    total = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal total
        while queue:
            prompt = queue.pop()
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": tokens,
                "temperature": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            ttft, n, _ = await stream(client, "/v1/completions", body)
            ttfts.append(ttft)
            total += n

    cpu = server.cpu()
    limits = httpx.Limits(max_connections=c + 1)
    async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT, limits=limits) as client:
        start = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(worker(client) for _ in range(c))), TIMEOUT)
        wall = time.perf_counter() - start
    return {
        "tok_s": total / wall,
        "ttft_p50_ms": 1000 * statistics.median(ttfts),
        "cpu_s": server.cpu() - cpu,
        "tokens": total,
    }


async def chat(server: Server, model: str, turns: list[str], tokens: int, sequence: bool) -> list[float]:
    """TTFT of each turn: the chat resent whole (OpenAI), or a sequence of actorserve
    (OIP generate_stream, each turn only its new text)."""
    ttfts: list[float] = []
    messages: list[dict[str, str]] = []
    async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT) as client:
        for i, turn in enumerate(turns):
            if sequence:
                params: dict[str, Any] = {"max_tokens": tokens, "temperature": 0, "sequence_id": "chat"}
                if i == 0:
                    params["sequence_start"] = True
                if i == len(turns) - 1:
                    params["sequence_end"] = True
                body = {"text_input": turn, "parameters": params}
                start = time.perf_counter()
                first = 0.0
                async with client.stream("POST", f"/v2/models/{model}/generate_stream", json=body) as reply:
                    reply.raise_for_status()
                    async for line in reply.aiter_lines():
                        if line.startswith("data: ") and not first:
                            first = time.perf_counter() - start
                ttfts.append(first)
                continue
            messages.append({"role": "user", "content": turn})
            body = {
                "model": model,
                "messages": messages,
                "max_tokens": tokens,
                "temperature": 0.0,
                "stream": True,
            }
            ttft, _, text = await stream(client, "/v1/chat/completions", body)
            messages.append({"role": "assistant", "content": text})
            ttfts.append(ttft)
    return ttfts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", default="1,8,32")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--kv-mb", type=int, default=512)
    parser.add_argument("--eager", action="store_true", help="no torch.compile in either server")
    parser.add_argument("--only", choices=["actorserve", "vllm"], default=None)
    parser.add_argument(
        "--threads", type=int, default=0, help="actorserve's parameters.threads (0: the runtime's default)"
    )
    args = parser.parse_args()
    points = [int(c) for c in args.points.split(",")]
    folder = build(
        Path(tempfile.mkdtemp(prefix="vllm-compare-")) / "llama",
        "llama",
        width=args.width,
        layers=args.layers,
        vocab_size=4096,
        context=2048,
        std=0.02,
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    texts = prompts(tok, 2 * max(points) + 16, args.prompt)
    turns = [f"Turn {i}: " + t[: 4 * args.prompt // 5] for i, t in enumerate(prompts(tok, args.turns, 100))]
    engine: dict[str, Any] = {"dtype": "float32", "max_model_len": 2048, "max_num_seqs": 32}
    if args.eager:
        engine["enforce_eager"] = True
    settings = {
        "name": "llama",
        "implementation": "vllm",
        "max_batch_size": 32,
        "parameters": {"engine": engine, "kv_cache_budget_mb": args.kv_mb, "threads": args.threads},
        "sequence": {"idle_timeout_ms": 600_000},
    }
    (folder / "model-settings.json").write_text(json.dumps(settings))
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    py = sys.executable
    results: dict[str, Any] = {}
    for name in ("actorserve", "vllm"):
        if args.only not in (None, name):
            continue
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        if name == "actorserve":
            argv = [py, "-m", "actorserve", str(folder), "--host", "127.0.0.1", "--http-port", str(port)]
            argv += ["--grpc-port", "off"]
        else:
            argv = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
            argv += ["--served-model-name", "llama", "--host", "127.0.0.1", "--port", str(port)]
            argv += ["--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", "32"]
            argv += ["--kv-cache-memory-bytes", str(args.kv_mb * 2**20)]
            if args.eager:
                argv += ["--enforce-eager"]
        server = Server(name, argv, url, env)
        try:
            started = time.monotonic()
            server.wait_ready("llama")
            row: dict[str, Any] = {"ready_s": round(time.monotonic() - started, 1)}
            # warm-up at the real sizes: vLLM compiles (inductor) per batch-size range on first use
            for c in points:
                asyncio.run(point(server, "llama", texts[-c:], c, args.tokens))
            for c in points:
                row[f"c={c}"] = asyncio.run(point(server, "llama", texts[: max(2 * c, 4)], c, args.tokens))
                print(name, f"c={c}", row[f"c={c}"], flush=True)
            row["chat"] = asyncio.run(chat(server, "llama", turns, args.tokens, sequence=False))
            print(name, "chat TTFT s", [round(t, 3) for t in row["chat"]], flush=True)
            if name == "actorserve":
                row["sequence"] = asyncio.run(chat(server, "llama", turns, args.tokens, sequence=True))
                print(name, "sequence TTFT s", [round(t, 3) for t in row["sequence"]], flush=True)
            results[name] = row
        finally:
            server.stop()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
