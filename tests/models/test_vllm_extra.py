"""Without vLLM installed, a ``vllm`` model's load error names the extra (this runs in the
main environment, where vLLM is not installed)."""

from __future__ import annotations

import sys
from pathlib import Path

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
