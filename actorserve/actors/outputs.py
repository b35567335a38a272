"""Calling model code and checking what it hands back, so a model's fault fails only the
requests it touches, with a message naming the model.

- :func:`run_step`: one :meth:`BatchModel.step` for a batch. A step that raises for a
  batch of several items is run again for each item alone (when the model allows it,
  :attr:`BatchModel.isolate_failures`), so only the items that raise fail; a step that
  returns the wrong number of outputs fails its batch; an output that is not a
  :class:`StepOutput`, or whose response is malformed, fails its item.
- :func:`response_problem`: what is wrong with a response a model made (None: nothing),
  checked before any transport encodes it: the encoders may then trust every tensor.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ModelFailed
from ..limits import MAX_PARAMETER_DEPTH
from ..model import BatchModel, StepOutput
from ..types import DATATYPES, InferenceResponse, Tensor

if TYPE_CHECKING:
    from .workitem import WorkItem

log = logging.getLogger(__name__)


_INT_RANGE = range(-(2**63), 2**64)  # int64 or uint64: what every encoder can carry


def _value_problem(value: object, depth: int = 0) -> str | None:
    """Why a parameter value cannot be encoded (None: it can): JSON's scalars, numpy
    scalars, and lists / str-keyed dicts of them (gRPC carries only the scalars)."""
    if value is None or isinstance(value, (bool, float, str, np.generic)):
        return None
    if isinstance(value, int):
        return None if value in _INT_RANGE else f"the integer {value} does not fit in 64 bits"
    if depth < MAX_PARAMETER_DEPTH and isinstance(value, (list, tuple)):
        return next((p for p in (_value_problem(v, depth + 1) for v in value) if p), None)
    if depth < MAX_PARAMETER_DEPTH and isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return "a dict key is not a str"
        return next((p for p in (_value_problem(v, depth + 1) for v in value.values()) if p), None)
    return (
        f"a {type(value).__name__} is not a parameter value (bool, int, float, str, lists and dicts of them)"
    )


def _parameters_problem(parameters: dict[str, Any], where: str) -> str | None:
    for key, value in parameters.items():
        problem = _value_problem(value)
        if problem is not None:
            return f"{where} parameter {key!r}: {problem}"
    return None


def _tensor_problem(index: int, tensor: object) -> str | None:
    # Run for every output of every step on the stepping thread, between the model's
    # compute and the next step: the common case (a tuple shape, the datatype's own
    # dtype object) takes the identity tests first.
    if not isinstance(tensor, Tensor):
        return f"output {index} is a {type(tensor).__name__}, expected a Tensor"
    name, datatype = tensor.name, tensor.datatype
    expected = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if expected is None:
        return f"output {name!r}: unknown datatype {datatype!r}"
    packed = tensor.packed
    if packed is not None:  # a decoder's BYTES, passed through: checked when decoded
        if datatype != "BYTES" or len(packed) != math.prod(tensor.shape):
            return f"output {name!r}: {len(packed)} packed BYTES elements for {datatype} {list(tensor.shape)}"
        return _parameters_problem(tensor.parameters, f"output {name!r}:") if tensor.parameters else None
    data = tensor.data
    if not isinstance(data, np.ndarray):
        return f"output {name!r}: data is a {type(data).__name__}, expected a numpy array"
    if data.dtype is not expected and data.dtype != expected:
        return f"output {name!r}: {datatype} data has numpy dtype {data.dtype} (expected {expected})"
    shape = tensor.shape
    if type(shape) is not tuple or data.shape != shape:
        try:
            shape = tuple(shape)
        except TypeError:
            return f"output {name!r}: shape {shape!r} is not a list of sizes"
        if data.shape != shape:
            return f"output {name!r}: shape {list(shape)} but its data has shape {list(data.shape)}"
    if datatype == "BYTES":
        for value in data.flat:
            if not isinstance(value, bytes):
                return f"output {name!r}: a BYTES element is a {type(value).__name__}, expected bytes"
    if tensor.parameters:
        if not isinstance(tensor.parameters, dict):
            return f"output {name!r}: parameters is a {type(tensor.parameters).__name__}, expected a dict"
        return _parameters_problem(tensor.parameters, f"output {name!r}:")
    return None


def response_problem(response: object) -> str | None:
    """What is wrong with ``response`` as a model's answer (None: it can be encoded).
    Checks its type, each output's datatype, numpy dtype and shape, that BYTES
    elements are bytes, and that parameter values can be encoded; costs a few
    microseconds per tensor (BYTES: per element)."""
    if not isinstance(response, InferenceResponse):
        return f"returned a {type(response).__name__}, expected an InferenceResponse"
    if not isinstance(response.outputs, list):
        return f"response outputs is a {type(response.outputs).__name__}, expected a list"
    if not isinstance(response.parameters, dict):
        return f"response parameters is a {type(response.parameters).__name__}, expected a dict"
    for index, tensor in enumerate(response.outputs):
        problem = _tensor_problem(index, tensor)
        if problem is not None:
            return problem
    return _parameters_problem(response.parameters, "response") if response.parameters else None


def malformed(model: str, problem: str) -> ModelFailed:
    """The error of a request whose model answered with something malformed (logged)."""
    error = ModelFailed(f"model {model!r} returned a malformed answer: {problem}")
    log.error("%s", error)
    return error


def _checked(model: BatchModel[Any, Any], outputs: object, count: int) -> list[StepOutput] | ModelFailed:
    """``outputs`` of a step of ``count`` items, each malformed one replaced by its error."""
    if not isinstance(outputs, list) or len(outputs) != count:
        got = f"{len(outputs)} outputs" if isinstance(outputs, list) else f"a {type(outputs).__name__}"
        return malformed(model.name, f"step returned {got} for {count} items (one StepOutput per item)")
    checked: list[StepOutput] | None = None
    for index, out in enumerate(outputs):
        problem: str | None
        if not isinstance(out, StepOutput):
            problem = f"step output {index} is a {type(out).__name__}, expected a StepOutput"
        elif out.error is not None and not isinstance(out.error, Exception):
            problem = f"step output {index}: error is a {type(out.error).__name__}, expected an exception"
        elif out.response is not None:
            problem = response_problem(out.response)
        else:
            continue
        if problem is None:
            continue
        if checked is None:
            checked = list(outputs)
        checked[index] = StepOutput(error=malformed(model.name, problem), done=True)
    return checked if checked is not None else outputs


def run_step(
    model: BatchModel[Any, Any],
    batch: list[WorkItem],
    name: str,
    on_call: Callable[[], None] | None = None,
) -> list[StepOutput] | BaseException:
    """``model.step`` for ``batch``: one checked output per item, or why the whole batch
    failed (the exception the step raised, or :class:`ModelFailed`), logged.

    ``on_call`` is called before each call of ``step`` (the step loop's deadline starts
    there: a batch being isolated item by item gets a deadline per call)."""
    if on_call is not None:
        on_call()
    try:
        outputs = model.step([item.work for item in batch])
    except Exception as exc:
        if len(batch) == 1 or not model.isolate_failures:
            log.error("%s: step of %d items raised", name, len(batch), exc_info=exc)
            return exc
        log.warning(
            "%s: step of %d items raised %s: %s; stepping each item alone to fail only those that raise",
            name,
            len(batch),
            type(exc).__name__,
            exc,
        )
        return [_alone(model, item, on_call) for item in batch]
    return _checked(model, outputs, len(batch))


def _alone(model: BatchModel[Any, Any], item: WorkItem, on_call: Callable[[], None] | None) -> StepOutput:
    if on_call is not None:
        on_call()
    try:
        outputs = model.step([item.work])
    except Exception as exc:
        return StepOutput(error=ModelFailed.wrap(model.name, exc), done=True)
    checked = _checked(model, outputs, 1)
    return StepOutput(error=checked, done=True) if isinstance(checked, ModelFailed) else checked[0]
