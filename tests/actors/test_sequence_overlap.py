"""``BatchModel.sequence_overlap`` and ``StepOutput.end_sequence``: a sequence's next
request joins the batch while the previous one streams, and a model ends its sequence
from a step's output (what TorchServe's continuous batching needs)."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import numpy as np
import pytest
import trio
import trio.testing

import actorserve
from actorserve import (
    BatchModel,
    InferenceRequest,
    ModelSettings,
    SequenceNotFound,
    SequenceSettings,
    StepOutput,
)
from actorserve.api import EndReason
from actorserve.codecs import tensor_from_numpy


@attrs.define
class Flag:
    stop: bool = False


@attrs.define
class Op:
    request: InferenceRequest
    state: Flag
    stop: bool


class OverlapModel(BatchModel[Flag, Op]):
    """``op=stream`` answers on every step until its sequence's ``op=stop``, which answers
    once and ends the sequence."""

    sequence_overlap = True
    step_in_thread = False
    requires_sequence = True
    ended: ClassVar[list[tuple[str, str]]] = []

    def new_state(self, sequence_id: str) -> Flag:
        return Flag()

    def begin(self, request: InferenceRequest, state: Flag | None) -> Op:
        assert state is not None
        return Op(request, state, request.parameters.get("op") == "stop")

    def step(self, batch: list[Op]) -> list[StepOutput]:
        outputs = []
        for work in batch:
            if work.stop:
                work.state.stop = True
        for work in batch:
            out = tensor_from_numpy("stop", np.array([work.stop]), "BOOL")
            response = self.response(work.request, [out])
            if work.stop:
                outputs.append(StepOutput(response, done=True, end_sequence=True))
            else:
                outputs.append(StepOutput(response, done=work.state.stop))
        return outputs

    def on_sequence_end(self, state: Flag, reason: EndReason) -> None:
        OverlapModel.ended.append(("s", str(reason)))


def op(name: str, **params: Any) -> InferenceRequest:
    return InferenceRequest([], parameters={"op": name, **params})


async def test_a_later_request_joins_while_one_streams_and_ends_the_sequence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    OverlapModel.ended.clear()
    settings = ModelSettings("overlap", OverlapModel, sequence=SequenceSettings(idle_timeout_ms=1000))
    async with actorserve.open_engine([settings]) as engine:
        seen = 0
        async with engine.infer_stream(
            op("stream", sequence_id="s", sequence_start=True), model="overlap"
        ) as stream:
            async for _response in stream:
                seen += 1
                if seen == 3:  # it streams on: a request of its own sequence is served meanwhile
                    last = await engine.infer(op("stop", sequence_id="s"), model="overlap")
                    assert last.outputs[0].data.tolist() == [True]
        assert seen >= 4  # its last response came in the step that stopped it
        assert OverlapModel.ended == [("s", "ended")]  # the model's end_sequence ended it
        with pytest.raises(SequenceNotFound, match="sequence 's' has ended"):
            await engine.infer(op("stream", sequence_id="s"), model="overlap")
        # a sequence whose stream still runs is not idle: it outlives the idle timeout
        async with engine.infer_stream(
            op("stream", sequence_id="t", sequence_start=True), model="overlap"
        ) as stream:
            await stream.__anext__()
            await trio.sleep(5)
            stats = await engine.statistics("overlap")
            assert stats.open_sequences == 1
        # once it stopped streaming (its caller left), the idle clock runs
        await trio.sleep(2)
        assert (await engine.statistics("overlap")).open_sequences == 0
        assert OverlapModel.ended[-1] == ("s", "expired")
