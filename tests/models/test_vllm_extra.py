"""The ``vllm`` runtime's parts that need no engine: without vLLM installed the load error
names the extra, and a prompt is bounded and tokenized off the event loop (this runs in the
main environment, where vLLM is not installed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from actorserve import BadInput
from actorserve.models.vllm import VLLMModel
from actorserve.modelsettings import model_settings_from_dict


def test_without_vllm_the_load_error_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm fails
    monkeypatch.setitem(sys.modules, "vllm.engine.arg_utils", None)
    settings = model_settings_from_dict({"name": "llm", "implementation": "vllm"}, folder=tmp_path)
    with pytest.raises(
        BadInput, match=r"^model 'llm': the vllm runtime needs vLLM: pip install 'actorserve\[vllm\]'"
    ):
        VLLMModel(settings)._load()


def test_engine_must_be_an_object(tmp_path: Path) -> None:
    data = {"name": "llm", "implementation": "vllm", "parameters": {"engine": ["dtype"]}}
    with pytest.raises(BadInput, match=r"parameters\.engine: expected an object"):
        VLLMModel(model_settings_from_dict(data, folder=tmp_path))


def test_kv_cache_usage_is_vllms_own_and_none_before_load(tmp_path: Path) -> None:
    """Read from vLLM's scheduler (``kv_cache_manager.usage``, the path vLLM v1's scheduler
    reads in ``make_stats``; tests/models/test_vllm.py checks it on a real engine), clamped
    to 0..1; None before the engine loads or from a vLLM without it."""
    from types import SimpleNamespace

    model = VLLMModel(model_settings_from_dict({"name": "llm", "implementation": "vllm"}, folder=tmp_path))
    assert model.kv_cache_usage() is None

    def engine(manager: object) -> object:
        scheduler = SimpleNamespace(kv_cache_manager=manager)
        return SimpleNamespace(engine_core=SimpleNamespace(engine_core=SimpleNamespace(scheduler=scheduler)))

    model.engine = engine(SimpleNamespace(usage=0.375))
    assert model.kv_cache_usage() == 0.375
    model.engine = engine(SimpleNamespace(usage=1.25))
    assert model.kv_cache_usage() == 1.0
    model.engine = engine(SimpleNamespace())  # another vLLM's shape
    assert model.kv_cache_usage() is None


class _CountingTokenizer:
    """Stands for the checkpoint's tokenizer: one id per character, and where it ran."""

    bos_token_id = 1
    eos_token_id = 2

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []  # (characters, thread id)

    def __call__(self, text: str) -> dict[str, list[int]]:
        import threading

        self.calls.append((len(text), threading.get_ident()))
        return {"input_ids": [ord(c) % 97 + 3 for c in text]}


def _loaded(tmp_path: Path) -> tuple[VLLMModel, _CountingTokenizer]:
    """A vllm model as load leaves it, less vLLM's engine (prepare and begin never touch it)."""
    model = VLLMModel(model_settings_from_dict({"name": "llm", "implementation": "vllm"}, folder=tmp_path))
    tokenizer = _CountingTokenizer()
    model.tokenizer, model.max_context, model.max_chars = tokenizer, 64, 100
    return model, tokenizer


def _ask(text: str) -> Any:
    import numpy as np

    from actorserve import InferenceRequest, Tensor

    data = np.empty(1, dtype=object)
    data[0] = text.encode()
    return InferenceRequest([Tensor("text_input", (1,), "BYTES", data)], parameters={"max_tokens": 4})


async def test_a_prompt_past_max_chars_is_refused_before_any_tokenizer_runs(tmp_path: Path) -> None:
    """Issue 30's finding 2 for the vllm runtime: a long text is refused untokenized,
    prepared or not, and a sequence's history counts."""
    from actorserve.models.vllm.state import VLLMState

    model, tokenizer = _loaded(tmp_path)
    with pytest.raises(BadInput, match=r"101 characters .*more than 100"):
        await model.prepare(_ask("x" * 101), None)
    with pytest.raises(BadInput, match=r"101 characters"):
        model.begin(_ask("x" * 101), None)
    state = VLLMState("s")
    state.text = "h" * 60
    with pytest.raises(BadInput, match=r"101 characters \(with the sequence's history\)"):
        await model.prepare(_ask("x" * 41), state)
    assert tokenizer.calls == []


async def test_prepare_tokenizes_in_a_worker_thread_and_begin_uses_it(tmp_path: Path) -> None:
    import threading

    model, tokenizer = _loaded(tmp_path)
    request = _ask("hello")
    await model.prepare(request, None)
    assert [(n, t != threading.get_ident()) for n, t in tokenizer.calls] == [(5, True)]
    work = model.begin(request, None)
    assert len(tokenizer.calls) == 1 and work.ids == [ord(c) % 97 + 3 for c in "hello"]
    model.begin(_ask("hi"), None)  # not prepared: tokenized here, on the caller's thread
    assert tokenizer.calls[-1] == (2, threading.get_ident())
