"""The tracing switch (:mod:`actorserve.tracing`) without a server: off, it hands out
nothing; on without the ``otel`` extra, it says what to install. The spans themselves
are tested end to end in ``tests/e2e/test_tracing*.py``."""

from __future__ import annotations

import sys

import pytest

from actorserve.modelsettings import SettingsError
from actorserve.otel import sequence_hash
from actorserve.tracing import exporting, request_tracer


def test_off_is_nothing() -> None:
    assert request_tracer(False) is None
    with exporting(False):
        pass


def test_on_without_the_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "actorserve.otel", None)  # as if opentelemetry were missing
    with pytest.raises(SettingsError, match=r"pip install -e '\.\[otel\]'"):
        request_tracer(True)
    with pytest.raises(SettingsError, match="otel extra"), exporting(True):
        pass


def test_the_sequence_hash_is_stable_and_not_the_id() -> None:
    assert sequence_hash("s-1") == sequence_hash("s-1") != sequence_hash("s-2")
    assert len(sequence_hash("s-1")) == 16 and "s-1" not in sequence_hash("s-1")
