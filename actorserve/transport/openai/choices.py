"""Running the choices of one OpenAI request on the engine through the text-generation
contract, unary or as a stream of events.

Each choice is one engine request (``infer_stream``), so OpenAI requests join the same
continuous batches as OIP requests. Leaving a choice's stream (its task cancelled, a
client gone, a stop string found by :class:`~actorserve.textgen.TextPieces`) cancels the
request in the engine, which drops it from its batch at the next step.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import attrs
import trio

from ...api import EngineAPI, with_control
from ...textgen import TextGeneration, TextOptions, TextPieces, chat_turn_request, text_request
from ...texttokens import TokenLogprob
from ...types import InferenceRequest
from .encode import Choice, Usage


@attrs.define(eq=False)
class ChoiceRun:
    """One choice: its engine request and, once run, its text and counts. Touched only by
    the task that runs it until it has finished."""

    index: int
    #: which prompt it answers (prompt tokens are counted once per prompt)
    prompt_index: int
    request: InferenceRequest
    stop: tuple[str, ...]
    max_tokens: int | None
    text: list[str] = attrs.field(factory=list)
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    sequence_id: str | None = None
    #: the tokens' log-probabilities (None: not asked for)
    logprobs: list[TokenLogprob] | None = None
    #: the text its answer starts with (``echo``: its prompt), passed on with the first piece
    echo: str = ""

    def choice(self) -> Choice:
        logprobs = None if self.logprobs is None else tuple(self.logprobs)
        return Choice(self.index, "".join(self.text), self.finish_reason, logprobs)


def plan_choices(
    spec: TextGeneration,
    prompts: list[str],
    options: TextOptions,
    n: int,
    extra_stop: tuple[str, ...] = (),
    messages: tuple[Mapping[str, str], ...] | None = None,
    echo: bool = False,
) -> list[ChoiceRun]:
    """``n`` runs per prompt, numbered as OpenAI numbers choices (prompt-major); with a
    ``seed``, choice j of a prompt uses ``seed + j``. ``messages`` instead of ``prompts``:
    one chat turn for a model that renders its sequence's conversation itself
    (``chat_history``). :class:`BadInput` for an option the model does not take."""
    stop = options.stop + tuple(s for s in extra_stop if s not in options.stop)
    runs = []
    wanted: list[TokenLogprob] | None = None if options.logprobs is None else []
    if messages is not None:
        request = with_control(chat_turn_request(spec, messages, attrs.evolve(options, stop=stop)))
        return [ChoiceRun(0, 0, request, stop, options.max_tokens, logprobs=wanted)]
    for p, prompt in enumerate(prompts):
        for j in range(n):
            seed = None if options.seed is None else options.seed + j
            choice_options = attrs.evolve(options, seed=seed, stop=stop)
            request = with_control(text_request(spec, prompt, choice_options))  # the door reads them once
            logprobs: list[TokenLogprob] | None = None if wanted is None else []
            run = ChoiceRun(p * n + j, p, request, stop, options.max_tokens, logprobs=logprobs)
            run.echo = prompt if echo else ""
            runs.append(run)
    return runs


#: ``on_text(run, text, logprobs)``: a piece of a choice's text (and the log-probabilities
#: of its tokens, when asked for), as it is produced
OnText = Callable[[ChoiceRun, str, list[TokenLogprob]], Awaitable[None]]


async def run_choice(
    engine: EngineAPI, spec: TextGeneration, model: str, run: ChoiceRun, on_text: OnText
) -> None:
    """Generate one choice, passing each piece to ``on_text``; errors propagate (the
    engine's domain errors)."""
    pieces = TextPieces(spec, run.stop, run.max_tokens)
    async with engine.infer_stream(run.request, model=model) as responses:
        while not pieces.done:
            try:
                batch = await responses.next_batch()
            except StopAsyncIteration:
                break
            if run.sequence_id is None and batch and "sequence_id" in batch[0].parameters:
                run.sequence_id = str(batch[0].parameters["sequence_id"])
            text = "".join([pieces.feed(response) for response in batch])
            logprobs = pieces.take_logprobs()
            run.prompt_tokens, run.completion_tokens = pieces.prompt_tokens, pieces.completion_tokens
            text, run.echo = run.echo + text, ""
            if text or logprobs:
                await on_text(run, text, logprobs)
    tail, run.echo = run.echo + pieces.close(), ""
    if tail:
        await on_text(run, tail, [])
    run.finish_reason = pieces.finish_reason
    run.prompt_tokens = pieces.prompt_tokens
    run.completion_tokens = pieces.completion_tokens


def total_usage(runs: list[ChoiceRun]) -> Usage:
    """Completion tokens of every choice; prompt tokens once per prompt."""
    prompt_tokens: dict[int, int] = {}
    for run in runs:
        prompt_tokens[run.prompt_index] = max(prompt_tokens.get(run.prompt_index, 0), run.prompt_tokens)
    return Usage(sum(prompt_tokens.values()), sum(run.completion_tokens for run in runs))


async def run_all(engine: EngineAPI, spec: TextGeneration, model: str, runs: list[ChoiceRun]) -> None:
    """Every choice to its end, together; the first error cancels the others and is raised."""

    async def collect(run: ChoiceRun, text: str, logprobs: list[TokenLogprob]) -> None:
        run.text.append(text)
        if run.logprobs is not None:
            run.logprobs.extend(logprobs)

    failures: list[Exception] = []

    async def one(run: ChoiceRun, cancel: trio.CancelScope) -> None:
        try:
            await run_choice(engine, spec, model, run, collect)
        except Exception as exc:
            failures.append(exc)
            cancel.cancel()

    async with trio.open_nursery() as nursery:
        for run in runs:
            nursery.start_soon(one, run, nursery.cancel_scope)
    if failures:
        raise failures[0]


@attrs.frozen(slots=True)
class Event:
    """What a streaming choice reports: a piece of text, its end, or its error."""

    run: ChoiceRun
    text: str = ""
    end: bool = False
    error: Exception | None = None
    logprobs: tuple[TokenLogprob, ...] = ()


async def stream_choice(
    engine: EngineAPI, spec: TextGeneration, model: str, run: ChoiceRun, events: trio.MemorySendChannel[Event]
) -> None:
    """Run one choice, reporting :class:`Event` s on ``events`` (closed at the end); its
    error is reported, not raised."""

    async def forward(run: ChoiceRun, text: str, logprobs: list[TokenLogprob]) -> None:
        await events.send(Event(run, text, logprobs=tuple(logprobs)))

    async with events:
        try:
            await run_choice(engine, spec, model, run, forward)
        except Exception as exc:
            await events.send(Event(run, error=exc))
        else:
            await events.send(Event(run, end=True))


def drain(first: Event, receive: trio.MemoryReceiveChannel[Event]) -> list[Event]:
    """``first`` and every event already waiting (one write carries them all)."""
    events = [first]
    while True:
        try:
            events.append(receive.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return events


__all__ = [
    "ChoiceRun",
    "Event",
    "drain",
    "plan_choices",
    "run_all",
    "run_choice",
    "stream_choice",
    "total_usage",
]
