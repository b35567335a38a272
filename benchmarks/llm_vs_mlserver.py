"""actorserve's ``transformers`` runtime against MLServer 1.7.1's HuggingFace runtime
(``mlserver-huggingface``), back to back, on the same checkpoint, both over REST on
127.0.0.1 (prints numbers; not a test).

    python benchmarks/llm_vs_mlserver.py [--streams 1,8,32] [--prompt 128] [--tokens 128]
        [--width 384] [--layers 6] [--threads 1] [--rounds 1]
        [--api-workers N] [--actorserve-only] [--mlserver /tmp/bench/mlserver/bin/mlserver]

Builds the GPT-2 checkpoint of ``benchmarks/llm_throughput.py`` (width 384, 6 layers, a
4096-token byte-level BPE vocabulary: 12.6 M parameters) in a temporary folder; serves
it with actorserve (``"implementation": "transformers"``) and then with MLServer
(``mlserver_huggingface.HuggingFaceRuntime``, task ``text-generation``, the same
folder, ``parallel_workers`` 0), each with ``--threads`` torch threads; then for each
N, N concurrent clients each send one request (``--prompt`` tokens of Shakespeare, a
different offset per client; ``--tokens`` generated, greedy):
- actorserve: ``POST /v2/models/llm/infer_stream`` (SSE), ``max_tokens``,
  ``temperature`` 0, ``usage``; tokens = the ``completion_tokens`` it reports;
  TTFT = the time to the first event carrying text;
- MLServer: ``POST /v2/models/llm/infer`` with the pipeline's ``args`` and the
  generation keyword arguments as ``hg_json`` inputs (``max_new_tokens`` =
  ``min_new_tokens`` = ``--tokens``, ``do_sample`` false, ``return_full_text``
  false); tokens = ``--tokens`` per request; it does not stream, so its TTFT is the
  time to the whole answer.
MLServer's venv (``/tmp/bench/mlserver``, made by the side by side harness) needs, besides
``pip install mlserver-huggingface==1.7.1``, the versions that runtime still imports:
``pip install torch==2.8.0 transformers==4.41.2 optimum==1.20.0`` (1.7.1 imports
``transformers.pipelines.Conversation``, gone in 4.42, and optimum's ONNX exporters,
which need a torch before 2.9). transformers 4.41 cannot read the tokenizer files that
transformers 5 writes, so MLServer gets the same tokenizer rewritten in the older format
(the class name, and merges as strings; the vocabulary and merges are the same).
Tokens/s = all generated tokens / the wall time of the N requests. The best of
``--rounds`` is printed (the machine may be shared). Every wait is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.tiny_llm import build, training_text

READY_TIMEOUT = 300.0
ROUND_TIMEOUT = 1800.0

One = Callable[[httpx.AsyncClient, str], Awaitable[tuple[float, int]]]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prompts(folder: Path, count: int, length: int) -> list[str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    ids: list[int] = tokenizer(training_text())["input_ids"]
    step = max(1, (len(ids) - length) // max(1, count))
    return [tokenizer.decode(ids[i * step : i * step + length]) for i in range(count)]


def tokenizer_for_transformers4(folder: Path, into: Path) -> Path:
    """The tokenizer of ``folder`` in files transformers 4.41 / tokenizers 0.19 read."""
    into.mkdir(parents=True, exist_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.pop("backend", None)
    (into / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    model = tokenizer["model"]
    model["merges"] = [" ".join(m) if isinstance(m, list) else m for m in model.get("merges", [])]
    (into / "tokenizer.json").write_text(json.dumps(tokenizer))
    return into


def start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


def tail(log: Path) -> str:
    return log.read_text()[-3000:]


async def wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    async with httpx.AsyncClient(timeout=5.0) as client:
        with trio.fail_after(READY_TIMEOUT):
            while True:
                if process.poll() is not None:
                    raise SystemExit(f"the server exited ({process.returncode}); its log:\n{tail(log)}")
                try:
                    if (await client.get(f"{url}/v2/models/llm/ready")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await trio.sleep(0.5)


def actorserve_one(url: str, tokens: int) -> One:
    async def one(client: httpx.AsyncClient, prompt: str) -> tuple[float, int]:
        body = {
            "inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [prompt]}],
            "parameters": {"max_tokens": tokens, "temperature": 0, "usage": True},
        }
        sent = time.perf_counter()
        ttft, generated = 0.0, 0
        async with client.stream("POST", f"{url}/v2/models/llm/infer_stream", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                event = json.loads(line[5:])
                if not ttft and any(output["data"][0] for output in event.get("outputs", [])):
                    ttft = time.perf_counter() - sent
                generated = int(event.get("parameters", {}).get("completion_tokens", generated))
        return ttft, generated

    return one


def mlserver_one(url: str, tokens: int) -> One:
    def kwarg(name: str, value: object) -> dict[str, object]:
        return {
            "name": name,
            "shape": [1],
            "datatype": "BYTES",
            "data": [json.dumps(value)],
            "parameters": {"content_type": "hg_json"},
        }

    async def one(client: httpx.AsyncClient, prompt: str) -> tuple[float, int]:
        body = {
            "inputs": [
                {
                    "name": "args",
                    "shape": [1],
                    "datatype": "BYTES",
                    "data": [prompt],
                    "parameters": {"content_type": "str"},
                },
                kwarg("max_new_tokens", tokens),
                kwarg("min_new_tokens", tokens),
                kwarg("do_sample", False),
                kwarg("return_full_text", False),
            ]
        }
        sent = time.perf_counter()
        response = await client.post(f"{url}/v2/models/llm/infer", json=body)
        if response.status_code != 200:
            raise SystemExit(f"MLServer answered {response.status_code}: {response.text[:2000]}")
        return time.perf_counter() - sent, tokens

    return one


async def measure(one: One, texts: list[str]) -> tuple[float, int, list[float]]:
    ttfts: list[float] = []
    generated = 0

    async def client_task(client: httpx.AsyncClient, prompt: str) -> None:
        nonlocal generated
        ttft, count = await one(client, prompt)
        ttfts.append(ttft)
        generated += count

    limits = httpx.Limits(max_connections=len(texts) + 4)
    async with httpx.AsyncClient(timeout=ROUND_TIMEOUT, limits=limits) as client:
        await one(client, texts[0][:40])  # warm-up
        start_time = time.perf_counter()
        with trio.fail_after(ROUND_TIMEOUT):
            async with trio.open_nursery() as nursery:
                for prompt in texts:
                    nursery.start_soon(client_task, client, prompt)
        return time.perf_counter() - start_time, generated, ttfts


async def run_server(
    name: str,
    command: list[str],
    env: dict[str, str],
    url: str,
    one: One,
    work: Path,
    args: argparse.Namespace,
) -> dict[int, tuple[float, float]]:
    """tokens/s and TTFT p50 (ms) at each N: the best of ``--rounds``."""
    log = work / f"{name}.log"
    process = start(command, log, env)
    results: dict[int, tuple[float, float]] = {}
    try:
        await wait_ready(url, process, log)
        for n in args.streams:
            texts = prompts(work / "llm", n, args.prompt)
            for _ in range(args.rounds):
                wall, generated, ttfts = await measure(one, texts)
                rate = generated / wall
                if rate > results.get(n, (0.0, 0.0))[0]:
                    results[n] = (rate, statistics.median(ttfts) * 1000)
            print(
                f"  {name} {n:>3} streams: {results[n][0]:8.0f} tok/s  TTFT p50 {results[n][1]:8.1f} ms",
                flush=True,
            )
    finally:
        stop(process)
    return results


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folder = build(
            work / "llm",
            "gpt2",
            width=args.width,
            layers=args.layers,
            std=0.02,
            vocab_size=4096,
            context=1024,
        )
        settings = {
            "name": "llm",
            "implementation": "transformers",
            "max_batch_size": max(args.streams),
            "parameters": {"threads": args.threads},
        }
        (folder / "model-settings.json").write_text(json.dumps(settings))
        ml_repo = work / "mlserver"
        (ml_repo / "llm").mkdir(parents=True)
        (ml_repo / "llm" / "model-settings.json").write_text(
            json.dumps(
                {
                    "name": "llm",
                    "implementation": "mlserver_huggingface.HuggingFaceRuntime",
                    "parameters": {
                        "extra": {
                            "task": "text-generation",
                            "pretrained_model": str(folder),
                            "pretrained_tokenizer": str(
                                tokenizer_for_transformers4(folder, work / "tokenizer4")
                            ),
                            "framework": "pt",
                            "device": -1,
                        }
                    },
                }
            )
        )
        print(
            f"checkpoint: gpt2 {args.layers} layers, width {args.width}; {args.threads} torch thread(s) each; greedy"
        )
        print(f"{args.prompt}-token prompts, {args.tokens} generated, N concurrent clients, one request each")
        port = free_port()
        as_results = await run_server(
            "actorserve",
            [
                sys.executable,
                "-m",
                "actorserve",
                "--host",
                "127.0.0.1",
                "--http-port",
                str(port),
                "--grpc-port",
                "off",
                *([] if args.api_workers is None else ["--api-workers", str(args.api_workers)]),
                str(folder),
            ],
            {"PYTHONPATH": str(ROOT)},
            f"http://127.0.0.1:{port}",
            actorserve_one(f"http://127.0.0.1:{port}", args.tokens),
            work,
            args,
        )
        if args.actorserve_only:
            return
        port = free_port()
        (ml_repo / "settings.json").write_text(
            json.dumps(
                {
                    "host": "127.0.0.1",
                    "http_port": port,
                    "grpc_port": free_port(),
                    "metrics_port": free_port(),
                    "parallel_workers": 0,
                    "load_models_at_startup": True,
                }
            )
        )
        threads = str(args.threads)
        ml_results = await run_server(
            "mlserver",
            [args.mlserver, "start", str(ml_repo)],
            {
                "OMP_NUM_THREADS": threads,
                "MKL_NUM_THREADS": threads,
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "USE_TF": "0",  # the runtime pulls TensorFlow in; transformers need not load it too
                "USE_TORCH": "1",
            },
            f"http://127.0.0.1:{port}",
            mlserver_one(f"http://127.0.0.1:{port}", args.tokens),
            work,
            args,
        )
        print(
            f"{'streams':>7} {'actorserve tok/s':>16} {'MLServer tok/s':>15} {'ratio':>6} {'TTFT p50 ms (as / ML)':>22}"
        )
        for n in args.streams:
            (a, a_ttft), (m, m_ttft) = as_results[n], ml_results[n]
            print(f"{n:>7} {a:>16.0f} {m:>15.0f} {a / m:>6.2f} {a_ttft:>10.1f} / {m_ttft:>9.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--api-workers", type=int, default=None, help="actorserve's --api-workers (default: its own)"
    )
    parser.add_argument(
        "--actorserve-only", action="store_true", help="skip MLServer (its figures vary less)"
    )
    parser.add_argument("--mlserver", default="/tmp/bench/mlserver/bin/mlserver")
    trio.run(main, parser.parse_args())
