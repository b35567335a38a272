"""Warm-up requests: what a model version answers at load, before it reports ready.

A model's ``model-settings.json`` may list up to :data:`MAX_WARMUP` requests under
``"warmup"``: each an OIP request body (``{"inputs": [...], "parameters": {...}}``, as
``POST /v2/models/{name}/infer`` takes it) or, for a text model, a string (the prompt:
one BYTES input named by the model's ``text_generation.input``). They are checked when
the settings are read (:func:`warmup_from_json`: a bad one fails the settings, 400 to a
load request) and built again at each load (:func:`warmup_requests`), then served by
the host before it turns READY (:meth:`~actorserve.actors.host.ModelHost.run`), so the
health routes answer ready only once compiled forwards and first-request costs are
paid. A warm-up request that fails fails the load, naming the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .codecs import request_from_json
from .errors import BadInput
from .textgen import text_tensor
from .types import InferenceRequest

#: the most warm-up requests one model version may declare (each runs once per replica
#: at every load, so the count bounds what a settings file can make a load cost)
MAX_WARMUP: Final = 16
#: the longest text warm-up (characters)
MAX_WARMUP_TEXT: Final = 16_384

Warmup = str | Mapping[str, Any]


class WarmupFailed(Exception):
    """A warm-up request failed: the load fails with this message (the model's own
    error, as its request would have answered, was logged with its traceback)."""


def failed_warmup(index: int, error: BaseException) -> WarmupFailed:
    """``warmup[i] failed: <the error its request would have answered>``."""
    message = getattr(error, "message", None) or f"{type(error).__name__}: {error}"
    return WarmupFailed(f"'warmup[{index}]' failed: {message}")


def warmup_from_json(value: object, where: str, error: type[BadInput]) -> tuple[Warmup, ...]:
    """The ``warmup`` list of a settings file, each entry checked (decoded once as a
    request); ``error`` (the settings' :class:`SettingsError`) naming the entry otherwise."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise error(f"{where}: 'warmup' must be a list of requests (objects) or texts (strings)")
    if len(value) > MAX_WARMUP:
        raise error(f"{where}: 'warmup' lists {len(value)} requests; at most {MAX_WARMUP}")
    entries: list[Warmup] = []
    for i, entry in enumerate(value):
        if isinstance(entry, str):
            if not entry or len(entry) > MAX_WARMUP_TEXT:
                raise error(f"{where}: 'warmup[{i}]': a text of 1 to {MAX_WARMUP_TEXT} characters")
            entries.append(entry)
            continue
        if not isinstance(entry, dict):
            raise error(f"{where}: 'warmup[{i}]' must be a request object or a text")
        try:
            request_from_json(entry)
        except BadInput as exc:
            raise error(f"{where}: 'warmup[{i}]': {exc.message}") from None
        entries.append(entry)
    return tuple(entries)


def warmup_requests(
    entries: tuple[Warmup, ...], name: str, version: str, text_input: str | None
) -> list[InferenceRequest]:
    """Fresh requests for a model version's ``warmup`` entries; ``text_input``: the
    model's text input (``text_generation.input``), None for a model that generates no
    text (a text entry is then :class:`BadInput`)."""
    requests = []
    for i, entry in enumerate(entries):
        request_id = f"warmup-{i}"
        if isinstance(entry, str):
            if text_input is None:
                raise BadInput(f"'warmup[{i}]' is a text, but the model declares no text_generation")
            request = InferenceRequest(inputs=[text_tensor(text_input, entry)], id=request_id)
        else:
            request = request_from_json(dict(entry))
            request.id = request.id or request_id
        request.model_name, request.model_version = name, version
        requests.append(request)
    return requests


__all__ = [
    "MAX_WARMUP",
    "MAX_WARMUP_TEXT",
    "Warmup",
    "WarmupFailed",
    "failed_warmup",
    "warmup_from_json",
    "warmup_requests",
]
