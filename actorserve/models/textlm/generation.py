"""What the ``text`` model keeps per request and per sequence, and the sampling and stop
rules its step applies (no torch state here; :mod:`actorserve.models.text` is the model)."""

from __future__ import annotations

import secrets

import torch

from ...errors import BadInput
from ...model import int_parameter
from ...textgen import TextGeneration, longest_stop_prefix
from ...types import InferenceRequest
from .network import TextLMCore, nucleus

DEFAULT_MAX_TOKENS = 64
DEFAULT_TEMPERATURE = 0.8
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
DRAW_BLOCK = 64
_U64 = (1 << 64) - 1
#: the request parameters of the generation rules, the same for every built-in text
#: model (``text`` and the ``transformers`` runtime): the same names, the same meanings
GENERATION_PARAMETERS: frozenset[str] = frozenset(
    {"max_tokens", "temperature", "top_k", "top_p", "seed", "stop", "usage"}
)
#: what the generate extension and the OpenAI routes may map onto them
TEXT_GENERATION = TextGeneration(sampling=("temperature", "top_p", "seed", "top_k"), stop=True, usage=True)

__all__ = [
    "GENERATION_PARAMETERS",
    "TEXT_GENERATION",
    "Draws",
    "Generation",
    "TextState",
    "longest_stop_prefix",
    "request_seed",
    "sample_rows",
    "stop_strings",
]


class Draws:
    """The uniforms of one request's generator, drawn ahead in blocks: ``torch.rand(n)``
    on a CPU generator yields the same numbers as n scalar draws (the tests check), and
    one call per block instead of one per token keeps the step lean. Used by the ``text``
    model and the transformers runtime alike, so a seed means the same draws in both."""

    __slots__ = ("at", "generator", "values")

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator
        self.values: list[float] = []
        self.at = 0

    def next(self, remaining: int) -> float:
        """The next uniform; ``remaining`` (tokens the request may still draw for) caps
        the block, so a short request draws no more than it needs."""
        if self.at == len(self.values):
            block = min(DRAW_BLOCK, max(1, remaining))
            self.values = torch.rand(block, generator=self.generator, dtype=torch.float64).tolist()
            self.at = 0
        value = self.values[self.at]
        self.at += 1
        return value


class TextState:
    """The state of one sequence: ``hidden`` ([L, H] on the model's device, None = fresh,
    i.e. zeros) and ``pending``, character ids of the text not yet fed through the GRU.

    Touched only by ``step`` (in the worker thread) while a request of the sequence is in
    the batch, and by the engine's task otherwise."""

    __slots__ = ("hidden", "pending", "sequence_id")

    def __init__(self, sequence_id: str | None = None) -> None:
        self.sequence_id = sequence_id
        self.hidden: torch.Tensor | None = None
        self.pending: list[int] = []

    @property
    def fresh(self) -> bool:
        return self.hidden is None and not self.pending


class Generation:
    """One request's work: the characters to feed, then the characters to generate."""

    __slots__ = (
        "draws",
        "fed",
        "feed",
        "finished",
        "generated",
        "generator",
        "held",
        "max_tokens",
        "prompt",
        "request",
        "started",
        "state",
        "stop",
        "temperature",
        "top_k",
        "top_p",
    )

    def __init__(
        self,
        request: InferenceRequest,
        state: TextState,
        prompt: list[int],
        *,
        max_tokens: int,
        temperature: float,
        top_k: int,
        seed: int,
        top_p: float = 1.0,
        stop: tuple[str, ...],
    ) -> None:
        self.request = request
        self.state = state
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.stop = stop
        self.generator = TextLMCore.make_generator(seed)
        self.feed: list[int] = []  # the state's pending characters + prompt + generated
        self.fed = 0  # how many of ``feed`` went through the GRU
        self.started = False
        self.finished = False
        self.generated = 0
        self.held = ""  # generated text that may be the start of a stop string
        self.draws = Draws(self.generator)

    def next_draw(self) -> float:
        """The next uniform of this request's generator (see :class:`Draws`)."""
        return self.draws.next(self.max_tokens - self.generated)

    def start(self) -> None:
        """Take over the state's pending characters (first step only)."""
        state = self.state
        self.feed = [*state.pending, *self.prompt]
        state.pending = []
        self.started = True

    def settle(self) -> None:
        """Leave the state consistent on its own: unfed characters back to ``pending``
        and a hidden state that owns its memory (not a view of a whole batch)."""
        state = self.state
        if self.started:
            state.pending = self.feed[self.fed :]
            self.started = False
        if state.hidden is not None:
            state.hidden = state.hidden.clone()
        self.finished = True


def sample_rows(
    logits: torch.Tensor,
    temperatures: list[float],
    top_ks: list[int],
    draws: list[float],
    top_ps: list[float] | None = None,
) -> list[int]:
    """:meth:`TextLMCore.sample` for every row of ``logits`` [N, V] at once, on the
    device of ``logits``, with one transfer back (the chosen ids).

    ``draws[i]`` is row i's uniform draw from its own generator (ignored, and not to be
    drawn, when the row is greedy: temperature 0). The float64 operations are those of
    the single-row version and give the same choice row by row (the tests compare them),
    so a stream's text does not depend on what else is in its batch.
    """
    n, vocab_size = logits.shape
    device = logits.device
    rows = logits.to(torch.float64)
    sampled = [i for i in range(n) if temperatures[i] > 0.0]
    out = rows.argmax(dim=1)  # the greedy rows' choice
    if not sampled:
        return [int(i) for i in out.tolist()]
    if len(sampled) < n:
        rows = rows[sampled]
    temps = torch.tensor([temperatures[i] for i in sampled], dtype=torch.float64, device=device)
    rows = rows / temps.unsqueeze(1)
    ks = [top_ks[i] for i in sampled]
    limited = [j for j, k in enumerate(ks) if 0 < k < vocab_size]
    if limited:
        ordered = torch.sort(rows[limited], dim=1, descending=True).values
        kth = ordered.gather(1, torch.tensor([ks[j] - 1 for j in limited], device=device).unsqueeze(1))
        sub = rows[limited]
        rows[limited] = sub.masked_fill(sub < kth, float("-inf"))
    probs = torch.softmax(rows, dim=1)
    if top_ps is not None:
        nucleus_rows = [j for j, i in enumerate(sampled) if top_ps[i] < 1.0]
        if nucleus_rows:
            probs[nucleus_rows] = nucleus(probs[nucleus_rows], [top_ps[sampled[j]] for j in nucleus_rows])
    cdf = torch.cumsum(probs, dim=1)
    u = torch.tensor([draws[i] for i in sampled], dtype=torch.float64, device=device)
    index = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).clamp_(max=vocab_size - 1)
    # rounding may put the draw past the last non-zero entry: take the last non-zero
    # entry at or before it (the first entry when there is none)
    columns = torch.arange(vocab_size, device=device).unsqueeze(0)
    index = torch.where((probs > 0.0) & (columns <= index), columns, 0).amax(dim=1)
    if len(sampled) == n:
        out = index
    else:
        out[torch.tensor(sampled, device=device)] = index
    return [int(i) for i in out.tolist()]


def stop_strings(request: InferenceRequest) -> tuple[str, ...]:
    value = request.parameters.get("stop")
    if value is None:
        return ()
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise BadInput(f"parameter 'stop': expected a string or a list of strings, got {value!r}")
    if len(values) > MAX_STOP_STRINGS or any(not v or len(v) > MAX_STOP_CHARS for v in values):
        raise BadInput(
            f"parameter 'stop': expected at most {MAX_STOP_STRINGS} non-empty strings of at most "
            f"{MAX_STOP_CHARS} characters, got {value!r}"
        )
    return tuple(values)


def request_seed(request: InferenceRequest) -> int:
    if request.parameters.get("seed") is None:
        return secrets.randbits(64)
    return int_parameter(request, "seed", 0) & _U64
