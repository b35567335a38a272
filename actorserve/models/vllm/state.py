"""What the ``vllm`` runtime keeps per sequence and per request (no engine calls here;
:mod:`.runtime` is the model)."""

from __future__ import annotations

import uuid
from typing import Any

from ...types import InferenceRequest
from ..llm.state import Detokenizer


class VLLMState:
    """One sequence: ``text`` (everything said so far); ``busy`` while a request of it runs."""

    __slots__ = ("busy", "sequence_id", "text")

    def __init__(self, sequence_id: str | None = None) -> None:
        self.sequence_id = sequence_id
        self.text = ""
        self.busy = False


class VLLMWork:
    """One request: its vLLM request id, the whole context as ``ids``, its sampling and
    what it has said."""

    __slots__ = (
        "added",
        "detok",
        "finished",
        "generated",
        "held",
        "ids",
        "max_tokens",
        "prompt_tokens",
        "request",
        "rid",
        "seed",
        "sent",
        "state",
        "stop",
        "temperature",
        "text",
        "top_k",
        "top_p",
    )

    def __init__(
        self,
        request: InferenceRequest,
        state: VLLMState,
        text: str,
        ids: list[int],
        *,
        tokenizer: Any,
        max_tokens: int,
        temperature: float,
        top_k: int,
        top_p: float,
        seed: int,
        stop: tuple[str, ...],
    ) -> None:
        self.request = request
        self.state = state
        self.text = text
        self.ids = ids
        self.rid = uuid.uuid4().hex
        self.added = False  # handed to vLLM (by the step thread)
        self.finished = False
        self.prompt_tokens = len(ids)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.seed = seed
        self.stop = stop
        self.detok = Detokenizer(tokenizer, ids)
        self.generated = 0
        self.held = ""
        self.sent = ""

    def settle(self) -> None:
        """Leave the sequence with what this request read and said (once)."""
        if self.finished:
            return
        self.finished = True
        self.state.busy = False
        self.state.text = self.text + self.sent
