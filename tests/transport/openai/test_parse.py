"""The OpenAI door's request parsing, with no I/O (transport/openai/parse.py): vLLM's and
TGI's sampling extensions pass at their neutral values only, compared in JSON's types."""

from __future__ import annotations

from typing import Any

import pytest

from actorserve.transport.openai.parse import OpenAIError, parse_chat, parse_completion

BASE: dict[str, Any] = {"model": "m", "prompt": "hi", "max_tokens": 3}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("repetition_penalty", 1),
        ("repetition_penalty", 1.0),
        ("min_p", 0),
        ("use_beam_search", False),
        ("skip_special_tokens", True),
        ("stop_token_ids", []),
        ("best_of", 1),
        ("presence_penalty", 0.0),
    ],
)
def test_an_extension_at_its_neutral_value_passes(key: str, value: Any) -> None:
    call = parse_completion({**BASE, key: value}, {})
    assert call.prompts == ("hi",)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("repetition_penalty", 1.1),
        ("repetition_penalty", True),  # == 1 in Python, not in JSON
        ("repetition_penalty", "1"),
        ("min_p", False),  # == 0 in Python
        ("use_beam_search", 0),  # == False in Python
        ("skip_special_tokens", 1),  # == True in Python
        ("best_of", 2),
        ("stop_token_ids", [2]),
    ],
)
def test_any_other_value_is_refused_naming_the_parameter(key: str, value: Any) -> None:
    with pytest.raises(OpenAIError) as refused:
        parse_completion({**BASE, key: value}, {})
    assert refused.value.param == key


def test_an_unknown_key_is_refused() -> None:
    with pytest.raises(OpenAIError, match="unrecognized request argument: 'nope'"):
        parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "nope": 1}, {})
