"""``accumulator``: a stateful BatchModel keeping a running sum per sequence."""

from __future__ import annotations

from typing import ClassVar

import attrs
import numpy as np

from ..codecs import tensor_from_numpy
from ..errors import BadInput
from ..model import BatchModel, StepOutput
from ..types import InferenceRequest


@attrs.define(slots=True)
class Sum:
    total: int = 0


@attrs.define(slots=True)
class Add:
    request: InferenceRequest
    state: Sum
    value: int


class AccumulatorModel(BatchModel[Sum, Add]):
    """Input ``INPUT`` INT64 [1]; output ``OUTPUT`` INT64 [1] = the running sum of the
    sequence. Every request must belong to a sequence."""

    requires_sequence = True
    request_parameters: ClassVar[frozenset[str] | None] = frozenset()  # the sequence ones only
    default_max_batch_size = 64
    step_in_thread = False  # adding integers: a thread hop would cost more than the step

    def new_state(self, sequence_id: str) -> Sum:
        return Sum()

    def begin(self, request: InferenceRequest, state: Sum | None) -> Add:
        if state is None:
            raise BadInput(f"model {self.name!r} is stateful: send a sequence_id (and sequence_start)")
        tensor = request.input("INPUT")
        assert tensor is not None
        if tensor.datatype != "INT64" or tensor.data.size != 1:
            raise BadInput(
                f"input 'INPUT': expected INT64 with shape [1], got {tensor.datatype} {list(tensor.shape)}"
            )
        return Add(request, state, int(tensor.data.reshape(-1)[0]))

    def step(self, batch: list[Add]) -> list[StepOutput]:
        outputs = []
        for work in batch:
            work.state.total += work.value
            out = tensor_from_numpy("OUTPUT", np.array([work.state.total], dtype=np.int64), "INT64")
            outputs.append(StepOutput(self.response(work.request, [out]), done=True))
        return outputs
