"""Model faults at the step: ``run_step`` isolates the items a raising step raises for,
and turns every malformed output into that item's error naming the model (no server:
the function the step loop and the inline batcher both call)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.rel_faults import FaultyBatchModel, Seq, Work

from actorserve import InferenceRequest, StepOutput
from actorserve.actors.outputs import response_problem, run_step
from actorserve.actors.replies import new_item
from actorserve.actors.workitem import WorkItem
from actorserve.errors import ModelFailed
from actorserve.settings import ModelSettings
from actorserve.types import InferenceResponse, Tensor


def model(**changes: Any) -> FaultyBatchModel:
    return FaultyBatchModel(ModelSettings(name="faulty", implementation=FaultyBatchModel, **changes))


def items(m: FaultyBatchModel, *faults: str) -> list[WorkItem]:
    batch = []
    for index, fault in enumerate(faults):
        request = InferenceRequest(inputs=[], id=f"r{index}", parameters={"fault": fault, "n": 3})
        item = new_item(request, 4)
        item.work = m.begin(request, Seq(f"s{index}"))
        batch.append(item)
    return batch


def ks(out: StepOutput) -> int:
    assert out.error is None and out.response is not None
    return int(out.response.output("k").data[0])


def test_a_step_raising_for_one_item_fails_only_that_item_and_steps_the_others_once() -> None:
    m = model()
    batch = items(m, "", "raise", "", "")
    outputs = run_step(m, batch, "faulty replica 0")
    assert isinstance(outputs, list)
    assert [ks(o) for i, o in enumerate(outputs) if i != 1] == [1, 1, 1]
    failed = outputs[1]
    assert failed.done and isinstance(failed.error, ModelFailed)
    assert str(failed.error) == "model 'faulty' failed: RuntimeError: step broke on r1"
    works: list[Work] = [item.work for item in batch]
    # every good item stepped exactly once: the raising batch step changed nothing
    assert [w.state.steps for w in works if w.state is not None] == [[1], [], [1], [1]]


def test_a_model_that_cannot_be_stepped_again_fails_the_whole_batch() -> None:
    m = model()
    m.isolate_failures = False  # type: ignore[misc]
    outputs = run_step(m, items(m, "", "raise"), "faulty replica 0")
    assert isinstance(outputs, RuntimeError)
    assert str(outputs) == "step broke on r1"


def test_a_single_raising_item_is_not_stepped_again() -> None:
    m = model()
    outputs = run_step(m, items(m, "raise"), "faulty replica 0")
    assert isinstance(outputs, RuntimeError)


def test_several_raising_items_each_fail_on_their_own() -> None:
    m = model()
    outputs = run_step(m, items(m, "raise", "", "raise"), "r")
    assert isinstance(outputs, list)
    assert [type(o.error).__name__ for o in outputs] == ["ModelFailed", "NoneType", "ModelFailed"]
    assert ks(outputs[1]) == 1


def test_the_wrong_number_of_outputs_fails_the_batch_naming_the_model() -> None:
    m = model()
    outputs = run_step(m, items(m, "", "count"), "r")
    assert isinstance(outputs, ModelFailed)
    assert str(outputs) == (
        "model 'faulty' returned a malformed answer: step returned 1 outputs for 2 items (one StepOutput per item)"
    )


@pytest.mark.parametrize(
    ("fault", "problem"),
    [
        ("notstep", "step output 1 is a str, expected a StepOutput"),
        ("notresponse", "returned a dict, expected an InferenceResponse"),
        ("dtype", "output 'y': FP32 data has numpy dtype object (expected float32)"),
        ("shape", "output 'y': shape [3] but its data has shape [2]"),
        ("bytes", "output 'y': a BYTES element is a NoneType, expected bytes"),
        (
            "params",
            "response parameter 'bad': a set is not a parameter value (bool, int, float, str, lists and dicts of them)",
        ),
    ],
)
def test_a_malformed_output_fails_only_its_item(fault: str, problem: str) -> None:
    m = model()
    outputs = run_step(m, items(m, "", fault, ""), "r")
    assert isinstance(outputs, list)
    assert ks(outputs[0]) == 1 and ks(outputs[2]) == 1
    error = outputs[1].error
    assert outputs[1].done and isinstance(error, ModelFailed)
    assert str(error) == f"model 'faulty' returned a malformed answer: {problem}"


def test_response_problem_accepts_every_good_tensor_and_names_what_is_wrong() -> None:
    good = InferenceResponse(
        model_name="m",
        outputs=[
            Tensor("a", (2, 1), "FP32", np.zeros((2, 1), np.float32)),
            Tensor("b", (1,), "BYTES", np.array([b"x"], dtype=object)),
            Tensor("c", (0,), "INT64", np.zeros(0, np.int64)),
        ],
    )
    assert response_problem(good) is None
    assert response_problem(None) == "returned a NoneType, expected an InferenceResponse"
    bad_list = InferenceResponse(model_name="m", outputs=[None])  # type: ignore[list-item]
    assert response_problem(bad_list) == "output 0 is a NoneType, expected a Tensor"
    unknown = InferenceResponse(model_name="m", outputs=[Tensor("a", (1,), "FLOAT", np.zeros(1))])
    assert response_problem(unknown) == "output 'a': unknown datatype 'FLOAT'"
    not_array = InferenceResponse(model_name="m", outputs=[Tensor("a", (1,), "FP32", [1.0])])  # type: ignore[arg-type]
    assert response_problem(not_array) == "output 'a': data is a list, expected a numpy array"
    fine = {"a": [1, 2.5, None, "x", {"b": True}], "n": np.int32(3), "u": 2**64 - 1}
    assert response_problem(InferenceResponse(model_name="m", outputs=[], parameters=fine)) is None
    huge = InferenceResponse(model_name="m", outputs=[], parameters={"n": [2**64]})
    assert (
        response_problem(huge)
        == "response parameter 'n': the integer 18446744073709551616 does not fit in 64 bits"
    )
    keyed = InferenceResponse(model_name="m", outputs=[], parameters={"d": {1: "x"}})
    assert response_problem(keyed) == "response parameter 'd': a dict key is not a str"
    tensor = Tensor("t", (1,), "INT8", np.zeros(1, np.int8), {"p": object()})
    assert response_problem(InferenceResponse(model_name="m", outputs=[tensor])) == (
        "output 't': parameter 'p': a object is not a parameter value (bool, int, float, str, lists and dicts of them)"
    )
    error_not_exception = StepOutput(error="boom")  # type: ignore[arg-type]
    m = model()
    batch = items(m, "")
    m.step = lambda works: [error_not_exception]  # type: ignore[method-assign]
    outputs = run_step(m, batch, "r")
    assert isinstance(outputs, list)
    assert str(outputs[0].error) == (
        "model 'faulty' returned a malformed answer: step output 0: error is a str, expected an exception"
    )


def test_response_problem_takes_shapes_as_any_sequence_and_dtypes_by_value() -> None:
    """The checks' fast path (a tuple shape, the datatype's own dtype object) gives the
    same answers as the general one."""

    def problem(tensor: Tensor) -> str | None:
        return response_problem(InferenceResponse(model_name="m", outputs=[tensor]))

    data = np.zeros((2, 3), np.int64)
    assert problem(Tensor("a", [2, 3], "INT64", data)) is None  # type: ignore[arg-type]
    assert problem(Tensor("a", np.array([2, 3]), "INT64", data)) is None  # type: ignore[arg-type]
    assert problem(Tensor("a", (np.int64(2), 3), "INT64", data)) is None
    assert (
        problem(Tensor("a", [3, 2], "INT64", data))
        == "output 'a': shape [3, 2] but its data has shape [2, 3]"
    )
    assert problem(Tensor("a", 6, "INT64", data)) == "output 'a': shape 6 is not a list of sizes"  # type: ignore[arg-type]
    by_value = np.dtype(np.int64, metadata={"unit": "token"})  # equal to int64, another object
    assert problem(Tensor("a", (2, 3), "INT64", data.astype(by_value))) is None
    assert problem(Tensor("a", (2, 3), "INT64", data.astype(">i8"))) == (
        "output 'a': INT64 data has numpy dtype >i8 (expected int64)"
    )
    assert problem(Tensor("a", (2, 3), "INT64", data.astype(np.int32))) == (
        "output 'a': INT64 data has numpy dtype int32 (expected int64)"
    )
    text = np.array([[b"x", b"y"], [b"z", "w"]], dtype=object)
    assert (
        problem(Tensor("t", (2, 2), "BYTES", text)) == "output 't': a BYTES element is a str, expected bytes"
    )
    assert problem(Tensor("t", (2, 2), "BYTES", text[:, :1].repeat(2, axis=1))) is None
