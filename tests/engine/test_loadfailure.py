"""What a failed load says (``actorserve.engine.loadfailure``): the model's own error out of
trio's exception groups, and the innermost line of the model's code it came from."""

from __future__ import annotations

import pytest
import trio

import actorserve
from actorserve import Model, ModelSettings
from actorserve.engine.loadfailure import explain, underlying
from actorserve.errors import ModelFailed
from actorserve.models.identity import IdentityModel


class NeedsWeights(Model):
    async def load(self) -> None:
        self.weights = open_weights()


def open_weights() -> bytes:
    raise FileNotFoundError("weights.bin")


def test_underlying_digs_through_nested_groups_past_cancellations() -> None:
    error = ValueError("the real one")
    cancelled = trio.Cancelled._create()
    group = BaseExceptionGroup("outer", [cancelled, ExceptionGroup("inner", [error])])
    assert underlying(group) is error
    assert underlying(error) is error


async def test_a_model_class_in_code_is_placed_by_the_file_that_defines_it() -> None:
    with pytest.raises(ModelFailed) as info:
        async with actorserve.open_engine([ModelSettings(name="w", implementation=NeedsWeights)]):
            pass
    line = open_weights.__code__.co_firstlineno + 1
    assert info.value.message == (
        f"loading model 'w' failed: FileNotFoundError: weights.bin ({__file__}, line {line}, in open_weights)"
    )


def test_an_error_outside_the_model_code_has_no_place() -> None:
    try:
        raise KeyError("x")
    except KeyError as exc:
        assert explain(exc, None, IdentityModel) == "KeyError: 'x'"  # not raised in identity.py
