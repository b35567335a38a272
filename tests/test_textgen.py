"""The text-generation contract with plain records: declarations from settings, the
engine request it builds, and reading responses back as text (stop strings, counts,
finish reasons)."""

from __future__ import annotations

from typing import Any

import pytest

from actorserve.errors import BadInput
from actorserve.settings import SettingsError, model_settings_from_dict
from actorserve.textgen import TextGeneration, TextOptions, TextPieces, text_request, text_tensor
from actorserve.texttokens import TokenLogprob, logprobs_from_parameter, logprobs_to_parameter
from actorserve.types import InferenceResponse


def piece(text: str, **parameters: Any) -> InferenceResponse:
    return InferenceResponse("m", [text_tensor("text_output", text)], parameters=parameters)


def test_settings_blocks_lay_over_the_class_declaration() -> None:
    base = TextGeneration(sampling=("temperature",), stop=True)
    changed = base.with_settings(
        {"chat_template": "{{ messages }}", "chat_stop": ["\n\n"], "max_tokens": "n"}
    )
    assert changed == TextGeneration(
        "text_input", "text_output", "n", ("temperature",), True, False, "{{ messages }}", ("\n\n",)
    )
    assert TextGeneration.from_plain(changed.to_plain()) == changed
    llm = changed.with_settings({"tokenize": True, "chat_history": True})
    assert llm.tokenize and llm.chat_history and TextGeneration.from_plain(llm.to_plain()) == llm
    for block, words in [
        ({"chat": "x"}, "unknown key(s) chat"),
        ({"stop": "yes"}, "stop: expected true or false"),
        ({"sampling": ["beam_width"]}, "unknown option(s) ['beam_width']"),
        ({"chat_stop": "\n"}, "chat_stop: expected a list of strings"),
    ]:
        with pytest.raises(BadInput) as caught:
            base.with_settings(block)
        assert words in caught.value.message
    with pytest.raises(SettingsError) as bad:
        model_settings_from_dict({"name": "m", "implementation": "x.Y", "text_generation": {"usage": 1}})
    assert "text_generation.usage: expected true or false" in str(bad.value)


def test_the_request_carries_only_what_the_model_takes() -> None:
    spec = TextGeneration(max_tokens="n_tokens", sampling=("seed",), usage=True)
    options = TextOptions(max_tokens=5, seed=3, top_p=1.0, stop=("x",), sequence={"sequence_id": "s"})
    request = text_request(spec, "héllo", options, "r1")
    assert request.input("text_input").data.tolist() == ["héllo".encode()]  # type: ignore[union-attr]
    # stop is applied by TextPieces for a model that does not stop by itself
    assert request.parameters == {"sequence_id": "s", "n_tokens": 5, "seed": 3, "usage": True}
    assert request.id == "r1"
    with pytest.raises(BadInput) as caught:
        text_request(spec, "x", TextOptions(temperature=0.5))
    assert caught.value.message == "parameter 'temperature' is not supported by this model"
    native = text_request(TextGeneration(stop=True), "x", TextOptions(stop=("a", "b")))
    assert native.parameters == {"stop": ["a", "b"]}
    # vLLM's extensions at their neutral values pass any model; others need the model
    neutral = TextOptions(top_p=1.0, top_k=0, min_tokens=0, ignore_eos=False)
    assert text_request(TextGeneration(), "x", neutral).parameters == {}
    for option, value in [("top_k", 5), ("min_tokens", 2), ("ignore_eos", True), ("logprobs", 0)]:
        with pytest.raises(BadInput, match=f"parameter '{option}' is not supported by this model"):
            text_request(TextGeneration(), "x", TextOptions(**{option: value}))
        taken = text_request(TextGeneration(sampling=(option,)), "x", TextOptions(**{option: value}))
        assert taken.parameters == {option: value}


def test_logprobs_travel_as_a_parameter_and_are_taken_piece_by_piece() -> None:
    entries = [TokenLogprob("a", -0.5, (("a", -0.5), ("b", -1.25))), TokenLogprob("c", float("-inf"))]
    value = logprobs_to_parameter(entries)
    assert isinstance(value, str) and logprobs_from_parameter(value) == entries
    for bad in [3, "[1]", '[["a", "x", []]]', '[["a", true, []]]']:
        with pytest.raises(BadInput, match="response parameter 'logprobs'"):
            logprobs_from_parameter(bad)
    pieces = TextPieces(TextGeneration(stop=True))
    assert pieces.feed(piece("a", logprobs=logprobs_to_parameter(entries[:1]))) == "a"
    assert pieces.feed(piece("", logprobs=logprobs_to_parameter(entries[1:]))) == ""
    assert pieces.take_logprobs() == entries and pieces.take_logprobs() == []


def test_pieces_hold_back_a_possible_stop_and_cut_at_it() -> None:
    pieces = TextPieces(TextGeneration(), stop=("END", "xy"))
    out = [pieces.feed(piece(t)) for t in ("ab", "cE", "N", "x", "Dq")]
    assert out == ["ab", "c", "", "EN", "xDq"]  # "ENx" is no END (x may start xy); "xD" is no xy
    assert not pieces.done
    assert pieces.feed(piece("zE")) == "z"
    assert pieces.close() == "E"  # held back until the stream ended
    pieces = TextPieces(TextGeneration(), stop=("END",))
    assert [pieces.feed(piece(t)) for t in ("ab", "cEN", "Dzz", "more")] == ["ab", "c", "", ""]
    assert pieces.done and pieces.close() == "" and pieces.finish_reason == "stop"
    assert pieces.completion_tokens == 3


def test_counts_and_finish_reasons() -> None:
    counted = TextPieces(TextGeneration(), max_tokens=2)
    assert [counted.feed(piece(t)) for t in ("a", "b")] == ["a", "b"]
    counted.close()
    assert (counted.finish_reason, counted.prompt_tokens, counted.completion_tokens) == ("length", 0, 2)
    short = TextPieces(TextGeneration(), max_tokens=5)
    short.feed(piece("a"))
    short.close()
    assert short.finish_reason == "stop"  # the model ended before max_tokens
    reported = TextPieces(TextGeneration(stop=True, usage=True), stop=("zz",))
    reported.feed(piece("abc"))
    reported.feed(piece("", finish_reason="stop", prompt_tokens=4, completion_tokens=7))
    assert reported.close() == ""
    assert (reported.finish_reason, reported.prompt_tokens, reported.completion_tokens) == ("stop", 4, 7)
