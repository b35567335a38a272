"""The ``vllm`` runtime: a :class:`BatchModel` whose steps are steps of vLLM's engine.

vLLM's ``LLMEngine`` runs in this process without its own process or busy loop (its
``InprocClient``), and only the replica's step-loop thread touches it: each step first
aborts the requests that left (cancelled, disconnected, ended by a stop string), adds the
requests that joined, then runs one ``engine.step()`` (vLLM schedules, batches, prefills in
chunks, decodes, and keeps the paged KV cache with its prefix cache) and maps the new token
ids of each request to our work. Detokenization, stop strings, ``usage`` and sequences are
actorserve's, exactly as in the ``transformers`` runtime (:mod:`actorserve.models.llm`):
a sequence keeps its text, each turn sends only the new text, and the whole history goes to
vLLM as tokens, so vLLM's prefix cache serves the history. See docs/llm.md.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import weakref
from pathlib import Path
from typing import Any, ClassVar

import attrs

from ...api import bool_parameter
from ...errors import BadInput
from ...model import BatchModel, StepOutput, float_parameter, int_parameter
from ...modelsettings import ModelSettings
from ...textgen import TextGeneration, longest_stop_prefix, merged_text
from ...types import InferenceRequest, InferenceResponse, Tensor
from ..llm.checkpoint import chat_template, source_of
from ..llm.prompt import NORMALIZED_SHRINK, longest_token
from ..llm.torchserve import TS_BODY, from_torchserve
from ..textlm.generation import (
    DEFAULT_MAX_TOKENS,
    GENERATION_PARAMETERS,
    TEXT_GENERATION,
    request_seed,
    stop_strings,
)
from .state import VLLMState, VLLMWork
from .threads import set_step_threads

EXTRA_HINT = (
    "the vllm runtime needs vLLM: pip install 'actorserve[vllm]' and then vLLM itself "
    "(on a CPU: .ci/install-vllm; see docs/llm.md)"
)
#: engine arguments actorserve sets itself (the checkpoint is ``parameters.uri``)
RESERVED_ENGINE_ARGS = frozenset({"model", "tokenizer", "disable_log_stats"})


def _bytes_tensor(text: str) -> Tensor:
    import numpy as np

    data = np.empty(1, dtype=object)
    data[0] = text.encode()
    return Tensor("text_output", (1,), "BYTES", data)


class VLLMModel(BatchModel[VLLMState, VLLMWork]):
    """A causal LM served by vLLM's engine; see the module docstring and docs/llm.md."""

    request_parameters: ClassVar[frozenset[str] | None] = GENERATION_PARAMETERS
    text_generation: ClassVar[TextGeneration | None] = TEXT_GENERATION
    default_max_batch_size: ClassVar[int] = 32
    #: a step cannot be re-run (vLLM's engine moved on): a raising step fails its batch
    isolate_failures: ClassVar[bool] = False
    #: ``engine`` (vLLM's engine arguments) is not here: a load's overrides may not change
    #: it unless the operator allows it (docs/configuration.md)
    overridable_parameters: ClassVar[frozenset[str]] = frozenset({"max_tokens_limit"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        params = self.parameters
        engine = params.get("engine", {})
        if not isinstance(engine, dict) or not all(isinstance(k, str) for k in engine):
            raise BadInput(
                f"model {self.name!r}: parameters.engine: expected an object of vLLM engine arguments"
            )
        self.engine_args: dict[str, Any] = dict(engine)
        self.max_tokens_limit = int(params.get("max_tokens_limit", 4096))
        self.kv_budget_mb = float(params.get("kv_cache_budget_mb", 512))
        threads = params.get("threads", 0)
        if self.max_tokens_limit < 0 or self.kv_budget_mb <= 0:
            raise BadInput(f"model {self.name!r}: max_tokens_limit must be >= 0 and kv_cache_budget_mb > 0")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
            raise BadInput(
                f"model {self.name!r}: parameters.threads: expected an integer >= 0, got {threads!r}"
            )
        #: torch's intra-op threads for the steps (0: vLLM's own rule, see :mod:`.threads`)
        self.threads = threads
        #: what the step thread runs with, once it stepped (torch's count, read there)
        self.running_threads = 0
        #: calls of vLLM's ``engine.step()`` so far (the step thread's)
        self.engine_steps = 0
        self.engine: Any = None
        self.tokenizer: Any = None
        self.max_context = 0
        #: the longest text (with a sequence's history) that may fit the context: a
        #: longer one is refused before a tokenizer sees it (issue 30's finding 2)
        self.max_chars = 0
        #: id(request) -> (a weak reference to it, the sequence's text it was read with, its
        #: ids): what :meth:`prepare` tokenized in a worker thread for :meth:`begin`
        self._prepared: dict[int, tuple[weakref.ref[InferenceRequest], str, list[int]]] = {}
        self._lock = threading.Lock()  # held while vLLM's engine is called
        self._aborts: collections.deque[str] = collections.deque()  # request ids to abort

    # -- loading -----------------------------------------------------------------------------

    @classmethod
    def declare_text_generation(cls, settings: ModelSettings) -> TextGeneration | None:
        declared = cls.text_generation
        template = chat_template(Path(source_of(settings)))
        if declared is None or not template:
            return declared
        return attrs.evolve(declared, chat_template=template)

    def source(self) -> str:
        return source_of(self.settings)

    async def load(self) -> None:
        import trio

        await trio.to_thread.run_sync(self._load)

    def engine_arguments(self) -> Any:
        """vLLM's ``EngineArgs`` from ``parameters.engine`` (unknown or reserved keys:
        :class:`BadInput`) and actorserve's defaults."""
        try:
            from vllm.engine.arg_utils import EngineArgs
        except ImportError:
            raise BadInput(f"model {self.name!r}: {EXTRA_HINT}") from None
        known = {f.name for f in dataclasses.fields(EngineArgs)} - RESERVED_ENGINE_ARGS
        unknown = sorted(set(self.engine_args) - known)
        if unknown:
            raise BadInput(
                f"model {self.name!r}: parameters.engine: unknown vLLM engine argument(s) "
                f"{', '.join(map(repr, unknown))} (vLLM's EngineArgs; {', '.join(map(repr, sorted(RESERVED_ENGINE_ARGS)))} "
                "are set by actorserve)"
            )
        args: dict[str, Any] = {
            "max_num_seqs": self.max_batch_size,
            # vLLM's CPU default takes most of the machine's memory for its KV cache
            "kv_cache_memory_bytes": int(self.kv_budget_mb * 2**20),
            **self.engine_args,
        }
        try:
            return EngineArgs(model=self.source(), tokenizer=self.source(), disable_log_stats=True, **args)
        except (TypeError, ValueError) as exc:
            raise BadInput(f"model {self.name!r}: parameters.engine: {exc}") from None

    def _load(self) -> None:
        engine_args = self.engine_arguments()
        # the engine core in this process, stepped by us (no engine process, no busy loop)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ["HF_HUB_OFFLINE"] = "1"  # a hub id is read from the local cache only: never download
        try:
            from transformers import AutoTokenizer
            from vllm.v1.engine.llm_engine import LLMEngine
        except ImportError:
            raise BadInput(f"model {self.name!r}: {EXTRA_HINT}") from None
        from .compat import guard_kernel_rebinding

        guard_kernel_rebinding()
        source = self.source()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise BadInput(f"model {self.name!r}: cannot load {source!r} (local files only): {exc}") from None
        try:
            self.engine = LLMEngine.from_engine_args(engine_args)
        except (TypeError, ValueError) as exc:  # vLLM's config validation
            raise BadInput(f"model {self.name!r}: vLLM refused the engine arguments: {exc}") from None
        self.max_context = int(self.engine.model_config.max_model_len)
        self.max_chars = self.max_context * longest_token(self.tokenizer) * NORMALIZED_SHRINK

    async def unload(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            with self._lock:
                shutdown = getattr(engine.engine_core, "shutdown", None)
                if shutdown is not None:
                    shutdown()

    # -- what vLLM holds -------------------------------------------------------------------

    def _scheduler(self) -> Any:
        return self.engine.engine_core.engine_core.scheduler

    def vllm_requests(self) -> int:
        """How many requests vLLM's scheduler holds (running or waiting)."""
        with self._lock:
            return int(self._scheduler().get_num_unfinished_requests())

    def kv_cache_usage(self) -> float | None:
        """vLLM's own KV usage (its scheduler's ``kv_cache_manager.usage``: the fraction of
        KV blocks in use, what ``vllm:kv_cache_usage_perc`` exports), read without the
        engine's lock (a step holds it; the value is a count a step updates, read whole);
        None before the engine is loaded or in a vLLM that does not say."""
        engine = self.engine
        if engine is None:
            return None
        try:
            usage = float(engine.engine_core.engine_core.scheduler.kv_cache_manager.usage)
        except (AttributeError, TypeError, ValueError):
            return None
        return min(1.0, max(0.0, usage))

    def _abort_pending(self) -> None:
        """Abort the requests that left (the lock is held)."""
        ids: list[str] = []
        while self._aborts:
            ids.append(self._aborts.popleft())
        if ids:
            self.engine.abort_request(ids)

    def _drain_aborts(self) -> None:
        """Abort what waits now if no step runs; a running step aborts it when it ends
        (whoever releases the lock looks again, so nothing waits for a next step)."""
        while self._aborts and self.engine is not None and self._lock.acquire(blocking=False):
            try:
                self._abort_pending()
            finally:
                self._lock.release()

    # -- sequences ----------------------------------------------------------------------------

    def new_state(self, sequence_id: str) -> VLLMState:
        return VLLMState(sequence_id)

    def on_sequence_end(self, state: VLLMState, reason: str) -> None:
        state.text = ""  # vLLM's prefix cache keeps or evicts its blocks by itself

    def on_request_cancelled(self, work: VLLMWork) -> None:
        work.settle()  # the sequence keeps what was read and said
        if work.added:
            self._aborts.append(work.rid)
            self._drain_aborts()

    # -- requests -----------------------------------------------------------------------------

    async def prepare(self, request: InferenceRequest, state: VLLMState | None) -> None:
        """Bound and tokenize the request's text (with its sequence's history) in a worker
        thread: a tokenizer's time grows with its text, and ``begin`` runs on the event
        loop. ``begin`` checks everything else, and tokenizes itself if nothing was
        prepared or the sequence's text changed in between."""
        import trio

        text = self._bounded((state.text if state is not None else "") + self._prompt(request)[1])
        ids = await trio.to_thread.run_sync(self._tokenize, text)
        key = id(request)
        forget = weakref.ref(request, lambda _: self._prepared.pop(key, None))
        self._prepared[key] = (forget, state.text if state is not None else "", ids)

    def _prompt(self, request: InferenceRequest) -> tuple[InferenceRequest, str]:
        """The request (a TorchServe body read as one) and its prompt text."""
        tensor = request.input("text_input", required=False)
        body = request.input(TS_BODY, required=False) if tensor is None else None
        if body is not None:
            request, tensor = from_torchserve(
                request, body, self.name, self.request_parameters or frozenset()
            )
        if tensor is None:
            return request, ""
        if tensor.datatype != "BYTES" or tensor.data.size != 1:
            raise BadInput(
                f"input 'text_input': expected BYTES with shape [1], got {tensor.datatype} "
                f"{list(tensor.shape)}"
            )
        value = tensor.data.reshape(-1)[0]
        return request, value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)

    def _bounded(self, text: str) -> str:
        """``text`` (a sequence's history and the prompt), refused past ``max_chars``
        before any tokenizer runs."""
        if len(text) > self.max_chars:
            raise BadInput(
                f"input 'text_input': {len(text)} characters (with the sequence's history), more "
                f"than {self.max_chars}: no longer text fits the model's context"
            )
        return text

    def _tokenize(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer(text)["input_ids"]]

    def begin(self, request: InferenceRequest, state: VLLMState | None) -> VLLMWork:
        prepared = self._prepared.pop(id(request), None)
        history = state.text if state is not None else ""
        ready = (
            prepared[2]
            if prepared is not None and prepared[0]() is request and prepared[1] == history
            else None
        )
        request, prompt = self._prompt(request)
        max_tokens = int_parameter(
            request, "max_tokens", DEFAULT_MAX_TOKENS, minimum=0, maximum=self.max_tokens_limit
        )
        temperature = float_parameter(request, "temperature", 1.0, minimum=0.0)
        top_k = int_parameter(request, "top_k", 0, minimum=0)
        top_p = float_parameter(request, "top_p", 1.0, minimum=0.0, maximum=1.0)
        stop = stop_strings(request)
        seed = request_seed(request)
        bool_parameter(request.parameters.get("usage", False), "usage")
        if state is None:
            state = VLLMState()
        text = state.text + prompt
        # not prepared (a model used without the engine): bounded all the same
        ids = ready if ready is not None else self._tokenize(self._bounded(text))
        if not ids:
            start = self.tokenizer.bos_token_id
            ids = [int(start if start is not None else self.tokenizer.eos_token_id or 0)]
        if len(ids) >= self.max_context:
            raise BadInput(
                f"input 'text_input': {len(ids)} tokens (with the sequence's history), the model's "
                f"context is {self.max_context} tokens (parameters.engine.max_model_len)"
            )
        state.busy = True
        return VLLMWork(
            request,
            state,
            text,
            ids,
            tokenizer=self.tokenizer,
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            stop=stop,
        )

    def merge(self, request: InferenceRequest, responses: list[InferenceResponse]) -> InferenceResponse:
        """The whole generated text as one ``text_output`` BYTES [1]."""
        output, parameters = merged_text(responses)
        return self.response(request, [output], parameters)

    # -- the step (the replica's step-loop thread) ----------------------------------------------

    def step(self, batch: list[VLLMWork]) -> list[StepOutput]:
        if not self.running_threads:
            self._set_threads()
        with self._lock:
            try:
                outputs = self._step(batch)
            except BaseException:
                for work in batch:
                    if work.added and not work.finished:
                        self._aborts.append(work.rid)
                    work.settle()
                self._abort_pending()
                raise
        self._drain_aborts()
        return outputs

    def _set_threads(self) -> None:
        self.running_threads = set_step_threads(self.threads)

    def _step(self, batch: list[VLLMWork]) -> list[StepOutput]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self._abort_pending()
        outputs: list[StepOutput | None] = [None] * len(batch)
        for i, work in enumerate(batch):
            if work.max_tokens == 0:
                outputs[i] = self._finish(work, "", "length")
            elif not work.added:
                params = SamplingParams(
                    max_tokens=min(work.max_tokens, self.max_context - len(work.ids)),
                    temperature=work.temperature,
                    top_k=work.top_k,
                    top_p=work.top_p,
                    seed=work.seed if work.temperature > 0.0 else None,
                    detokenize=False,  # ours: the same text as the transformers runtime
                    output_kind=RequestOutputKind.DELTA,
                )
                self.engine.add_request(work.rid, {"prompt_token_ids": work.ids}, params)
                work.added = True
        self.engine_steps += 1
        produced: dict[str, Any] = {out.request_id: out for out in self.engine.step()}
        for i, work in enumerate(batch):
            if outputs[i] is not None:
                continue
            out = produced.get(work.rid)
            outputs[i] = _NOTHING if out is None else self._generated(work, out)
        return outputs  # type: ignore[return-value]

    def _generated(self, work: VLLMWork, out: Any) -> StepOutput:
        """The new tokens of one request: stream their text (held back while it may begin
        a stop string); finish when vLLM finished it or a stop string appears."""
        completion = out.outputs[0]
        eos = False
        text = work.held
        for token in completion.token_ids:
            work.generated += 1
            if out.finished and completion.finish_reason == "stop" and token == completion.token_ids[-1]:
                eos = token in self._eos()
                if eos:
                    break
            text += work.detok.add(int(token))
        if out.finished:
            text += work.detok.flush()
        if work.stop:
            ats = [at for stop in work.stop if (at := text.find(stop)) >= 0]
            if ats:
                if not out.finished:
                    self._aborts.append(work.rid)  # aborted before the lock is let go
                return self._finish(work, text[: min(ats)], "stop")
        if out.finished:
            reason = "stop" if completion.finish_reason == "stop" else "length"
            return self._finish(work, text, reason)
        keep = longest_stop_prefix(text, work.stop) if work.stop else 0
        sent, work.held = text[: len(text) - keep], text[len(text) - keep :]
        if not sent:
            return _NOTHING
        work.sent += sent
        return StepOutput(self._text_response(work, sent))

    def _eos(self) -> frozenset[int]:
        eos = getattr(self.engine.model_config.hf_config, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return frozenset([eos] if isinstance(eos, int) else (eos or []))

    def _finish(self, work: VLLMWork, text: str, reason: str) -> StepOutput:
        work.held = ""
        work.sent += text
        work.settle()
        response = self._text_response(work, text)
        response.parameters["finish_reason"] = reason
        if work.request.parameters.get("usage") and bool_parameter(work.request.parameters["usage"], "usage"):
            response.parameters["prompt_tokens"] = work.prompt_tokens
            response.parameters["completion_tokens"] = work.generated
        return StepOutput(response, done=True)

    def _text_response(self, work: VLLMWork, text: str) -> InferenceResponse:
        return InferenceResponse(self.name, [_bytes_tensor(text)], self.version, work.request.id)


_NOTHING = StepOutput()
