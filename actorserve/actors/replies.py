"""What both runners do with one request: its :class:`WorkItem`, the stamp on each of
its responses, and the answer to a ``sequence_cancel``."""

from __future__ import annotations

import json
from typing import Any

from ..torchserve_envelope import HEADERS
from ..tracing import item_trace
from ..types import InferenceRequest, InferenceResponse
from .batcher import WorkItem
from .mailbox import Mailbox


def new_item(request: InferenceRequest, reply_buffer: int, sequence_id: str | None = None) -> WorkItem:
    """A :class:`WorkItem` for ``request`` whose reply mailbox holds ``reply_buffer``
    responses. The caller owns it and must :meth:`~WorkItem.cancel` it when it leaves."""
    item = WorkItem(
        request, Mailbox(reply_buffer, name=f"replies of {request.id or 'a request'}"), sequence_id
    )
    control = request.control
    if control is not None and control.trace is not None:
        item.trace = item_trace(control.trace)
    return item


def stamp(
    response: InferenceResponse,
    request_id: str | None,
    sequence_id: str | None = None,
    model_id: str | None = None,
) -> InferenceResponse:
    """Give ``response`` the request's id and its sequence's id, unless the model set
    them itself. Every response of a runner passes through here (in place).

    ``model_id``: the id the model knows the sequence by, when it is not the client's
    ``sequence_id`` (bound to a token): where the model echoed it (its ``sequence_id``
    parameter, any other parameter, a TorchServe handler's response header) the client
    reads its own id instead, never the owner part."""
    if response.id is None:
        response.id = request_id
    if sequence_id is not None:
        params = response.parameters
        if model_id is not None and model_id != sequence_id:
            _as_client(params, model_id, sequence_id)
        if "sequence_id" not in params:
            params["sequence_id"] = sequence_id
    return response


def _as_client(params: dict[str, Any], model_id: str, sequence_id: str) -> None:
    """``model_id`` made ``sequence_id`` in ``params``' values and in TorchServe's
    response headers (a dict on TorchServe's door, its JSON text on the others)."""
    for key, value in params.items():
        if value == model_id:
            params[key] = sequence_id
    headers = params.get(HEADERS)
    if isinstance(headers, dict):
        for name, value in headers.items():
            if value == model_id:
                headers[name] = sequence_id
    elif isinstance(headers, str) and model_id in headers:
        try:
            parsed = json.loads(headers)
        except ValueError:
            return
        if isinstance(parsed, dict):
            params[HEADERS] = json.dumps({k: sequence_id if v == model_id else v for k, v in parsed.items()})


def cancelled_response(
    model: str, version: str, request: InferenceRequest, sequence_id: str
) -> InferenceResponse:
    """The answer to a request carrying ``sequence_cancel`` for an open sequence."""
    return InferenceResponse(
        model_name=model,
        model_version=version,
        id=request.id,
        outputs=[],
        parameters={"sequence_id": sequence_id, "sequence_cancelled": True},
    )
