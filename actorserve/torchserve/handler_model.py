"""``TorchServeModel``: a TorchServe handler (``.mar`` or model folder) as a BatchModel.

Each step hands the batch to the handler the way TorchServe's backend does: ``data`` is
a list with one dict of named inputs per request, ``context`` carries their request ids
and headers. The handler runs on a thread of its own (one per replica, for its whole
life, so thread-local torch state holds), and a step returns at the handler's next
event: an intermediate response (``send_intermediate_predict_response``: streamed to
those requests, which stay in the batch) or its return value (the last response of each
request, unless ``context.stopping_criteria`` / ``ts_stream_next`` says a request is not
done: then it stays in the batch and the handler sees it again, with the same request
id, in the next step, beside any request that joined meanwhile). Requests that join
while the handler runs wait for its next call.

Errors are answered as TorchServe does: a ``PredictionException`` with its code, an out
of memory 507, any other exception or a wrong return 503 ("Prediction failed"); the
response carries the status (see :mod:`actorserve.torchserve_envelope`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import logging
import queue
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import attrs
import trio

from ..controls import control_of
from ..errors import ActorServeError, BadInput, ModelFailed
from ..model import BatchModel, StepOutput
from ..torchserve_envelope import (
    BODY,
    HEADERS,
    MESSAGE,
    PLATFORM,
    STATUS,
    STREAM_NEXT,
    HeaderNames,
    make_response,
    ok_status,
    request_headers,
    request_inputs,
)
from ..types import InferenceRequest, InferenceResponse
from .context import Context, Intermediate, IntermediateSink, RequestProcessor, encode_body
from .loader import EntryPoint, load_entry_point, model_folder_importable

log = logging.getLogger(__name__)

#: intermediate responses the handler may send ahead of the steps that hand them out
EVENTS_AHEAD = 8


@attrs.define(slots=True)
class SequenceState:
    sequence_id: str


@attrs.define(eq=False, slots=True)
class TsWork:
    """One request: its inputs as the handler reads them, its headers, its id, and the
    outputs the handler made for it that no step has handed out yet (while it sat out
    steps, its reader being slow, or while the handler made several at once)."""

    request: InferenceRequest
    request_id: str
    data: dict[str, Any]
    headers: dict[str, Any]
    backlog: collections.deque[StepOutput] = attrs.field(factory=collections.deque)
    #: its last output is made (in the backlog or handed out): the handler is done with it
    completed: bool = False


@attrs.frozen
class _Final:
    """The handler returned (or failed): per request id, its last response."""

    responses: dict[str, tuple[InferenceResponse, bool, bool]]  # (response, streams on, ends sequence)


class _Invocation:
    """One call of the handler on a batch; its events reach the step through a bounded
    queue (the handler waits when the steps are behind)."""

    def __init__(self, works: list[TsWork]) -> None:
        self.works = works
        self.events: queue.Queue[Intermediate | _Final] = queue.Queue(EVENTS_AHEAD)
        #: the model was unloaded mid-call: nobody takes its events any more
        self.abandoned = False
        #: the thread the handler runs this call on
        self.thread: int | None = None


class _HandlerThread:
    """The thread every call into the handler runs on (a daemon: it waits for work)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue(2)
        self._thread = threading.Thread(target=self._main, name=f"torchserve-{name}", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def call(self, fn: Callable[[], Any]) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

        self.submit(run)
        return future.result()

    def stop(self) -> None:
        # never blocks: at most one handler call is queued at a time (a step waits for
        # the last one's end before it submits the next), so the queue has room
        self._jobs.put_nowait(None)


def decode_input(value: Any, content_type: str) -> Any:
    """An input as TorchServe's backend passes it: JSON parsed, text decoded, else bytes."""
    if not isinstance(value, bytes):
        return value
    try:
        if content_type == "application/json":
            return json.loads(value)
        if content_type.startswith("text"):
            return value.decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        log.warning("could not decode a %s input; passing the raw bytes", content_type)
    return value


class TorchServeModel(BatchModel[SequenceState, TsWork]):
    """Serves a TorchServe handler unchanged. Parameters (set by
    :func:`~actorserve.torchserve.archive.archive_settings`): ``model_dir``,
    ``handler``, ``manifest``, ``model_yaml_config``."""

    default_max_batch_size = 1
    sequence_overlap = True
    request_parameters: ClassVar[frozenset[str] | None] = None
    #: ``model_dir``, ``handler``, ``manifest`` and ``model_yaml_config`` choose the code
    #: that runs (and what it reads), so a load request may set only the response timeout
    overridable_parameters: ClassVar[frozenset[str]] = frozenset({"response_timeout_s"})

    _thread: _HandlerThread | None = None

    @property
    def step_timeout(self) -> float | None:
        """None: a step returns by itself once the handler passes ``response_timeout``
        (TorchServe's responseTimeout), failing its requests and restarting the handler,
        so the engine's step deadline is not needed on top."""
        return None

    async def load(self) -> None:
        self.header_names = HeaderNames.from_environ()
        #: seconds the handler may take for its next response (responseTimeout)
        self.response_timeout = float(self.settings.parameters.get("response_timeout_s") or 120)
        self._running: _Invocation | None = None
        self._thread = _HandlerThread(self.name)
        try:
            await trio.to_thread.run_sync(self._thread.call, self._initialize)
        except BaseException:
            self._thread.stop()
            raise

    def _initialize(self) -> None:
        """A fresh context and handler (on the handler thread)."""
        params = self.settings.parameters
        model_dir = Path(str(params.get("model_dir") or self.settings.folder or "."))
        self.context = Context(
            self.name,
            str(model_dir),
            dict(params.get("manifest") or {}),
            self.max_batch_size,
            dict(params.get("model_yaml_config") or {}),
            self.header_names,
            IntermediateSink(self._intermediate),
        )
        with model_folder_importable(model_dir):
            self._entry, self.handler = load_entry_point(str(params["handler"]), self.name, self.context)

    def _next_event(self, running: _Invocation) -> Intermediate | _Final:
        """The handler's next event; past ``response_timeout`` its requests fail as
        TorchServe's do ("Worker died.") and the handler restarts on a new thread (the
        stuck one is left to finish, its events dropped), as TorchServe restarts a worker."""
        try:
            return running.events.get(timeout=self.response_timeout)
        except queue.Empty:
            pass
        log.error(
            "model %r: the handler did not respond within %g s (responseTimeout): restarting it",
            self.name,
            self.response_timeout,
        )
        running.abandoned = True
        while not running.events.empty():
            running.events.get_nowait()
        assert self._thread is not None
        self._thread.stop()
        self._thread = _HandlerThread(self.name)
        try:
            self._thread.call(self._initialize)
        except Exception as exc:
            log.exception("model %r: restarting the handler failed", self.name)
            self._entry = _failing(exc)
        message = f"Worker died. (no response within responseTimeout {self.response_timeout:g} s; the handler restarted)"
        return self._failed(running.works, 500, message)

    async def unload(self) -> None:
        running = self._running
        if running is not None:  # a handler call still runs: unblock it and let it end
            running.abandoned = True
            while not running.events.empty():
                running.events.get_nowait()
        if self._thread is not None:
            self._thread.stop()  # it ends once the handler call it may be in returns
            self._thread = None

    def metadata(self) -> dict[str, Any]:
        meta = super().metadata()
        meta["platform"] = self.settings.platform or PLATFORM
        # what TorchServe clients send and get (not enforced: any named inputs pass)
        meta["inputs"] = meta["inputs"] or [{"name": BODY, "datatype": "BYTES", "shape": [-1]}]
        meta["outputs"] = meta["outputs"] or [{"name": BODY, "datatype": "BYTES", "shape": [1]}]
        return meta

    # -- the engine's calls ------------------------------------------------------------

    def new_state(self, sequence_id: str) -> SequenceState:
        return SequenceState(sequence_id)

    def begin(self, request: InferenceRequest, state: SequenceState | None) -> TsWork:
        headers: dict[str, Any] = dict(request_headers(request))
        data: dict[str, Any] = {}
        for name, value, content_type in request_inputs(request):
            data[name] = decode_input(value, content_type)
            headers[name] = {"content-type": content_type}
        if state is not None:
            # the id the engine gave the sequence, over the door's: when bound to a
            # token it is unique per (token, id), so a handler's cache keyed by it never
            # mixes two clients' sequences of one name (answers name the client's id)
            headers[self.header_names.sequence_id] = state.sequence_id
            if HEADERS not in request.parameters:  # from an OIP client: its controls
                control = control_of(request)
                for flag, name in (
                    (control.start, self.header_names.sequence_start),
                    (control.end, self.header_names.sequence_end),
                ):
                    if flag:
                        headers[name] = "true"
        return TsWork(request, str(uuid.uuid4()), data, headers)

    def step(self, batch: list[TsWork]) -> list[StepOutput]:
        """Hand each request of ``batch`` its next output: from its backlog, or from the
        handler's next event (waited for only when no request of the batch has one)."""
        running = self._running
        if running is None:
            eligible = [w for w in batch if not w.completed]  # new, or streaming on
            if eligible:
                running = self._running = _Invocation(eligible)
                assert self._thread is not None
                self._thread.submit(lambda: self._invoke(running))
        if running is not None:
            if not any(w.backlog for w in batch):
                self._take(running, self._next_event(running))
            while self._running is running:  # and whatever else is ready
                try:
                    self._take(running, running.events.get_nowait())
                except queue.Empty:
                    break
        return [w.backlog.popleft() if w.backlog else StepOutput() for w in batch]

    def _take(self, running: _Invocation, event: Intermediate | _Final) -> None:
        """Put an event of the handler in the backlogs of its requests."""
        if isinstance(event, _Final):
            self._running = None
            for work in running.works:
                response, streams_on, ends = event.responses[work.request_id]
                error = self._error_of(work, response)
                if error is not None:
                    streams_on = False
                work.backlog.append(StepOutput(response, done=not streams_on, end_sequence=ends, error=error))
                work.completed = not streams_on
            return
        for work in running.works:
            part = event.responses.get(work.request_id)
            if part is not None and not work.completed:
                body, content_type, status, phrase, headers = part
                headers.pop(STREAM_NEXT, None)
                response = self._response(work, body, content_type, headers, status, phrase)
                error = self._error_of(work, response)
                work.completed = error is not None  # a failed request takes no more output
                work.backlog.append(StepOutput(response, done=error is not None, error=error))

    def _error_of(self, work: TsWork, response: InferenceResponse) -> ActorServeError | None:
        """The domain error of a response whose status is not 2xx, for a request of
        another door than TorchServe's (which answers the status as the handler set it):
        an OIP or OpenAI client reads the failure in its own status, never a 200 with
        ``ts_status`` in the parameters. A 4xx is the client's (400), the rest the model's
        (500)."""
        if HEADERS in work.request.parameters:  # TorchServe's door: its envelope says it all
            return None
        status = response.parameters.get(STATUS, 200)
        if not isinstance(status, int) or ok_status(status):
            return None
        message = str(response.parameters.get(MESSAGE) or "") or f"status {status}"
        what = f"model {self.name!r}: the handler answered {status}: {message}"
        return BadInput(what) if 400 <= status < 500 else ModelFailed(what)

    def _response(
        self, work: TsWork, body: bytes, content_type: str, headers: dict[str, str], status: int, phrase: str
    ) -> InferenceResponse:
        content_type = headers.pop("content-type", content_type) or content_type
        response = make_response(
            work.request,
            self.name,
            self.version,
            body,
            content_type=content_type,
            headers=headers,
            status=status,
            message=phrase,
        )
        if HEADERS not in work.request.parameters:
            # another door than TorchServe's: a parameter every door can carry (gRPC's
            # InferParameter has no map, and a dict there failed every OIP gRPC infer)
            response.parameters[HEADERS] = json.dumps(headers)
        return response

    # -- the handler's thread ----------------------------------------------------------

    def _intermediate(self, event: Intermediate) -> None:
        running = self._running
        if running is None:
            raise RuntimeError("send_intermediate_predict_response called outside of a request")
        if running.abandoned or running.thread != threading.get_ident():
            # a call that was given up (unloaded, or past responseTimeout): drop its events
            raise RuntimeError(f"model {self.name!r}: this handler call was abandoned")
        running.events.put(event)

    def _invoke(self, running: _Invocation) -> None:
        running.thread = threading.get_ident()
        try:
            final = self._call_handler(running.works)
        except BaseException as exc:  # never leave the step waiting
            log.exception("model %r: the handler thread failed", self.name)
            final = self._failed(running.works, 503, f"Prediction failed: {exc}")
        if not running.abandoned:
            running.events.put(final)

    def _call_handler(self, works: list[TsWork]) -> _Final:
        context = self.context
        context.request_ids = {idx: w.request_id for idx, w in enumerate(works)}
        context.request_processor = [RequestProcessor(dict(w.headers)) for w in works]
        context.stopping_criteria = None
        try:
            ret = self._entry([w.data for w in works], context)
        except MemoryError:
            log.error("model %r: out of memory", self.name, exc_info=True)
            return self._failed(works, 507, "Out of resources")
        except Exception as exc:
            code = getattr(exc, "error_code", None)
            if type(exc).__name__ == "PredictionException" and isinstance(code, int):
                log.error("model %r: prediction error", self.name, exc_info=True)
                return self._failed(works, code, str(getattr(exc, "message", exc)))
            ModelFailed.wrap(self.name, exc, "in its handler")  # logs the traceback
            return self._failed(works, 503, "Prediction failed")
        if not isinstance(ret, list):
            log.warning("model %r: invalid return type %s", self.name, type(ret).__name__)
            return self._failed(works, 503, "Invalid model predict output")
        if len(ret) != len(works):
            log.warning("model %r: %d responses for a batch of %d", self.name, len(ret), len(works))
            return self._failed(works, 503, "number of batch response mismatched")
        responses = {}
        for idx, work in enumerate(works):
            streams_on = self._streams_on(idx, ret[idx])
            try:
                body = encode_body(ret[idx])
            except TypeError:
                log.warning("model %r: unable to serialize model output", self.name, exc_info=True)
                return self._failed(works, 503, "Unsupported model output data type.")
            status, phrase = context.get_response_status(idx)
            headers = dict(context.get_response_headers(idx))
            headers.pop(STREAM_NEXT, None)
            ends = self.header_names.sequence_end in headers and not streams_on
            response = self._response(work, body, "", headers, status, phrase or "")
            responses[work.request_id] = (response, streams_on, ends)
        return _Final(responses)

    def _streams_on(self, idx: int, value: Any) -> bool:
        """TorchServe's ``create_predict_response``: the stopping criterion decides, else
        a stream of intermediate responses ends here."""
        context = self.context
        if context.stopping_criteria:
            is_stop = context.stopping_criteria[idx](value)
            if is_stop is not None:
                context.set_response_header(idx, STREAM_NEXT, "false" if is_stop else "true")
        elif context.get_response_headers(idx).get(STREAM_NEXT) == "true":
            context.set_response_header(idx, STREAM_NEXT, "false")
        return context.get_response_headers(idx).get(STREAM_NEXT) == "true"

    def _failed(self, works: list[TsWork], status: int, message: str) -> _Final:
        body = json.dumps(
            {"code": status, "type": _error_type(status), "message": message}, indent=2
        ).encode()
        responses = {}
        for work in works:
            response = make_response(
                work.request,
                self.name,
                self.version,
                body,
                content_type="application/json",
                status=status,
                message=message,
            )
            responses[work.request_id] = (response, False, False)
        return _Final(responses)


def _failing(error: Exception) -> EntryPoint:
    def entry(data: Any, context: Any) -> Any:
        raise RuntimeError(f"the handler could not be restarted: {error}")

    return entry


def _error_type(status: int) -> str:
    return {
        400: "BadRequestException",
        404: "ModelNotFoundException",
        503: "ServiceUnavailableException",
        507: "InsufficientStorageException",
    }.get(status, "InternalServerException")
