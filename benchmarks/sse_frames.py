"""Microseconds per SSE frame: each plain encoder next to its per-stream template
(prints numbers; not a test).

    python benchmarks/sse_frames.py [--events 20000] [--rounds 5]

Encodes the events of one stream as the front does (``sse.data_frames`` over one
response at a time): the ``streamer`` model's response (a one-character BYTES output and
an INT64 index, with model name, version and id) as an ``infer_stream`` event, as a
``generate_stream`` event (POST and EventSource), and an OpenAI chat text chunk. CPU time
of this process only; the best of ``--rounds`` is printed, since noise only adds.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's actorserve

from actorserve.transport.openai.encode import ChunkShape
from actorserve.transport.rest.generate import encode_event_source, encode_generate
from actorserve.transport.rest.sse import data_frames
from actorserve.transport.rest.templates import GenerateEvents, OipEvents
from actorserve.transport.rest.wire import encode_oip
from actorserve.types import InferenceResponse, Tensor


def responses(count: int) -> list[InferenceResponse]:
    out = []
    for i in range(count):
        text = np.array([b"abcdefgh"[i % 8 : i % 8 + 1]], dtype=object)
        outputs = [Tensor("text_output", (1,), "BYTES", text), Tensor("index", (1,), "INT64", np.array([i]))]
        out.append(InferenceResponse("streamer", outputs, "1", "request-7", {}))
    return out


def per_frame_us(run: Callable[[], None], events: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best / events * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    items = responses(args.events)

    def frames(make: Callable[[], Callable[[InferenceResponse], bytes]]) -> Callable[[], None]:
        def run() -> None:
            encode = make()  # once per stream, as the front does
            for response in items:
                data_frames((response,), encode)

        return run

    def openai(template: bool) -> Callable[[], None]:
        def run() -> None:
            shape = ChunkShape("chatcmpl-0123456789abcdef01234567", "streamer", 1764230400, True, False)
            text = shape.text if template else shape.text_slow
            for i in range(args.events):
                text(0, "abcdefgh"[i % 8])

        return run

    rows = [
        ("infer_stream (OIP)", frames(lambda: encode_oip), frames(OipEvents)),
        ("generate_stream", frames(lambda: encode_generate), frames(GenerateEvents)),
        (
            "generate_stream GET",
            frames(lambda: encode_event_source),
            frames(lambda: GenerateEvents(event_source=True)),
        ),
        ("OpenAI chat chunk", openai(False), openai(True)),
    ]
    print(f"{'frame':<22} {'plain us':>9} {'template us':>12} {'speed-up':>9}")
    for name, plain, template in rows:
        before = per_frame_us(plain, args.events, args.rounds)
        after = per_frame_us(template, args.events, args.rounds)
        print(f"{name:<22} {before:>9.2f} {after:>12.2f} {before / after:>8.1f}x")


if __name__ == "__main__":
    main()
