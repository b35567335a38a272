"""Character-level GRU language model and a batched, deterministic generation core.

This module is self-contained on purpose (torch, numpy, safetensors and json only, nothing
from the rest of actorserve), so that the training script and the tests can use it without
the server.

The network is ``Embedding(V, E) -> GRU(E, H, L layers) -> Linear(H, V)``. The GRU hidden
state ``[L, H]`` *is* the whole per-sequence state: the logits for the next character are
``head(state[-1])`` (the top layer's hidden state equals the GRU output at the last position),
so a stream can be suspended after any step and resumed later from its ``[L, H]`` tensor alone.

:class:`TextLMCore` is what the server calls, from a worker thread, for continuous batching:

* :meth:`TextLMCore.prefill` runs the prompt chunks of several streams as one packed batch;
* :meth:`TextLMCore.decode` advances ``B`` streams by one character together;
* :meth:`TextLMCore.sample` picks the next character of one stream with that stream's own
  ``torch.Generator``, so a seeded stream produces the same text whatever else is in its batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

__all__ = [
    "PACKAGE_DIR",
    "VOCAB_FILE",
    "WEIGHTS_FILE",
    "CharGRU",
    "CharVocab",
    "GRUConfig",
    "TextLMCore",
    "default_device",
    "generate",
    "load_textlm",
]

PACKAGE_DIR = Path(__file__).resolve().parent
WEIGHTS_FILE = "weights.safetensors"
VOCAB_FILE = "vocab.json"


class CharVocab:
    """A fixed character vocabulary. Characters not in it encode to ``fallback``."""

    def __init__(self, chars: str, fallback: str = " ") -> None:
        if len(set(chars)) != len(chars):
            raise ValueError("vocabulary characters must be unique")
        if len(fallback) != 1 or fallback not in chars:
            raise ValueError(f"fallback {fallback!r} must be a single vocabulary character")
        self.chars = chars
        self.fallback = fallback
        self._index = {c: i for i, c in enumerate(chars)}
        self.fallback_id = self._index[fallback]

    @classmethod
    def from_text(cls, text: str, fallback: str = " ") -> CharVocab:
        """The sorted set of characters of ``text`` (plus ``fallback``)."""
        return cls("".join(sorted(set(text) | {fallback})), fallback)

    @property
    def size(self) -> int:
        return len(self.chars)

    def __len__(self) -> int:
        return len(self.chars)

    def __contains__(self, char: object) -> bool:
        return char in self._index

    def encode(self, text: str) -> list[int]:
        index, fb = self._index, self.fallback_id
        return [index.get(c, fb) for c in text]

    def encode_array(self, text: str) -> np.ndarray[Any, np.dtype[np.int64]]:
        """``encode`` as an int64 array (faster for whole corpora)."""
        table = np.full(max(0x110000, 1), self.fallback_id, dtype=np.int64)
        for i, c in enumerate(self.chars):
            table[ord(c)] = i
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        return table[codes]

    def decode(self, ids: Sequence[int]) -> str:
        chars = self.chars
        return "".join(chars[i] for i in ids)


@dataclass(frozen=True)
class GRUConfig:
    vocab_size: int
    embedding_size: int = 64
    hidden_size: int = 384
    num_layers: int = 2


class CharGRU(nn.Module):
    """``Embedding -> GRU -> Linear``. ``forward`` maps tokens ``[B, T]`` and an optional
    state ``[L, B, H]`` to logits ``[B, T, V]`` and the new state ``[L, B, H]``."""

    def __init__(self, config: GRUConfig, dropout: float = 0.0) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.embedding_size)
        self.gru = nn.GRU(
            config.embedding_size,
            config.hidden_size,
            num_layers=config.num_layers,
            batch_first=True,
            dropout=dropout if config.num_layers > 1 else 0.0,
        )
        self.head = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(
        self, tokens: torch.Tensor, state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, new_state = self.gru(self.embed(tokens), state)
        return self.head(out), new_state


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_config(folder: Path | str | None = None) -> tuple[GRUConfig, CharVocab, dict[str, Any]]:
    """Read ``vocab.json``: the network shape, the vocabulary and the rest of its fields."""
    folder = PACKAGE_DIR if folder is None else Path(folder)
    meta: dict[str, Any] = json.loads((folder / VOCAB_FILE).read_text(encoding="utf-8"))
    vocab = CharVocab(meta["chars"], meta.get("fallback", " "))
    config = GRUConfig(
        vocab_size=vocab.size,
        embedding_size=int(meta["embedding_size"]),
        hidden_size=int(meta["hidden_size"]),
        num_layers=int(meta["num_layers"]),
    )
    return config, vocab, meta


def load_textlm(
    folder: Path | str | None = None, device: str | torch.device | None = None
) -> tuple[CharGRU, CharVocab]:
    """Load the trained model (float32, eval mode) and its vocabulary from ``folder``
    (default: this package's folder, which holds the committed weights)."""
    folder = PACKAGE_DIR if folder is None else Path(folder)
    dev = default_device() if device is None else torch.device(device)
    config, vocab, _ = load_config(folder)
    model = CharGRU(config)
    tensors = load_file(str(folder / WEIGHTS_FILE))
    model.load_state_dict({k: v.to(torch.float32) for k, v in tensors.items()})
    model.to(dev)
    model.eval()
    return model, vocab


class TextLMCore:
    """Batched stateful generation. Thread-safe only in the sense that one thread uses it at a time.

    A stream's state is a ``[L, H]`` float32 tensor on ``device`` (start from
    :meth:`initial_state`). Every method enters ``torch.inference_mode()`` itself (it is
    thread-local), so they can be called from any worker thread. Returned states are
    inference tensors: do not use them for autograd.
    """

    def __init__(self, model: CharGRU, vocab: CharVocab, device: str | torch.device | None = None) -> None:
        self.model = model.eval()
        self.vocab = vocab
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        cfg = model.config
        self.num_layers = cfg.num_layers
        self.hidden_size = cfg.hidden_size
        self.vocab_size = cfg.vocab_size

    @classmethod
    def load(cls, folder: Path | str | None = None, device: str | torch.device | None = None) -> TextLMCore:
        model, vocab = load_textlm(folder, device)
        return cls(model, vocab, next(model.parameters()).device)

    def initial_state(self) -> torch.Tensor:
        """The state of a fresh stream: zeros ``[L, H]``."""
        with torch.inference_mode():
            return torch.zeros(self.num_layers, self.hidden_size, device=self.device)

    def _logits(self, state: torch.Tensor) -> torch.Tensor:
        """Next-character logits ``[B, V]`` from states ``[L, B, H]``."""
        out: torch.Tensor = self.model.head(state[-1])
        return out.float()

    @staticmethod
    def _split(state: torch.Tensor) -> list[torch.Tensor]:
        # One copy to [B, L, H] so that each stream's [L, H] is a contiguous view.
        return list(state.transpose(0, 1).contiguous().unbind(0))

    def prefill(
        self, states: Sequence[torch.Tensor], chunks: Sequence[Sequence[int]]
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Feed ``chunks[i]`` to the stream in ``states[i]``, all rows as one packed batch.

        Returns the new states and the logits ``[B, V]`` of the character following each
        chunk. Each row's result equals running it alone (within float tolerance). An empty
        chunk leaves its state unchanged (its logits are then those of the state as it is).
        """
        if len(states) != len(chunks):
            raise ValueError(f"{len(states)} states but {len(chunks)} chunks")
        if not states:
            return [], torch.empty(0, self.vocab_size, device=self.device)
        with torch.inference_mode():
            h = torch.stack([s.to(self.device) for s in states], dim=1)  # [L, B, H]
            lengths = [len(c) for c in chunks]
            rows = [i for i, n in enumerate(lengths) if n > 0]
            if rows:
                max_len = max(lengths)
                tokens = torch.zeros(len(rows), max_len, dtype=torch.long)
                for j, i in enumerate(rows):
                    tokens[j, : lengths[i]] = torch.as_tensor(chunks[i], dtype=torch.long)
                tokens = tokens.to(self.device)
                lens = torch.tensor([lengths[i] for i in rows], dtype=torch.long)  # on CPU
                packed = pack_padded_sequence(
                    self.model.embed(tokens), lens, batch_first=True, enforce_sorted=False
                )
                index = torch.tensor(rows, device=self.device)
                # For a packed input GRU returns each row's hidden state at its own length,
                # in the original row order.
                _, h_rows = self.model.gru(packed, h.index_select(1, index).contiguous())
                h = h.index_copy(1, index, h_rows)
            return self._split(h), self._logits(h)

    @overload
    def decode(
        self, states: torch.Tensor, last_tokens: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    @overload
    def decode(
        self, states: Sequence[torch.Tensor], last_tokens: Sequence[int]
    ) -> tuple[list[torch.Tensor], torch.Tensor]: ...

    def decode(
        self, states: torch.Tensor | Sequence[torch.Tensor], last_tokens: Sequence[int]
    ) -> tuple[torch.Tensor | list[torch.Tensor], torch.Tensor]:
        """One step for ``B`` streams: feed ``last_tokens[i]`` to stream ``i``.

        ``states`` is either a stacked ``[L, B, H]`` tensor (then the new states come back
        stacked the same way, the cheapest form for a fixed batch) or a list of ``[L, H]``
        (then a list comes back). Also returns the next-character logits ``[B, V]``.
        """
        with torch.inference_mode():
            stacked = isinstance(states, torch.Tensor)
            if isinstance(states, torch.Tensor):
                h = states.to(self.device)
            else:
                if not states:
                    return [], torch.empty(0, self.vocab_size, device=self.device)
                h = torch.stack([s.to(self.device) for s in states], dim=1)
            if h.dim() != 3 or h.shape[1] != len(last_tokens):
                raise ValueError(f"states {tuple(h.shape)} do not match {len(last_tokens)} tokens")
            tokens = torch.as_tensor(list(last_tokens), dtype=torch.long).to(self.device)
            _, h_new = self.model.gru(self.model.embed(tokens).unsqueeze(1), h.contiguous())
            logits = self._logits(h_new)
            return (h_new if stacked else self._split(h_new)), logits

    @staticmethod
    def sample(
        logits_row: torch.Tensor,
        temperature: float,
        top_k: int,
        generator: torch.Generator,
        top_p: float = 1.0,
    ) -> int:
        """Pick one character id from one row of logits ``[V]``.

        ``temperature <= 0`` is greedy (argmax; the generator is not used). ``top_k <= 0``
        means no top-k limit; ``top_p`` below 1 keeps the likeliest characters whose
        probabilities reach ``top_p`` together (nucleus sampling, after top-k). Otherwise exactly one uniform draw is taken from ``generator``
        (a CPU generator seeded by the request's seed) and inverted through the cumulative
        distribution, so a stream's random sequence never depends on other streams.

        Determinism alone vs. batched: batched matmuls may differ from B=1 ones in the last
        float32 bits (~1e-6). The row is therefore moved to CPU and everything after it
        (temperature, top-k, softmax, cumsum, inversion) is done in float64 with fixed-order
        CPU ops, so the only way a batch can change the choice is if the uniform draw lands
        within ~1e-6 of a CDF boundary (or two greedy logits tie within ~1e-6): a chance of
        order 1e-6 per token, which the tests check in practice (greedy and seeded, 100
        tokens, alone vs. in a batch of 32). Rounding logits would not remove that chance
        (values can straddle a rounding boundary too), only move it.

        Pass rows of a CPU tensor when sampling many streams (move ``[B, V]`` once).
        """
        row = logits_row.detach().reshape(-1).to("cpu", torch.float64)
        if temperature <= 0.0:
            return int(torch.argmax(row).item())
        row = row / float(temperature)
        vocab_size = row.shape[0]
        if 0 < top_k < vocab_size:
            kth = torch.topk(row, top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, dim=0)
        if top_p < 1.0:
            probs = nucleus(probs.unsqueeze(0), [top_p])[0]
        cdf = torch.cumsum(probs, dim=0)
        u = torch.rand((), generator=generator, dtype=torch.float64)
        index = int(torch.searchsorted(cdf, u * cdf[-1], right=True).item())
        index = min(index, vocab_size - 1)
        # searchsorted can only land on a zero-probability entry at the very end (rounding).
        while probs[index] == 0.0 and index > 0:
            index -= 1
        return index

    @staticmethod
    def make_generator(seed: int) -> torch.Generator:
        """The per-stream CPU generator for ``seed``."""
        gen = torch.Generator(device="cpu")
        gen.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
        return gen


def nucleus(probs: torch.Tensor, top_ps: list[float]) -> torch.Tensor:
    """``probs`` [N, V] with, in row i, every character outside the smallest set of the
    likeliest ones whose probabilities reach ``top_ps[i]`` set to 0 (the likeliest is always
    kept; ties are ordered by character id, so the result is the same row by row)."""
    ordered, order = torch.sort(probs, dim=1, descending=True, stable=True)
    before = torch.cumsum(ordered, dim=1) - ordered
    drop = before >= torch.tensor(top_ps, dtype=probs.dtype, device=probs.device).unsqueeze(1)
    drop[:, 0] = False
    return probs.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), 0.0)


def generate(
    core: TextLMCore,
    prompt: str,
    max_tokens: int,
    temperature: float = 0.8,
    top_k: int = 0,
    seed: int = 0,
) -> str:
    """Single-stream generation: the ``max_tokens`` characters following ``prompt``
    (the prompt itself is not included). An empty prompt starts from a newline."""
    ids = core.vocab.encode(prompt if prompt else "\n")
    gen = TextLMCore.make_generator(seed)
    states, logits = core.prefill([core.initial_state()], [ids])
    state = states[0]
    out: list[int] = []
    for step in range(max_tokens):
        token = TextLMCore.sample(logits[0].cpu(), temperature, top_k, gen)
        out.append(token)
        if step + 1 < max_tokens:
            state_list, logits = core.decode([state], [token])
            state = state_list[0]
    return core.vocab.decode(out)
