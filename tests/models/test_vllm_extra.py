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
