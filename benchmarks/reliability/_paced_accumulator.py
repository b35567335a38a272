"""``accumulator`` with each step held ``step_delay`` seconds (a model parameter), so that
its capacity is ``max_batch_size / step_delay`` calls a second whatever the CPU: the
overload soak's ``--paced`` mode copies this file into the model's folder (a model
folder's own module, see ``actorserve/engine/repository.py``)."""

from __future__ import annotations

import time
from typing import Any

from actorserve.model import StepOutput
from actorserve.models.accumulator import AccumulatorModel, Add


class PacedAccumulator(AccumulatorModel):
    step_in_thread = True  # the delay blocks the replica's own thread, not the event loop

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.step_delay = float(self.parameters.get("step_delay", 0.0))

    def step(self, batch: list[Add]) -> list[StepOutput]:
        time.sleep(self.step_delay)
        return super().step(batch)
