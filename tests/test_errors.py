"""The domain errors: one way to report a model's own exception."""

from __future__ import annotations

import logging

import pytest

from actorserve import api, model
from actorserve.errors import BadInput, ModelFailed


def test_model_failed_wrap_names_the_model_and_logs_the_traceback(caplog: pytest.LogCaptureFixture) -> None:
    broke = RuntimeError("the model broke")
    with caplog.at_level(logging.ERROR):
        error = ModelFailed.wrap("m", broke)
        during = ModelFailed.wrap("m", broke, "in sequence 's'")
    assert error.message == "model 'm' failed: RuntimeError: the model broke"
    assert during.message == "model 'm' failed in sequence 's': RuntimeError: the model broke"
    assert [r.getMessage() for r in caplog.records] == [
        "model 'm' failed",
        "model 'm' failed in sequence 's'",
    ]
    assert all(r.exc_info and r.exc_info[1] is broke for r in caplog.records)


def test_one_bool_parser_and_end_reasons_from_the_enum() -> None:
    assert model.bool_parameter is api.bool_parameter
    assert model.END_REASONS == tuple(api.EndReason)
    assert "expired" in model.END_REASONS and api.EndReason.EXPIRED == "expired"
    with pytest.raises(BadInput, match="parameter 'x': expected a boolean, got 'maybe'"):
        model.bool_parameter("maybe", "x")
