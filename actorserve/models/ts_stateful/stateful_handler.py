"""TorchServe's stateful example handler (``examples/stateful/sequence_continuous_batching``),
served unchanged in shape by actorserve's TorchServe handler model.

Per sequence a running sum: an even input adds and answers once; an odd input adds and
then streams the sum on every step until a later request of its sequence ends (0) or
cancels (-1) it, or ``stream_steps`` answers went out; 0 ends the sequence (the response
carries the end header); a request of a sequence that was never started closes it.
Differences from the original: a bounded dict instead of the ``lru`` package, an ended
sequence forgets its sum (the original keeps it, then fails on its next request), and the
pause between streamed answers (1 s there) is ``handler.stream_interval_ms``.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any

logger = logging.getLogger(__name__)


class StatefulHandler:
    DEFAULT_CAPACITY = 10

    def __init__(self) -> None:
        # sequence id -> running sum, least recently used first (TorchServe's is lru.LRU;
        # one class per handler module, so no helper class here)
        self.cache: OrderedDict[str, int] = OrderedDict()
        self.capacity = self.DEFAULT_CAPACITY
        self.context: Any = None
        self.initialized = False

    def initialize(self, ctx: Any) -> None:
        # ctx.cache: sequence_id -> its status; request_id -> its streaming status
        ctx.cache = {}
        config = ctx.model_yaml_config.get("handler") or {}
        self.capacity = int(config.get("cache", {}).get("capacity", self.DEFAULT_CAPACITY))
        self.interval = float(config.get("stream_interval_ms", 1000)) / 1000
        self.steps = int(config.get("stream_steps", 10))
        self.context = ctx
        self.initialized = True

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[Any]:
        self.context = context
        return self.postprocess(self.inference(self.preprocess(data)))

    def preprocess(self, data: list[dict[str, Any]]) -> list[int]:
        results: list[int] = []
        ctx = self.context
        for idx, row in enumerate(data):
            sequence_id = ctx.get_sequence_id(idx)
            # a sticky router finds the session by the sequence id in the response
            ctx.set_response_header(idx, ctx.header_key_sequence_id, sequence_id)
            prev: int | None
            if ctx.get_request_header(idx, ctx.header_key_sequence_start):
                prev = 0
                ctx.cache[sequence_id] = {"start": True, "cancel": False, "end": False, "num_requests": 0}
            elif sequence_id in self.cache:
                prev = int(self.cache[sequence_id])
            else:
                prev = None
                logger.error("no sequence_start request for sequence_id:%s before", sequence_id)
            ctx.cache.setdefault(
                sequence_id, {"start": False, "cancel": False, "end": False, "num_requests": 0}
            )

            req_id = ctx.get_request_id(idx)
            if req_id not in ctx.cache:  # a new request
                request = row.get("data") or row.get("body")
                if isinstance(request, (bytes, bytearray)):
                    request = request.decode("utf-8")
                ctx.cache[req_id] = {
                    "stopping_criteria": self._create_stopping_criteria(req_id=req_id, seq_id=sequence_id),
                    "stream": True,
                }
                ctx.cache[sequence_id]["num_requests"] += 1
                if isinstance(request, dict) and "input" in request:
                    request = request.get("input")
                value = int(request)  # type: ignore[arg-type]
                if value == -1:  # cancel the sequence's streams
                    ctx.cache[sequence_id]["cancel"] = True
                    ctx.cache[req_id]["stream"] = False
                    results.append(value)
                elif prev is None:  # close a sequence that was never opened
                    ctx.cache[sequence_id]["end"] = True
                    ctx.cache[req_id]["stream"] = False
                    ctx.set_response_header(idx, ctx.header_key_sequence_end, sequence_id)
                    results.append(value)
                else:
                    total = prev + value
                    self._remember(sequence_id, total)
                    if value == 0:  # end
                        ctx.cache[sequence_id]["end"] = True
                        ctx.cache[req_id]["stream"] = False
                        ctx.set_response_header(idx, ctx.header_key_sequence_end, sequence_id)
                    elif value % 2 == 0:  # answered once
                        ctx.cache[req_id]["stream"] = False
                    results.append(total)
            else:  # a streaming request, once more
                time.sleep(self.interval)
                results.append(int(prev or 0))
        return results

    def _remember(self, sequence_id: str, total: int) -> None:
        self.cache[sequence_id] = total
        self.cache.move_to_end(sequence_id)
        while len(self.cache) > self.capacity:
            self.cache.popitem(last=False)

    def inference(self, data: list[int], *args: Any, **kwargs: Any) -> list[int]:
        return data

    def postprocess(self, data: list[int]) -> list[int]:
        self.context.stopping_criteria = [
            self.context.cache[req_id]["stopping_criteria"] for req_id in self.context.request_ids.values()
        ]
        return data

    def clean_up(self, seq_id: str, req_id: str, del_seq: bool) -> None:
        self.context.cache[seq_id]["num_requests"] -= 1
        if self.context.cache[seq_id]["num_requests"] == 0 and del_seq:
            del self.context.cache[seq_id]
            self.cache.pop(seq_id, None)  # an ended sequence's sum goes too
        del self.context.cache[req_id]

    def _create_stopping_criteria(self, req_id: str, seq_id: str) -> Any:
        outer = self

        class StoppingCriteria:
            def __init__(self) -> None:
                self.counter = outer.steps

            def __call__(self, res: Any) -> bool | None:
                cache = outer.context.cache
                if cache[seq_id]["end"]:  # the sequence ended
                    ret = True if cache[req_id]["stream"] else None
                    outer.clean_up(seq_id, req_id, True)
                    return ret
                if cache[seq_id]["cancel"]:
                    ret = True if cache[req_id]["stream"] else None
                    outer.clean_up(seq_id, req_id, False)
                    if cache[seq_id]["num_requests"] == 0:
                        cache[seq_id]["cancel"] = False
                    return ret
                if cache[seq_id]["start"]:
                    outer.clean_up(seq_id, req_id, False)
                    cache[seq_id]["start"] = False
                    return None
                if not cache[req_id]["stream"]:  # answered once
                    outer.clean_up(seq_id, req_id, False)
                    return None
                if self.counter == 0:  # streamed long enough
                    outer.clean_up(seq_id, req_id, False)
                    return True
                self.counter -= 1
                return False

        return StoppingCriteria()
