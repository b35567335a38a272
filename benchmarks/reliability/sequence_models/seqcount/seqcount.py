"""``seqcount``: a stateful streaming BatchModel that counts its own hook calls, for the
sequence-race runs against a real server (``sequence_races.py``,
``tests/reliability/test_rel_sequence_multiprocess.py``), where the test cannot look at
the model object.

A request of a sequence streams ``n_tokens`` responses (default 1), each with output
``total`` (INT64: tokens the sequence emitted so far). A request with parameter
``report`` (no sequence) answers output ``hooks`` (INT64 [6]): states made, sequences
ended, hooks run twice (``on_sequence_end`` of one state, ``on_request_cancelled`` of one
request), requests told they were cancelled, states open now, and the other items in the
batch of the step that answers it (batch slots held; 0 when the server is quiet).

When the model version stops (``unload``) it writes the same counts to
``tally-<pid>-<id>.json`` in its model folder, so a run that unloads and loads the model
again still sees every instance's counts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from actorserve import BatchModel, InferenceRequest, ModelSettings, StepOutput
from actorserve.codecs import tensor_from_numpy
from actorserve.model import int_parameter


@attrs.define(eq=False)
class Tally:
    sequence_id: str
    total: int = 0
    ended: bool = False


@attrs.define(eq=False)
class Tokens:
    request: InferenceRequest
    state: Tally | None
    n: int
    emitted: int = 0
    report: bool = False
    told: bool = False  # on_request_cancelled ran for it


class SeqCountModel(BatchModel[Tally, Tokens]):
    default_max_batch_size = 8
    step_in_thread = True

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)
        self.states = 0
        self.ended = 0
        self.doubles = 0
        self.cancelled = 0

    def new_state(self, sequence_id: str) -> Tally:
        state = Tally(sequence_id)
        self.states += 1
        return state

    def begin(self, request: InferenceRequest, state: Tally | None) -> Tokens:
        if request.parameters.get("report"):
            return Tokens(request, None, 0, report=True)
        return Tokens(request, state, int_parameter(request, "n_tokens", 1, minimum=0, maximum=1_000_000))

    def step(self, batch: list[Tokens]) -> list[StepOutput]:
        outputs = []
        for work in batch:
            if work.report:
                hooks = [*self.counts(), len(batch) - 1]
                tensor = tensor_from_numpy("hooks", np.array(hooks, dtype=np.int64))
                outputs.append(StepOutput(self.response(work.request, [tensor]), done=True))
                continue
            if work.emitted >= work.n:
                outputs.append(StepOutput(done=True))
                continue
            work.emitted += 1
            total = work.emitted
            if work.state is not None:
                work.state.total += 1
                total = work.state.total
            tensor = tensor_from_numpy("total", np.array([total], dtype=np.int64))
            outputs.append(StepOutput(self.response(work.request, [tensor]), done=work.emitted >= work.n))
        return outputs

    def counts(self) -> list[int]:
        return [self.states, self.ended, self.doubles, self.cancelled, self.states - self.ended]

    async def unload(self) -> None:
        folder = self.settings.folder
        if folder is not None:
            path = Path(folder) / f"tally-{os.getpid()}-{id(self)}.json"
            path.write_text(json.dumps(self.counts()))

    def on_sequence_end(self, state: Tally, reason: Any) -> None:
        if state.ended:
            self.doubles += 1
            return
        state.ended = True
        self.ended += 1

    def on_request_cancelled(self, work: Tokens) -> None:
        if work.told:
            self.doubles += 1
            return
        work.told = True
        self.cancelled += 1
