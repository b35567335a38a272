"""A model of the tests' own for the playground: it takes no text, so the page must offer
it a raw OIP request; its parameters are declared partly by the class (``count``) and
partly by its settings (``step``), so the metadata must show both."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

import numpy as np

from actorserve import InferenceRequest, InferenceResponse, Model, ModelSettings
from actorserve.codecs import tensor_from_numpy
from actorserve.model import int_parameter
from actorserve.settings import TensorSpec


class CountdownModel(Model):
    """Input ``start`` INT64 [1]; streams ``count`` responses (default 3) whose ``value``
    goes down from ``start`` by ``step`` (default 1)."""

    request_parameters: ClassVar[frozenset[str] | None] = frozenset({"count"})

    async def predict_stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for request in requests:
            start = int(request.inputs[0].as_numpy().reshape(-1)[0])
            count = int_parameter(request, "count", 3, minimum=0, maximum=100)
            step = int_parameter(request, "step", 1, minimum=-100, maximum=100)
            for k in range(count):
                value = np.array([start - k * step], dtype=np.int64)
                yield self.response(request, [tensor_from_numpy("value", value)])


def countdown_settings() -> ModelSettings:
    return ModelSettings(
        name="countdown",
        implementation="support.countdown.CountdownModel",
        inputs=(TensorSpec("start", "INT64", (1,)),),
        outputs=(TensorSpec("value", "INT64", (1,)),),
        request_parameters=frozenset({"step"}),
    )
