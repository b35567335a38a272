"""Which REST headers carry a sequence's id (``--sequence-headers``): ours
(``sequence-id``), TorchServe's (``ts_request_sequence_id``) or SageMaker's stateful
session headers, so a platform's own router or client works unchanged. See
docs/deploy.md#header-presets.

SageMaker: a request's ``X-Amzn-SageMaker-Session-Id`` is ``NEW_SESSION`` (a start; the
server makes the id) or an open session's id; the start's answer names the new session
in ``X-Amzn-SageMaker-New-Session-Id`` as ``<id>; Expires=<UTC time>``, the answer of the
request that ends it in ``X-Amzn-SageMaker-Closed-Session-Id``. A SageMaker session id
is letters and digits joined by ``-`` (at most 256), so the server-made id of this
preset is ``<replica>--<32 hex digits>`` (:func:`~actorserve.replica.new_sequence_id`
with ``sagemaker=True``). A client's id goes back into a response header, where ``;``,
``=``, ``,`` or a space would forge attributes (``; Expires=...``): with this preset an id
outside :data:`SAGEMAKER_ID` (letters, digits, ``.``, ``_``, ``-``: SageMaker's own
alphabet and the two characters of this server's ids under the other presets) or longer than :data:`SAGEMAKER_MAX_ID` is refused 400 before it is used,
and :meth:`SequenceNaming.answer` never writes one."""

from __future__ import annotations

import logging
import re
import time
from typing import Final

import attrs

from ...api import EngineAPI, control_of, no_sequence_id
from ...errors import BadInput
from ...replica import new_sequence_id
from ...types import InferenceRequest, InferenceResponse

log = logging.getLogger(__name__)

Headers = list[tuple[str, str]]

#: SageMaker's value of the session header that opens a new session
NEW_SESSION: Final = "NEW_SESSION"
#: what ``Expires=`` says of a sequence that never expires by idling
NEVER: Final = "9999-12-31T23:59:59Z"
#: the characters of a session id the SageMaker preset takes (SageMaker's own are
#: letters and digits joined by ``-``; ``.`` and ``_`` are in this server's other ids)
SAGEMAKER_ID: Final = re.compile(r"[A-Za-z0-9._-]+")
#: the longest session id SageMaker takes
SAGEMAKER_MAX_ID: Final = 256


@attrs.frozen(slots=True)
class SequenceNaming:
    """The header names of one preset (lower-case where they are read)."""

    #: the request header read as ``sequence_id``
    request: str
    #: the response header echoing the id of a sequence's answer
    echo: str
    #: a value of ``request`` meaning "start a new sequence, make its id" (None: none)
    new_value: str | None = None
    #: the header answering a start with ``<id>; Expires=...`` (None: ``echo``)
    new: str | None = None
    #: the header answering the request that ended the sequence (None: ``echo``)
    closed: str | None = None
    #: the replica id, for the ids a ``new_value`` start is given here
    replica: str = ""
    #: what an id must be to be read and echoed (None: any; the engine's own checks apply)
    id_pattern: re.Pattern[str] | None = None
    #: the longest id read and echoed (with ``id_pattern``)
    max_id_length: int = 0

    def allows(self, sequence_id: object) -> bool:
        """``sequence_id`` may be read and echoed in this preset's headers."""
        if self.id_pattern is None or sequence_id is None:
            return True
        value = str(sequence_id)
        return len(value) <= self.max_id_length and self.id_pattern.fullmatch(value) is not None

    def answer(self, sequence_id: object, *, start: bool, end: bool, idle_timeout_ms: int = 0) -> Headers:
        """The headers naming ``sequence_id`` (None: none) on an answer of a sequence;
        ``start``/``end``: the request opened/ended it."""
        if sequence_id is None or not self.allows(sequence_id):
            return []  # never a value that could forge a header attribute (refused on input)
        value = str(sequence_id)
        if start and self.new is not None:
            return [(self.new, f"{value}; Expires={expires(idle_timeout_ms)}")]
        if end and self.closed is not None:
            return [(self.closed, value)]
        return [(self.echo, value)]

    def give_id(self, request: InferenceRequest) -> None:
        """With a preset that has ``new_value`` (SageMaker's), a start without an id
        (``NEW_SESSION``, or ``sequence_start`` alone) gets its id here, in the preset's
        format: the engine would make one SageMaker refuses."""
        parameters = request.parameters
        value = parameters.get("sequence_id")
        if not no_sequence_id(value) and not self.allows(value):
            shown = repr(value) if len(str(value)) <= 80 else repr(str(value)[:80]) + "..."
            raise BadInput(
                f"sequence id {shown} is not a session id: use letters, digits, '.', '_' and '-', "
                f"at most {self.max_id_length} characters"
            )
        if self.new_value is None or not (no_sequence_id(value) or value == "0"):
            return
        if _true(parameters.get("sequence_start")):
            parameters["sequence_id"] = new_sequence_id(self.replica, sagemaker=True)


def expires(idle_timeout_ms: int, now: float | None = None) -> str:
    """SageMaker's ``Expires=`` time (UTC, to the second): when the sequence expires if
    no request comes (``idle_timeout_ms``; 0: never)."""
    if idle_timeout_ms <= 0:
        return NEVER
    at = (time.time() if now is None else now) + idle_timeout_ms / 1000
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


OIP: Final = SequenceNaming(request="sequence-id", echo="sequence-id")
PRESETS: Final = {
    "oip": OIP,
    "torchserve": SequenceNaming(request="ts_request_sequence_id", echo="ts_request_sequence_id"),
    "sagemaker": SequenceNaming(
        request="x-amzn-sagemaker-session-id",
        echo="X-Amzn-SageMaker-Session-Id",
        new_value=NEW_SESSION,
        new="X-Amzn-SageMaker-New-Session-Id",
        closed="X-Amzn-SageMaker-Closed-Session-Id",
        id_pattern=SAGEMAKER_ID,
        max_id_length=SAGEMAKER_MAX_ID,
    ),
}


def naming_for(preset: str, replica: str) -> SequenceNaming:
    """The naming of ``--sequence-headers`` ``preset`` on replica ``replica``; a value
    that is not a preset is a header name of the operator's own, read and echoed."""
    naming = PRESETS.get(preset) or SequenceNaming(request=preset.lower(), echo=preset)
    return attrs.evolve(naming, replica=replica)


def sequence_flags(request: InferenceRequest) -> tuple[bool, bool]:
    """(starts, ends) of a request, from its control record (a ``sequence_cancel`` ends
    its sequence too)."""
    control = control_of(request)
    return control.start, control.end or control.cancel


def _true(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1")
    return value is True or (isinstance(value, int) and value == 1)


async def answer_headers(
    engine: EngineAPI, response: InferenceResponse, headers: SequenceNaming, flags: tuple[bool, bool]
) -> Headers:
    """The headers naming ``response``'s sequence, as ``headers`` (the preset) says;
    ``flags``: :func:`sequence_flags` of its request. A start's ``Expires=`` comes from
    the model's ``sequence.idle_timeout_ms``."""
    sequence_id = response.parameters.get("sequence_id")
    start, end = flags
    idle = 0
    if start and headers.new is not None and sequence_id is not None:
        try:
            idle = (await engine.describe(response.model_name, response.model_version)).idle_timeout_ms
        except Exception:  # the answer stands: only its Expires= is unknown
            log.warning("no idle timeout for %r: Expires= says never", response.model_name, exc_info=True)
    return headers.answer(sequence_id, start=start, end=end, idle_timeout_ms=idle)


__all__ = [
    "NEW_SESSION",
    "OIP",
    "PRESETS",
    "SequenceNaming",
    "answer_headers",
    "expires",
    "naming_for",
    "sequence_flags",
]
