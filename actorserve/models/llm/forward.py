"""The two forward passes of the ``transformers`` runtime, over per-request KV caches.

A request's cache is a list of (keys, values) per layer, each ``[1, heads, length, dim]``,
owned by the request (or its sequence) so that it can join and leave any batch.
``transformers``' own continuous batching (``generate_batch`` / the paged-attention
manager) runs its own thread and scheduler and cannot be stepped by our batcher, so the
batched decode here left-pads the caches into one ``DynamicCache`` for the step and
takes each row's new position back out (see docs/llm.md).
"""

from __future__ import annotations

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


def prefill(model: Any, kv: KV | None, ids: list[int], device: torch.device) -> tuple[KV, torch.Tensor]:
    """Read ``ids`` after ``kv``: the new cache and the logits [V] of the last position."""
    start = kv_length(kv)
    cache = _cache(kv)
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    positions = torch.arange(start, start + len(ids), device=device).unsqueeze(0)
    out = model(input_ids=input_ids, position_ids=positions, cache=cache, use_cache=True)
    return _taken(out.cache), out.logits[0, -1]


def decode(
    model: Any, kvs: list[KV], tokens: list[int], device: torch.device
) -> tuple[list[KV], torch.Tensor]:
    """One token for each row, all rows in one forward: the rows' new caches and logits [B, V].

    Caches of different lengths are left-padded to the longest; the attention mask hides
    the padding and each row gets its own position, so a row's result is the one it would
    have alone (up to the rounding of a wider matrix product)."""
    lengths = [kv_length(kv) for kv in kvs]
    longest = max(lengths)
    rows = len(kvs)
    input_ids = torch.tensor(tokens, dtype=torch.long, device=device).unsqueeze(1)
    positions = torch.tensor(lengths, dtype=torch.long, device=device).unsqueeze(1)
    if rows == 1:
        cache = _cache(kvs[0])
        mask = None
    else:
        layers: KV = []
        for layer in range(len(kvs[0])):
            k0, v0 = kvs[0][layer]
            keys = k0.new_zeros((rows, k0.shape[1], longest, k0.shape[3]))
            values = v0.new_zeros((rows, v0.shape[1], longest, v0.shape[3]))
            for i, kv in enumerate(kvs):
                n = lengths[i]
                keys[i, :, longest - n :] = kv[layer][0][0]
                values[i, :, longest - n :] = kv[layer][1][0]
            layers.append((keys, values))
        cache = _cache(layers)
        mask = torch.zeros((rows, longest + 1), dtype=torch.long, device=device)
        for i, n in enumerate(lengths):
            mask[i, longest - n :] = 1
    out = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=positions,
        cache=cache,
        use_cache=True,
    )
    if rows == 1:
        return [_taken(out.cache)], out.logits[:, -1]
    new = []
    for i, kv in enumerate(kvs):
        new.append(
            [
                (
                    torch.cat([k, layer.keys[i : i + 1, :, longest:]], dim=2),
                    torch.cat([v, layer.values[i : i + 1, :, longest:]], dim=2),
                )
                for (k, v), layer in zip(kv, out.cache.layers, strict=True)
            ]
        )
    return new, out.logits[:, -1]
