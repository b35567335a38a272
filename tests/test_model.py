"""The request-parameter helpers of ``actorserve.model``: what a client reads when a
value is out of range (a missing bound is not shown as ``None``)."""

from __future__ import annotations

import pytest

from actorserve import BadInput, InferenceRequest
from actorserve.model import float_parameter, int_parameter


@pytest.mark.parametrize(
    ("value", "bounds", "message"),
    [
        (-1, {"minimum": 0}, "parameter 'p': expected an integer >= 0, got -1"),
        (11, {"maximum": 10}, "parameter 'p': expected an integer <= 10, got 11"),
        (11, {"minimum": 0, "maximum": 10}, "parameter 'p': expected an integer in [0, 10], got 11"),
    ],
)
def test_an_integer_out_of_range_names_only_its_bounds(
    value: int, bounds: dict[str, int], message: str
) -> None:
    with pytest.raises(BadInput) as info:
        int_parameter(InferenceRequest(inputs=[], parameters={"p": value}), "p", 0, **bounds)
    assert info.value.message == message


def test_a_number_out_of_range_names_only_its_bounds() -> None:
    with pytest.raises(BadInput) as info:
        float_parameter(InferenceRequest(inputs=[], parameters={"p": -0.5}), "p", 1.0, minimum=0.0)
    assert info.value.message == "parameter 'p': expected a number >= 0.0, got -0.5"
