"""``text``: the character GRU of :mod:`actorserve.models.textlm` served with continuous
batching, chunked prefill and per-sequence state.

Input ``text_input`` BYTES [1] (the prompt; absent or empty is allowed); output
``text_output`` BYTES [1], one streamed response per generated character (a character
that could start a ``stop`` string is held back until it is known not to, so a response
may then carry a few). The last response of a request has ``parameters.finish_reason``:
``"length"`` (max_tokens reached) or ``"stop"``. Unary ``infer`` returns the whole text as
one ``text_output``.

Request parameters (see ``docs/textlm.md``): ``max_tokens`` (default 64, at most the
model parameter ``max_tokens_limit``, 2048), ``temperature`` (>= 0, default 0.8, 0 is
greedy), ``top_k`` (>= 0, default 0 = all), ``top_p`` (0 to 1, default 1 = all), ``seed`` (an integer; random when absent) and
``stop`` (a string or a list of strings; generation ends when one is produced and it is
not included in the output) and ``usage`` (true: the last response also carries
``prompt_tokens`` and ``completion_tokens``, counted in characters, the model's tokens).

It declares the text-generation contract (:mod:`actorserve.textgen`), so the OpenAI
routes serve it; its chat template is in its settings (see ``docs/openai.md``).

In a sequence, the state is the GRU hidden state ``[L, H]`` plus the characters that
belong to the text but are not yet fed through the GRU (the last generated character, or
the rest of a prompt when a request was cancelled while its prompt was being read). Each
request continues from it, so a client sends only the new text. Without a sequence, every
request starts fresh.

Model parameters (``parameters`` of the settings): ``prefill_chunk`` (characters of a
prompt read per step, default 32), ``max_tokens_limit`` (2048), ``max_prompt_chars``
(16384), ``device`` (default: CUDA if available, else CPU) and ``threads`` (torch
intra-op threads, default 1).
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import numpy as np
import torch

from ..api import bool_parameter
from ..errors import BadInput
from ..model import BatchModel, StepOutput, float_parameter, int_parameter
from ..textgen import TextGeneration, merged_text
from ..types import InferenceRequest, InferenceResponse, Tensor
from .textlm.generation import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    GENERATION_PARAMETERS,
    TEXT_GENERATION,
    Generation,
    TextState,
    longest_stop_prefix,
    request_seed,
    sample_rows,
    stop_strings,
)
from .textlm.network import TextLMCore

__all__ = ["Generation", "TextModel", "TextState", "sample_rows"]


class TextModel(BatchModel[TextState, Generation]):
    """The ``text`` model; see the module docstring for its contract."""

    request_parameters: ClassVar[frozenset[str] | None] = GENERATION_PARAMETERS
    text_generation: ClassVar[TextGeneration | None] = TEXT_GENERATION

    default_max_batch_size: ClassVar[int] = 64
    overridable_parameters: ClassVar[frozenset[str]] = frozenset(
        {"prefill_chunk", "max_tokens_limit", "max_prompt_chars", "device", "threads"}
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        params = self.parameters
        self.prefill_chunk = int(params.get("prefill_chunk", 32))
        self.max_tokens_limit = int(params.get("max_tokens_limit", 2048))
        self.max_prompt_chars = int(params.get("max_prompt_chars", 16384))
        self.threads = int(params.get("threads", 1))
        self.device: str | None = params.get("device")
        if self.prefill_chunk < 1 or self.max_tokens_limit < 0 or self.max_prompt_chars < 1:
            raise ValueError(f"model {self.name!r}: prefill_chunk and max_prompt_chars must be >= 1")
        #: states of the open sequences, by id (new_state / on_sequence_end, event loop only)
        self.sequences: dict[str, TextState] = {}
        self.core: TextLMCore
        # (decode rows, their new states [L, B, H], per-row views) of the last step
        self._last_decode: tuple[list[Generation], torch.Tensor, tuple[torch.Tensor, ...]] | None = None
        self._configured_threads: set[int] = set()

    async def load(self) -> None:
        import trio

        await trio.to_thread.run_sync(self._load)

    def _load(self) -> None:
        if self.threads > 0:
            torch.set_num_threads(self.threads)
        self.core = TextLMCore.load(device=self.device)
        vocab = self.core.vocab
        self._zeros = self.core.initial_state()
        self._chars = vocab.chars
        self._newline = vocab.encode("\n")
        # One object array per character, reused by every response that carries it.
        self._char_data = [self._bytes(c.encode()) for c in vocab.chars]
        self._empty = self._bytes(b"")
        self.core.prefill([self._zeros], [self._newline])  # warm up torch's kernels

    @staticmethod
    def _bytes(value: bytes) -> np.ndarray[Any, np.dtype[Any]]:
        data = np.empty(1, dtype=object)
        data[0] = value
        return data

    # -- sequences -------------------------------------------------------------------------

    def new_state(self, sequence_id: str) -> TextState:
        state = TextState(sequence_id)
        self.sequences[sequence_id] = state
        return state

    def on_sequence_end(self, state: TextState, reason: str) -> None:
        state.hidden = None
        state.pending = []
        # only its own entry: its id may have been opened again while it ended
        if state.sequence_id is not None and self.sequences.get(state.sequence_id) is state:
            del self.sequences[state.sequence_id]

    def on_request_cancelled(self, work: Generation) -> None:
        # Called between steps: the state keeps what was read and generated so far.
        if not work.finished:
            work.settle()

    # -- requests ----------------------------------------------------------------------------

    def begin(self, request: InferenceRequest, state: TextState | None) -> Generation:
        tensor = request.input("text_input", required=False)
        prompt = ""
        if tensor is not None:
            if tensor.datatype != "BYTES" or tensor.data.size != 1:
                raise BadInput(
                    f"input 'text_input': expected BYTES with shape [1], got {tensor.datatype} "
                    f"{list(tensor.shape)}"
                )
            value = tensor.data.reshape(-1)[0]
            prompt = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
        if len(prompt) > self.max_prompt_chars:
            raise BadInput(
                f"input 'text_input': {len(prompt)} characters, more than {self.max_prompt_chars} "
                "(max_prompt_chars)"
            )
        max_tokens = int_parameter(
            request, "max_tokens", DEFAULT_MAX_TOKENS, minimum=0, maximum=self.max_tokens_limit
        )
        temperature = float_parameter(request, "temperature", DEFAULT_TEMPERATURE, minimum=0.0)
        top_k = int_parameter(request, "top_k", 0, minimum=0)
        top_p = float_parameter(request, "top_p", 1.0, minimum=0.0, maximum=1.0)
        stop = stop_strings(request)
        seed = request_seed(request)
        bool_parameter(request.parameters.get("usage", False), "usage")
        if state is None:
            state = TextState()
        ids = self.core.vocab.encode(prompt)
        if not ids and state.fresh:
            ids = list(self._newline)  # a fresh stream starts at a line break, as in training
        return Generation(
            request,
            state,
            ids,
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

    # -- the step (worker thread) --------------------------------------------------------------

    def step(self, batch: list[Generation]) -> list[StepOutput]:
        if self.threads > 0 and threading.get_ident() not in self._configured_threads:
            # OpenMP's thread count is per calling thread once that thread has used it:
            # a worker thread that ran torch before load() would still use every core.
            torch.set_num_threads(self.threads)
            self._configured_threads.add(threading.get_ident())
        with torch.inference_mode():
            try:
                return self._step(batch)
            except BaseException:
                for work in batch:  # keep each sequence's state usable for its next request
                    if not work.finished:
                        work.settle()
                raise

    def _step(self, batch: list[Generation]) -> list[StepOutput]:
        core = self.core
        chunk = self.prefill_chunk
        prefill: list[Generation] = []
        prefill_chunks: list[list[int]] = []
        decode: list[Generation] = []
        decode_tokens: list[int] = []
        outputs: list[StepOutput | None] = [None] * len(batch)
        for i, work in enumerate(batch):
            if not work.started:
                work.start()
            left = len(work.feed) - work.fed
            if left == 1:
                decode.append(work)
                decode_tokens.append(work.feed[work.fed])
            elif left > 1 or work.generated < work.max_tokens:
                # a chunk of the prompt; or nothing left to read (a sequence continued with
                # an empty prompt): an empty chunk gives the logits of the state as it is
                prefill.append(work)
                prefill_chunks.append(work.feed[work.fed : work.fed + chunk])
            else:  # max_tokens=0 and everything read
                outputs[i] = self._finish(work)
        logits_parts: list[torch.Tensor] = []
        rows: list[Generation] = []  # the works whose logits row is in logits_parts, in order
        if prefill:
            states, logits = core.prefill(
                [w.state.hidden if w.state.hidden is not None else self._zeros for w in prefill],
                prefill_chunks,
            )
            ready = []
            for j, work in enumerate(prefill):
                work.state.hidden = states[j]
                work.fed += len(prefill_chunks[j])
                if work.fed == len(work.feed) and work.generated < work.max_tokens:
                    ready.append(j)
                    rows.append(work)
            if ready:
                logits_parts.append(logits if len(ready) == len(prefill) else logits[ready])
        if decode:
            stacked, logits = core.decode(self._stack(decode), decode_tokens)
            views = stacked.unbind(1)
            for j, work in enumerate(decode):
                work.state.hidden = views[j]
                work.fed += 1
            self._last_decode = (decode, stacked, views)
            if all(w.generated < w.max_tokens for w in decode):
                logits_parts.append(logits)
                rows.extend(decode)
            else:
                keep = [j for j, w in enumerate(decode) if w.generated < w.max_tokens]
                if keep:
                    logits_parts.append(logits[keep])
                    rows.extend(decode[j] for j in keep)
        else:
            self._last_decode = None
        tokens: list[int] = []
        if rows:
            both = logits_parts[0] if len(logits_parts) == 1 else torch.cat(logits_parts)
            top_ps = [w.top_p for w in rows]
            tokens = sample_rows(
                both.cpu(),  # the one transfer of the step
                [w.temperature for w in rows],
                [w.top_k for w in rows],
                [w.next_draw() if w.temperature > 0.0 else 0.0 for w in rows],
                top_ps if any(p < 1.0 for p in top_ps) else None,
            )
        produced = dict(zip(map(id, rows), tokens, strict=True))
        for i, work in enumerate(batch):
            if outputs[i] is not None:
                continue
            token = produced.get(id(work))
            if token is not None:
                outputs[i] = self._generated(work, token)
            elif work.fed == len(work.feed) and work.generated >= work.max_tokens:
                outputs[i] = self._finish(work)
            else:
                outputs[i] = _NOTHING
        return outputs  # type: ignore[return-value]

    def _stack(self, decode: list[Generation]) -> torch.Tensor:
        """The decode rows' states as one [L, B, H] tensor: the previous step's output as
        it is when the same rows decode again (the usual case), else stacked anew."""
        last = self._last_decode
        if last is not None and last[0] == decode:
            views = last[2]
            if all(w.state.hidden is views[j] for j, w in enumerate(decode)):
                return last[1]
        return torch.stack(
            [w.state.hidden if w.state.hidden is not None else self._zeros for w in decode], dim=1
        )

    def _generated(self, work: Generation, token: int) -> StepOutput:
        """Account for one generated character: stream it (or hold it back while it may
        begin a stop string); finish on a stop string or at max_tokens."""
        work.feed.append(token)
        work.generated += 1
        if not work.stop:
            if work.generated >= work.max_tokens:
                return self._finish(work, self._char_data[token])
            return StepOutput(self._text_response(work, self._char_data[token]))
        text = work.held + self._chars[token]
        # ``held`` holds no whole stop string, so a match can only end at this character.
        ats = [at for stop in work.stop if (at := text.find(stop)) >= 0]
        if ats:
            at = min(ats)
            return self._finish(work, self._bytes(text[:at].encode()) if at else None, "stop")
        keep = longest_stop_prefix(text, work.stop)
        out, work.held = text[: len(text) - keep], text[len(text) - keep :]
        if work.generated >= work.max_tokens:
            return self._finish(work, self._bytes(text.encode()))
        if not out:
            return _NOTHING
        return StepOutput(self._text_response(work, self._bytes(out.encode())))

    def _finish(
        self, work: Generation, data: np.ndarray[Any, np.dtype[Any]] | None = None, reason: str = "length"
    ) -> StepOutput:
        """The last response of a request: its remaining text (possibly empty) and
        ``parameters.finish_reason`` ("length" or "stop"), so that a client of a stream
        that carries several requests (gRPC) knows where each one ends."""
        work.settle()
        response = self._text_response(work, data if data is not None else self._empty)
        response.parameters["finish_reason"] = reason
        if work.request.parameters.get("usage") and bool_parameter(work.request.parameters["usage"], "usage"):
            response.parameters["prompt_tokens"] = len(work.prompt)
            response.parameters["completion_tokens"] = work.generated
        return StepOutput(response, done=True)

    def _text_response(self, work: Generation, data: np.ndarray[Any, np.dtype[Any]]) -> InferenceResponse:
        return InferenceResponse(
            self.name, [Tensor("text_output", (1,), "BYTES", data)], self.version, work.request.id
        )


_NOTHING = StepOutput()
