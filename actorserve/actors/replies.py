"""What both runners do with one request: its :class:`WorkItem`, the stamp on each of
its responses, and the answer to a ``sequence_cancel``."""

from __future__ import annotations

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
    response: InferenceResponse, request_id: str | None, sequence_id: str | None = None
) -> InferenceResponse:
    """Give ``response`` the request's id and its sequence's id, unless the model set
    them itself. Every response of a runner passes through here (in place)."""
    if response.id is None:
        response.id = request_id
    if sequence_id is not None and "sequence_id" not in response.parameters:
        response.parameters["sequence_id"] = sequence_id
    return response


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
