"""The ``transformers`` runtime: a :class:`BatchModel` for any causal LM that
``transformers`` loads from a local folder, stepped by our batcher.

Each step: a chunk of the prompt of every request still reading one (chunked prefill,
one forward per request), then one batched forward decoding a token for every request
that is generating (see :mod:`.forward`). Requests join at the next step and leave at
once; their caches go with them. Request parameters and the streaming contract are
those of the built-in ``text`` model (:mod:`actorserve.models.text`) plus vLLM's
(:mod:`.requests`); tokens are the model's own. See docs/llm.md for the settings.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any, ClassVar

import attrs
import torch

from ...api import bool_parameter
from ...declarations import text_generation_of
from ...errors import BadInput
from ...model import BatchModel, StepOutput
from ...modelsettings import ModelSettings
from ...textgen import TextGeneration, longest_stop_prefix, merged_text
from ...texttokens import LOGPROBS_PARAMETER, TOKEN_IDS, logprobs_to_parameter
from ...types import InferenceRequest, InferenceResponse, Tensor
from ..textlm.generation import sample_rows
from .budget import CacheStatistics, KVBudget
from .checkpoint import chat_template, source_of
from .compiled import Decoder, choose_compile, choose_dtype, decoder_for, dtype_name
from .echo import prompt_logprobs
from .forward import Batch, crop, kv_bytes, new_batch, owned, prefill
from .prefix import BLOCK, joined
from .prompt import Prompts
from .requests import (
    LLM_TEXT_GENERATION,
    NO_SAMPLING,
    PARAMETERS,
    echo_of,
    read_sampling,
    text_bytes,
    tokenizer_outputs,
)
from .state import LLMState, LLMWork, raw_logprobs, token_logprobs, without_eos

EXTRA_HINT = "the transformers runtime needs the extra: pip install 'actorserve[llm]'"


class TransformersModel(BatchModel[LLMState, LLMWork]):
    """A causal LM of ``transformers``; see the module docstring and docs/llm.md."""

    request_parameters: ClassVar[frozenset[str] | None] = PARAMETERS
    text_generation: ClassVar[TextGeneration | None] = LLM_TEXT_GENERATION
    default_max_batch_size: ClassVar[int] = 32
    overridable_parameters: ClassVar[frozenset[str]] = frozenset(
        {
            "prefill_chunk",
            "max_tokens_limit",
            "max_context",
            "max_prompt_chars",
            "kv_cache_budget_mb",
            "threads",
            "compile",
            "compile_after",
            "prefix_cache",
        }
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        params = self.parameters
        self.prefill_chunk = int(params.get("prefill_chunk", 256))
        self.max_tokens_limit = int(params.get("max_tokens_limit", 4096))
        self.max_context: int = int(params.get("max_context", 0))  # 0: the model's own
        self.kv_budget = int(float(params.get("kv_cache_budget_mb", 1024)) * 2**20)
        self.threads = int(params.get("threads", 0))
        self.max_prompt_chars = int(params.get("max_prompt_chars", 0))  # 0: from max_context
        self.prompts = Prompts(self.name, self.request_parameters or frozenset())
        reuse = bool_parameter(params.get("prefix_cache", True), "prefix_cache")
        self.device_name: str | None = params.get("device")
        self.dtype_name: str | None = params.get("dtype")
        self.compile_name = str(params.get("compile", "auto"))
        self.compile_after = int(params.get("compile_after", 256))
        self.compile_mode = "eager"  # what ``compile`` means on the device (at load)
        self.decoder: Decoder | None = None
        if (
            self.prefill_chunk < 1
            or min(self.max_tokens_limit, self.max_context, self.max_prompt_chars, self.kv_budget) < 0
            or self.compile_after < 0
        ):
            raise ValueError(
                f"model {self.name!r}: prefill_chunk must be >= 1; max_tokens_limit, max_context, "
                "max_prompt_chars, kv_cache_budget_mb and compile_after >= 0"
            )
        #: open sequences, least recently used first (changed by the budget, under its lock)
        self.sequences: OrderedDict[str, LLMState] = OrderedDict()
        self.budget = KVBudget(self.name, self.kv_budget, self.sequences, reuse)
        self.model: Any = None
        self.tokenizer: Any = None
        self.eos: frozenset[int] = frozenset()
        self.start_token = 0
        self._batch: Batch[LLMWork] | None = None  # the cache of the last step's batched decode
        self.chat_template = ""  # as the chat route renders (settings' text_generation over the tokenizer's)

    # -- loading -----------------------------------------------------------------------------

    @classmethod
    def declare_text_generation(cls, settings: ModelSettings) -> TextGeneration | None:
        """The text-generation declaration with the chat template of the checkpoint's
        tokenizer (when it has one in its folder)."""
        declared = cls.text_generation
        template = chat_template(Path(source_of(settings)))
        if declared is None or not template:
            return declared
        return attrs.evolve(declared, chat_template=template)

    def source(self) -> str:
        return source_of(self.settings)

    def metadata(self) -> dict[str, Any]:
        """The settings' inputs and outputs, else the contract's: ``text_input`` and
        ``text_output`` (BYTES [1]), as the built-in ``text`` model declares them; the
        dtype, device and decode the model runs with once loaded."""
        meta = super().metadata()
        meta["inputs"] = meta["inputs"] or [{"name": "text_input", "datatype": "BYTES", "shape": [1]}]
        meta["outputs"] = meta["outputs"] or [{"name": "text_output", "datatype": "BYTES", "shape": [1]}]
        if self.model is not None:
            meta["parameters"] = {
                "dtype": dtype_name(self.dtype),
                "device": str(self.device),
                "compile": self.compile_mode,
            }
        return meta

    async def load(self) -> None:
        import trio

        await trio.to_thread.run_sync(self._load)

    def _load(self) -> None:
        try:
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError:
            raise BadInput(f"model {self.name!r}: {EXTRA_HINT}") from None
        if self.threads > 0:
            torch.set_num_threads(self.threads)
        device = self.device_name or ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(device)
        try:
            self.dtype = choose_dtype(self.dtype_name, self.device)
            self.compile_mode = choose_compile(self.compile_name, self.device)
        except ValueError as exc:
            raise BadInput(f"model {self.name!r}: {exc}") from None
        source = self.source()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
            model: Any = AutoModelForCausalLM.from_pretrained(source, local_files_only=True, dtype=self.dtype)
        except (OSError, ValueError) as exc:
            raise BadInput(f"model {self.name!r}: cannot load {source!r} (local files only): {exc}") from None
        self.model = model.to(self.device).eval()
        config = model.config
        if not self.max_context:
            self.max_context = int(getattr(config, "max_position_embeddings", 0) or 2048)
        eos = getattr(model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos = frozenset([eos] if isinstance(eos, int) else (eos or []))
        start = self.tokenizer.bos_token_id
        self.start_token = int(start if start is not None else min(self.eos, default=0))
        declared = text_generation_of(self.settings, type(self))
        self.chat_template = declared.chat_template if declared is not None else ""
        self.prompts.set_tokenizer(
            self.tokenizer, self.start_token, self.max_context, self.max_prompt_chars, self.chat_template
        )
        with torch.inference_mode():  # warms the kernels up and measures a token's cache
            (kv,), _ = prefill(self.model, None, [[self.start_token]], self.device)
        self.token_bytes = self.budget.token_bytes = kv_bytes(kv)
        self.decoder = decoder_for(self.name, self.model, self.device, self.compile_mode, self.compile_after)

    async def unload(self) -> None:
        if self.decoder is not None:
            import trio

            # a compile under way holds the model: let it end (bounded) before it goes
            await trio.to_thread.run_sync(self.decoder.close, 60.0)

    # -- sequences ----------------------------------------------------------------------------

    def new_state(self, sequence_id: str) -> LLMState:
        state = LLMState(sequence_id)
        self.budget.open(state)
        return state

    def on_sequence_end(self, state: LLMState, reason: str) -> None:
        self.budget.close(state)

    def on_request_cancelled(self, work: LLMWork) -> None:
        work.settle()  # between steps: the sequence keeps what was read and said

    def cache_bytes(self) -> int:
        """The bytes of KV held now: the sequences' caches and the prefix cache."""
        return self.budget.held_bytes()

    def cache_statistics(self) -> CacheStatistics:
        return self.budget.statistics()

    def kv_cache_usage(self) -> float:
        """The bytes of KV held now (idle sequences, running requests' reservations, the
        prefix cache) over ``kv_cache_budget_mb``, at most 1 (a request that alone passes
        the budget runs); with a budget of 0, 1 while anything is held."""
        stats = self.budget.statistics()
        held = stats.sequence_bytes + stats.reserved_bytes + stats.prefix_bytes
        if self.kv_budget <= 0:
            return 1.0 if held else 0.0
        return min(1.0, held / self.kv_budget)

    # -- requests -----------------------------------------------------------------------------

    async def prepare(self, request: InferenceRequest, state: LLMState | None) -> None:
        """The prompt read, bounded and tokenized in a worker thread (see :mod:`.prompt`)."""
        await self.prompts.prepare(request, state)

    def begin(self, request: InferenceRequest, state: LLMState | None) -> LLMWork:
        read = self.prompts.take(request, state)
        request = read.request
        if read.tokenizer_call:
            return self._tokenizer_work(request, state, read.prompt)
        sampling = read_sampling(request, self.max_tokens_limit)
        # the fingerprint of the caller's token when sequences are bound to tokens: only
        # the cache budget reads it (whose idle caches a request may drop)
        owner = request.control.owner if request.control is not None else None
        if state is None:
            state = LLMState(owner=owner)
        elif state.owner is None:
            state.owner = owner
        echo = echo_of(request, state)
        text, messages, ids = read.text, read.messages, read.ids
        if len(ids) >= self.max_context:
            raise BadInput(
                f"input 'text_input': {len(ids)} tokens (with the sequence's history), the model's "
                f"context is {self.max_context} tokens (max_context)"
            )
        common = 0
        for a, b in zip(ids, state.ids, strict=False):
            if a != b:
                break
            common += 1
        cached = min(common, len(ids) - 1)  # the last token is read again for its logits
        own = cached  # the sequence's own history: not part of this request's prompt
        chain = self.budget.match(owner, ids, cached)
        # room for the context and what it may generate, up to the end of the context
        need = self.budget.admit(
            state, owner, len(ids) + min(sampling.max_tokens, self.max_context - len(ids))
        )
        if chain:  # more of it in the prefix cache than in the sequence's own cache
            cached = len(chain) * BLOCK
            state.kv, state.ids = None, []
        else:
            state.kv = crop(state.kv, cached)
            state.ids = ids[:cached]
        if read.tokens is not None:  # the next turn tokenizes from here (what it adds)
            state.tokens = read.tokens
        state.busy = True
        work = LLMWork(
            request,
            state,
            text,
            ids,
            cached,
            tokenizer=self.tokenizer,
            messages=messages,
            prefix=chain,
            settled=self.budget.settled,
            **attrs.asdict(sampling),
        )
        work.prompt_tokens = len(ids) - own  # reused prefix blocks count, as in OpenAI's usage
        self.budget.reserve(work, owner, need, cached - own if chain else 0)
        work.echo = ids if echo else None
        return work

    def _tokenizer_work(self, request: InferenceRequest, state: LLMState | None, prompt: str) -> LLMWork:
        """A tokenize or detokenize request (texttokens): answered at once, through the
        batch (the step hands the answer back)."""
        if state is not None:
            raise BadInput("a tokenize or detokenize request belongs to no sequence")
        outputs = tokenizer_outputs(request, self.tokenizer, prompt)
        work = LLMWork(
            request, LLMState(), "", [self.start_token], 0, tokenizer=self.tokenizer, **NO_SAMPLING
        )
        work.answer = self.response(request, outputs, {"max_context": self.max_context})
        return work

    def merge(self, request: InferenceRequest, responses: list[InferenceResponse]) -> InferenceResponse:
        """The whole generated text as one ``text_output`` BYTES [1] (a tokenizer
        request's one answer as it is)."""
        if len(responses) == 1 and responses[0].outputs and responses[0].outputs[0].name == TOKEN_IDS:
            return responses[0]
        output, parameters = merged_text(responses)
        return self.response(request, [output], parameters)

    # -- the step (worker thread) ---------------------------------------------------------------

    def step(self, batch: list[LLMWork]) -> list[StepOutput]:
        with torch.inference_mode():
            try:
                return self._step(batch)
            except BaseException:
                for work in batch:
                    work.settle()
                raise

    def _step(self, batch: list[LLMWork]) -> list[StepOutput]:
        outputs: list[StepOutput | None] = [None] * len(batch)
        raw: tuple[list[int], torch.Tensor] | None = None
        rows: list[LLMWork] = []
        logits: list[torch.Tensor] = []
        decoding: list[LLMWork] = []
        fresh: dict[int, list[tuple[LLMWork, list[int]]]] = {}
        groups: list[list[tuple[LLMWork, list[int]]]] = []
        for i, work in enumerate(batch):
            if work.prefix is not None:  # its first tokens' cache, from the prefix cache
                work.kv, work.prefix = joined(work.prefix, len(work.feed)), None
            left = len(work.feed) - work.cached
            if work.echo is not None:  # the prompt's own log-probabilities come first
                work.pending_logprobs[:0] = prompt_logprobs(
                    self.model, self.tokenizer, work, self.prefill_chunk
                )
            if work.answer is not None:
                work.settle()
                outputs[i] = StepOutput(work.answer, done=True)
            elif work.max_tokens == 0:
                outputs[i] = self._finish(work, "", "length")
            elif left == 1 and work.has_cache():
                decoding.append(work)
            else:
                chunk = work.feed[work.cached : work.cached + self.prefill_chunk]
                # fresh requests whose chunks have the same length are read in one forward
                group = fresh.setdefault(len(chunk), []) if work.kv is None else []
                group.append((work, chunk))
                if work.kv is not None:
                    groups.append(group)
        groups.extend(fresh.values())
        for group in groups:
            works = [work for work, _ in group]
            kvs, last = prefill(self.model, works[0].kv, [chunk for _, chunk in group], self.device)
            for work, kv, (_, chunk), row in zip(works, kvs, group, last, strict=True):
                work.kv = kv
                work.cached += len(chunk)
                self.budget.prefilled += len(chunk)
                if work.cached == len(work.feed):
                    rows.append(work)
                    logits.append(row.unsqueeze(0))
        if decoding:
            current = self._batch
            if current is None or not current.same_rows(decoding):
                if current is not None and self.decoder is not None and self.decoder.pool is not None:
                    # the new batch may reuse these buffers: a row left out keeps a copy
                    for work in current.rows:
                        if work.slot is current and work not in decoding:
                            work.kv, work.slot = owned(work.cache()), None
                current = self._batch = new_batch(decoding, LLMWork.cache, current, self.decoder)
                for work in decoding:
                    work.slot, work.kv = current, None
            tokens_in = [0] * len(decoding)
            for work in decoding:
                tokens_in[current.index[id(work)]] = work.feed[-1]
                work.cached += 1
            rows.extend(current.rows)
            logits.append(current.step(self.model, tokens_in))
        else:
            self._batch = None
        tokens: list[int] = []
        if rows:
            both = logits[0] if len(logits) == 1 else torch.cat(logits)
            raw = raw_logprobs(both, rows)
            both = without_eos(both, rows, self.eos)
            top_ps = [w.top_p for w in rows]
            tokens = sample_rows(
                both,  # on the device: one transfer back, of the chosen ids
                [w.temperature for w in rows],
                [w.top_k for w in rows],
                [w.next_draw() if w.temperature > 0.0 else 0.0 for w in rows],
                top_ps if any(p < 1.0 for p in top_ps) else None,
            )
        if raw is not None:
            token_logprobs(self.tokenizer, self.eos, rows, tokens, raw)
        produced = dict(zip(map(id, rows), tokens, strict=True))
        for i, work in enumerate(batch):
            if outputs[i] is None:
                token = produced.get(id(work))
                outputs[i] = _NOTHING if token is None else self._generated(work, token)
        return outputs  # type: ignore[return-value]

    def _generated(self, work: LLMWork, token: int) -> StepOutput:
        """One generated token: stream its text (held back while it may begin a stop
        string); finish on EOS (unless ``ignore_eos``; never drawn before ``min_tokens``),
        a stop string (looked for from ``min_tokens`` on), max_tokens or the end of the
        context."""
        work.generated += 1
        if token in self.eos and not work.ignore_eos:
            return self._finish(work, work.held + work.detok.flush(), "stop")
        work.feed.append(token)
        text = work.held + work.detok.add(token)
        if work.stop and work.generated >= work.min_tokens:
            ats = [at for stop in work.stop if (at := text.find(stop)) >= 0]
            if ats:
                return self._finish(work, text[: min(ats)], "stop")
        if work.generated >= work.max_tokens or len(work.feed) >= self.max_context:
            return self._finish(work, text + work.detok.flush(), "length")
        keep = longest_stop_prefix(text, work.stop) if work.stop and work.generated >= work.min_tokens else 0
        out, work.held = text[: len(text) - keep], text[len(text) - keep :]
        if not out and not (work.pending_logprobs and not work.held):
            return _NOTHING
        work.sent += out
        return StepOutput(self._text_response(work, out))

    def _finish(self, work: LLMWork, text: str, reason: str) -> StepOutput:
        """The last response of a request: its remaining text and ``finish_reason``."""
        work.held = ""
        work.sent += text
        work.settle()
        response = self._text_response(work, text)
        response.parameters["finish_reason"] = reason
        return StepOutput(response, done=True)

    def _text_response(self, work: LLMWork, text: str) -> InferenceResponse:
        """A response with ``text``, the log-probabilities of the tokens since the last
        one, and with ``usage`` the token counts so far (the last response's are final)."""
        response = InferenceResponse(
            self.name, [Tensor("text_output", (1,), "BYTES", text_bytes(text))], self.version, work.request.id
        )
        if work.pending_logprobs:
            response.parameters[LOGPROBS_PARAMETER] = logprobs_to_parameter(work.pending_logprobs)
            work.pending_logprobs = []
        if work.usage:
            response.parameters["prompt_tokens"] = work.prompt_tokens
            response.parameters["completion_tokens"] = work.generated
        return response


_NOTHING = StepOutput()
