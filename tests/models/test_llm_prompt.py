"""Issue 30, finding 2: the ``transformers`` runtime measured a prompt only after
tokenizing all of it on the engine's event loop (30 MB of text held every model for 81 s).
Now a text longer than the context can hold is refused untokenized, naming
``max_prompt_chars``, and the tokenizer runs in a worker thread, never on the loop;
through the engine, sequences, and TorchServe's JSON body alike."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_llm import llm_engine, request, text

from actorserve import BadInput, InferenceRequest
from actorserve.codecs import tensor_from_numpy
from actorserve.models.llm.prompt import NORMALIZED_SHRINK, longest_token

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from support.tiny_llm import build

    return build(tmp_path_factory.mktemp("llm") / "gpt2", "gpt2", dtype="float32")


class Recording:
    """A tokenizer that records the threads it is called in and the longest text."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.threads: list[int] = []
        self.longest = 0

    def __call__(self, text: str, **kwargs: Any) -> Any:
        self.threads.append(threading.get_ident())
        self.longest = max(self.longest, len(text))
        return self.tokenizer(text, **kwargs)


def _body(value: dict[str, Any]) -> InferenceRequest:
    data = np.empty(1, dtype=object)
    data[0] = json.dumps(value).encode()
    return InferenceRequest([tensor_from_numpy("body", data, "BYTES")])


async def test_a_prompt_past_max_prompt_chars_is_refused_untokenized_and_tokenizing_is_off_the_loop(
    folder: Path,
) -> None:
    async with llm_engine(folder) as (engine, model):
        bound = model.max_context * longest_token(model.tokenizer) * NORMALIZED_SHRINK
        assert model.prompts.max_chars == bound
        recording = Recording(model.prompts.tokenizing.tokenizer)
        model.prompts.tokenizing.tokenizer = recording
        assert await text(engine, "ROMEO:\n", temperature=0, max_tokens=2) is not None
        with pytest.raises(
            BadInput, match=rf"{bound + 1} characters .* more than {bound} \(max_prompt_chars"
        ):
            await text(engine, "a" * (bound + 1))
        with pytest.raises(BadInput, match="max_prompt_chars"):  # TorchServe's body, same bound
            await engine.infer(_body({"text_input": "a" * (bound + 1), "max_tokens": 1}), model="llm")
        # a sequence's history counts: each request alone fits, the two together do not
        half = bound // 2 + 1
        await text(engine, "a" * 10, sequence_id="s", sequence_start=True, max_tokens=0)
        with pytest.raises(BadInput, match="with the sequence's history"):
            await text(engine, "b" * half + "c" * half, sequence_id="s")
        assert recording.longest < bound
        assert recording.threads and threading.get_ident() not in recording.threads


async def test_max_prompt_chars_may_be_set(folder: Path) -> None:
    async with llm_engine(folder, max_prompt_chars=50) as (engine, model):
        assert model.prompts.max_chars == 50
        with pytest.raises(BadInput, match=r"51 characters .* more than 50 \(max_prompt_chars"):
            await engine.infer(request("x" * 51), model="llm")
