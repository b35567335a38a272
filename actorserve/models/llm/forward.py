"""The two forward passes of the ``transformers`` runtime, over per-request KV caches.

A request's cache is a list of (keys, values) per layer, each ``[1, heads, length, dim]``,
owned by the request (or its sequence) so that it can join and leave any batch.
``transformers``' own continuous batching (``generate_batch`` / the paged-attention
manager) runs its own thread and scheduler and cannot be stepped by our batcher, so the
batched decode here left-pads the caches into one ``DynamicCache`` for the step and
takes each row's new position back out (see docs/llm.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

#: one request's KV cache: (keys, values) per layer, each [1, heads, length, dim]
KV = list[tuple[torch.Tensor, torch.Tensor]]


def kv_length(kv: KV | None) -> int:
    return 0 if not kv else int(kv[0][0].shape[-2])


def kv_bytes(kv: KV | None) -> int:
    if not kv:
        return 0
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


def crop(kv: KV | None, length: int) -> KV | None:
    """The first ``length`` positions of ``kv`` (None when empty)."""
    if not kv or length <= 0:
        return None
    if kv_length(kv) == length:
        return kv
    return [(k[:, :, :length].clone(), v[:, :, :length].clone()) for k, v in kv]


def _cache(kv: KV | None) -> Any:
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=kv) if kv else DynamicCache()


def _taken(cache: Any) -> KV:
    return [(layer.keys, layer.values) for layer in cache.layers]


def prefill(
    model: Any, kv: KV | None, chunks: list[list[int]], device: torch.device
) -> tuple[list[KV], torch.Tensor]:
    """Read ``chunks`` (of the same length; several only when ``kv`` is None) after
    ``kv``: each chunk's new cache and the logits [B, V] of each chunk's last position."""
    start = kv_length(kv)
    cache = _cache(kv)
    input_ids = torch.tensor(chunks, dtype=torch.long, device=device)
    positions = (
        torch.arange(start, start + len(chunks[0]), device=device).unsqueeze(0).expand(len(chunks), -1)
    )
    out = model(input_ids=input_ids, position_ids=positions, cache=cache, use_cache=True)
    taken = _taken(out.cache)
    if len(chunks) == 1:
        return [taken], out.logits[:, -1]
    return [[(k[i : i + 1], v[i : i + 1]) for k, v in taken] for i in range(len(chunks))], out.logits[:, -1]


class Batched:
    """The padded cache of the last batched decode: ``rows`` (the works, by identity) and
    each row's left padding. When the next step decodes the same rows, it goes on in this
    cache (one copy of the batch per step, in ``DynamicCache``) instead of padding every
    row's cache again."""

    __slots__ = ("cache", "pads", "rows")

    def __init__(self, rows: Sequence[object], cache: Any, pads: list[int]) -> None:
        self.rows = rows
        self.cache = cache
        self.pads = pads

    def row(self, i: int) -> KV:
        """Row i's cache: views of the batch's tensors (:func:`owned` before keeping it)."""
        pad = self.pads[i]
        return [
            (layer.keys[i : i + 1, :, pad:], layer.values[i : i + 1, :, pad:]) for layer in self.cache.layers
        ]


def owned(kv: KV | None) -> KV | None:
    """``kv`` in tensors of its own (a row of a batch would keep the whole batch alive)."""
    if not kv or kv[0][0]._base is None:
        return kv
    return [(k.clone(), v.clone()) for k, v in kv]


def decode(
    model: Any,
    rows: Sequence[object],
    kvs: list[KV],
    tokens: list[int],
    device: torch.device,
    last: Batched | None,
) -> tuple[Batched, torch.Tensor]:
    """One token for each row, all rows in one forward: the batch (each row's new cache
    is ``row(i)``) and the logits [B, V].

    Caches of different lengths are left-padded to the longest; the attention mask hides
    the padding and each row gets its own position, so a row's result is the one it would
    have alone (up to the rounding of a wider matrix product). ``last``: the previous
    step's batch, continued when its rows are the same."""
    count = len(rows)
    if (
        last is not None
        and len(last.rows) == count
        and all(a is b for a, b in zip(last.rows, rows, strict=True))
    ):
        cache, pads = last.cache, last.pads
        longest = kv_length(kvs[0]) + pads[0]
    else:
        lengths = [kv_length(kv) for kv in kvs]
        longest = max(lengths)
        pads = [longest - n for n in lengths]
        layers: KV = []
        for layer in range(len(kvs[0])):
            k0, v0 = kvs[0][layer]
            keys = k0.new_zeros((count, k0.shape[1], longest, k0.shape[3]))
            values = v0.new_zeros((count, v0.shape[1], longest, v0.shape[3]))
            for i, kv in enumerate(kvs):
                keys[i, :, pads[i] :] = kv[layer][0][0]
                values[i, :, pads[i] :] = kv[layer][1][0]
            layers.append((keys, values))
        cache = _cache(layers)
    input_ids = torch.tensor(tokens, dtype=torch.long, device=device).unsqueeze(1)
    positions = torch.tensor([longest - pad for pad in pads], dtype=torch.long, device=device).unsqueeze(1)
    mask = None
    if any(pads):
        mask = torch.ones((count, longest + 1), dtype=torch.long, device=device)
        for i, pad in enumerate(pads):
            mask[i, :pad] = 0
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
    return Batched(rows, out.cache, pads), out.logits[:, -1]
