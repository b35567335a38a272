"""Requests checked against what a model declares (names, datatypes, shapes, optional
inputs, request parameters), the declarations in model-settings.json, and valid
metadata for every built-in model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import actorserve
from actorserve import BadInput, InferenceRequest, Model
from actorserve.codecs import tensor_from_numpy
from actorserve.models import builtin_settings as builtin_models
from actorserve.settings import (
    ANY_DATATYPE,
    ModelSettings,
    SettingsError,
    TensorSpec,
    load_model_settings,
)
from actorserve.types import DATATYPES, Tensor
from actorserve.validation import RESERVED_PARAMETERS, RequestContract


class Reads(Model):
    request_parameters = frozenset({"n", "mode"})


def contract(*inputs: TensorSpec, model_class: type[Model] = Model, **changes: Any) -> RequestContract:
    settings = ModelSettings(name="m", implementation=model_class, inputs=inputs, **changes)
    made = RequestContract.of(settings, model_class)
    assert made is not None
    return made


def text(name: str = "text_input", value: str = "hi") -> Tensor:
    data = np.empty(1, dtype=object)
    data[0] = value.encode()
    return tensor_from_numpy(name, data, "BYTES")


def ints(name: str, shape: tuple[int, ...]) -> Tensor:
    return tensor_from_numpy(name, np.zeros(shape, dtype=np.int64))


def refusal(rule: RequestContract, *inputs: Tensor, **parameters: Any) -> str:
    with pytest.raises(BadInput) as info:
        rule.check(InferenceRequest(list(inputs), parameters=parameters))
    return info.value.message


TEXT = TensorSpec("text_input", "BYTES", (1,))
MATRIX = TensorSpec("x", "INT64", (-1, 3))


def test_a_model_that_declares_nothing_has_no_contract() -> None:
    assert RequestContract.of(ModelSettings(name="m", implementation=Model), Model) is None


def test_declared_inputs_pass() -> None:
    rule = contract(TEXT, MATRIX)
    rule.check(InferenceRequest([text(), ints("x", (2, 3))]))
    rule.check(InferenceRequest([ints("x", (0, 3)), text()]))  # any order, -1 takes 0


def test_an_unknown_input_names_the_declared_ones() -> None:
    rule = contract(TEXT, TensorSpec("extra", "FP32", (-1,), optional=True))
    assert refusal(rule, text("prompt")) == ("model 'm' has no input 'prompt' (expected text_input, extra)")


def test_a_missing_required_input() -> None:
    rule = contract(TEXT, MATRIX)
    assert refusal(rule, text()) == "missing required input 'x'"
    assert refusal(rule) == "missing required inputs 'text_input', 'x'"


def test_an_optional_input_may_be_left_out() -> None:
    rule = contract(TensorSpec("text_input", "BYTES", (1,), optional=True))
    rule.check(InferenceRequest([]))
    rule.check(InferenceRequest([text()]))


def test_a_wrong_datatype_says_what_was_expected() -> None:
    assert refusal(contract(TEXT), ints("text_input", (1,))) == (
        "input 'text_input' of model 'm': expected BYTES, got INT64"
    )


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((3,), "input 'x' of model 'm': expected shape [-1, 3] (-1: any size), got [3]"),
        ((2, 4), "input 'x' of model 'm': expected shape [-1, 3] (-1: any size), got [2, 4]"),
        ((1, 1, 3), "input 'x' of model 'm': expected shape [-1, 3] (-1: any size), got [1, 1, 3]"),
    ],
)
def test_a_wrong_shape_or_rank(shape: tuple[int, ...], message: str) -> None:
    assert refusal(contract(MATRIX), ints("x", shape)) == message


def test_an_input_given_twice() -> None:
    assert refusal(contract(TEXT), text(), text()) == "input 'text_input' of model 'm' is given twice"


def test_any_datatype_takes_every_datatype_and_shape() -> None:
    rule = contract(TensorSpec("INPUT0", ANY_DATATYPE, (-1,)))
    for datatype, dtype in DATATYPES.items():
        data = np.zeros((2, 2), dtype=dtype) if datatype != "BYTES" else np.array([[b"a"]], dtype=object)
        rule.check(InferenceRequest([tensor_from_numpy("INPUT0", data, datatype)]))
    assert refusal(rule, ints("INPUT9", (1,))) == "model 'm' has no input 'INPUT9' (expected INPUT0)"


def test_declared_parameters() -> None:
    rule = contract(model_class=Reads)
    rule.check(InferenceRequest([ints("anything", (5,))], parameters={"n": 1, "mode": "x"}))
    assert (
        refusal(rule, n=1, max_tokenz=5)
        == "model 'm' has no parameter 'max_tokenz'; its parameters are: mode, n"
    )
    assert refusal(rule, a=1, b=2) == "model 'm' has no parameters 'a', 'b'; its parameters are: mode, n"


def test_sequence_and_transport_parameters_are_never_unknown() -> None:
    rule = contract(TEXT, request_parameters=frozenset())
    rule.check(InferenceRequest([text()], parameters=dict.fromkeys(RESERVED_PARAMETERS, False)))
    assert {
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "sequence_cancel",
        "binary_data_output",
    } <= RESERVED_PARAMETERS
    assert refusal(rule, text(), n=1) == "model 'm' has no parameter 'n'; its parameters are: none"


def test_a_cancel_carries_no_inputs() -> None:
    rule = contract(TEXT)
    rule.check(InferenceRequest([], parameters={"sequence_id": 3, "sequence_cancel": True}))
    assert refusal(rule, sequence_id=3, sequence_cancel="no") == "missing required input 'text_input'"


def test_settings_parameters_add_to_the_class_ones() -> None:
    rule = contract(model_class=Reads, request_parameters=frozenset({"extra"}))
    assert rule.parameters == {"n", "mode", "extra"}
    only_settings = contract(request_parameters=frozenset({"extra"}))
    assert only_settings.parameters == {"extra"} and only_settings.inputs == {}


# -- declarations in model-settings.json -----------------------------------------------


def write(folder: Path, **data: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model-settings.json"
    path.write_text(json.dumps({"name": "m", "implementation": "x.Y", **data}))
    return path


def test_settings_declare_optional_inputs_any_datatype_and_parameters(tmp_path: Path) -> None:
    write(
        tmp_path,
        inputs=[
            {"name": "a", "datatype": "BYTES", "shape": [1], "optional": True},
            {"name": "b", "datatype": "ANY", "shape": [-1]},
        ],
        request={"parameters": ["n_tokens", "delay"]},
    )
    settings = load_model_settings(tmp_path)
    assert settings.inputs == (
        TensorSpec("a", "BYTES", (1,), optional=True),
        TensorSpec("b", ANY_DATATYPE, (-1,)),
    )
    assert settings.request_parameters == {"n_tokens", "delay"}
    assert [s.metadata_datatype for s in settings.inputs] == ["BYTES", "FP32"]


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (
            {"inputs": [{"name": "a", "datatype": "", "shape": [1]}]},
            "inputs: tensor 'a': datatype '' is not an OIP datatype (BOOL, UINT8",
        ),
        (
            {"inputs": [{"name": "a", "datatype": "fp32", "shape": [1]}]},
            "tensor 'a': datatype 'fp32' is not an OIP datatype",
        ),
        (
            {"outputs": [{"name": "a", "datatype": "STRING", "shape": [1]}]},
            "outputs: tensor 'a': datatype 'STRING'",
        ),
        (
            {"inputs": [{"name": "a", "shape": [1]}]},
            "inputs: tensor 'a' needs a 'datatype' (an OIP datatype or 'ANY')",
        ),
        (
            {"inputs": [{"name": "a", "datatype": "FP32", "shape": [-2]}]},
            "shape [-2]: a dimension is >= 0, or -1",
        ),
        (
            {"inputs": [{"name": "a", "datatype": "FP32", "shape": "1"}]},
            "tensor 'a' needs a 'shape', a list of integers (-1: any size)",
        ),
        ({"inputs": [{"name": "a", "datatype": "FP32"}]}, "tensor 'a' needs a 'shape'"),
        (
            {"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "optional": "yes"}]},
            "'optional' must be true or false",
        ),
        (
            {"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "dims": [1]}]},
            "unknown tensor key(s) dims",
        ),
        ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1]}] * 2}, "appears twice"),
        ({"request": {"parameters": "n"}}, "'request.parameters' must be a list of parameter names"),
        ({"request": {"params": ["n"]}}, "'request' must be an object with a 'parameters' list"),
    ],
)
def test_bad_declarations_are_settings_errors(tmp_path: Path, data: dict[str, Any], problem: str) -> None:
    path = write(tmp_path, **data)
    with pytest.raises(SettingsError) as info:
        load_model_settings(path)
    assert str(info.value).startswith(str(path))
    assert problem in str(info.value)


def test_a_tensor_spec_in_code_needs_a_valid_datatype() -> None:
    with pytest.raises(SettingsError, match="datatype '' is not an OIP datatype"):
        TensorSpec("INPUT0", "", (-1,))


# -- the built-in models ----------------------------------------------------------------

LIGHT = [m for m in builtin_models() if m.name != "text"]


async def test_every_builtin_models_metadata_uses_oip_datatypes() -> None:
    for settings in builtin_models():  # the text model's metadata without loading its weights
        for spec in (*settings.inputs, *settings.outputs):
            assert spec.metadata_datatype in DATATYPES, (settings.name, spec)
    async with actorserve.open_engine(LIGHT) as engine:
        for info in await engine.models():
            meta = await engine.metadata(info.name)
            datatypes = [t.datatype for t in (*meta.inputs, *meta.outputs)]
            assert datatypes and all(d in DATATYPES for d in datatypes), (info.name, datatypes)
        identity = await engine.metadata("identity")
        assert [(t.name, t.datatype, t.shape, t.any_datatype) for t in identity.inputs] == [
            ("INPUT0", "FP32", (-1,), True),
            ("INPUT1", "FP32", (-1,), True),
        ]
        assert identity.input_datatypes() == {"INPUT0": "", "INPUT1": ""}


async def test_the_light_builtins_enforce_their_declarations() -> None:
    async with actorserve.open_engine(LIGHT) as engine:
        with pytest.raises(
            BadInput,
            match=r"^model 'streamer' has no parameter 'n_token'; its parameters are: delay, n_tokens, usage$",
        ):
            await engine.infer(InferenceRequest([text()], parameters={"n_token": 2}), model="streamer")
        with pytest.raises(
            BadInput, match=r"^model 'accumulator' has no parameter 'n'; its parameters are: none$"
        ):
            await engine.infer(
                InferenceRequest([ints("INPUT", (1,))], parameters={"n": 1, "sequence_start": True}),
                model="accumulator",
            )
        with pytest.raises(BadInput, match=r"^input 'INPUT' of model 'accumulator': expected shape \[1\]"):
            await engine.infer(
                InferenceRequest([ints("INPUT", (2,))], parameters={"sequence_start": True}),
                model="accumulator",
            )
        with pytest.raises(BadInput, match=r"^missing required input 'INPUT0'$"):
            await engine.infer(InferenceRequest([ints("INPUT1", (1,))]), model="identity")
        echoed = await engine.infer(
            InferenceRequest([ints("INPUT0", (2, 2))], parameters={"anything": 1}), model="identity"
        )
        assert echoed.parameters == {"anything": 1}  # identity declares no parameters

        async def stream() -> Any:
            yield InferenceRequest([text()], parameters={"n_tokens": 1})
            yield InferenceRequest([text("prompt")])

        with pytest.raises(BadInput, match=r"^model 'streamer' has no input 'prompt'"):
            async with engine.stream(stream(), model="streamer") as responses:
                async for _ in responses:
                    pass
