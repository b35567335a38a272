"""The two forward passes of the ``transformers`` runtime: prefill over a request's own
KV cache, and the batched decode over one preallocated batch cache.

A request's cache is a list of (keys, values) per layer, each ``[1, heads, length, dim]``,
owned by the request (or its sequence) so that it can join and leave any batch.
``transformers``' own continuous batching (``generate_batch`` / the paged-attention
manager) runs its own thread and scheduler and cannot be stepped by our batcher, so the
batched decode here left-pads the rows' caches once into a :class:`Batch` whose layers
are preallocated with room to grow (see docs/llm.md): each step writes the new position
of every row in place instead of copying the whole cache (``DynamicCache`` concatenates
per step), and a row's cache is a view of the batch until it leaves.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch

if TYPE_CHECKING:
    from .compiled import Decoder

RowT = TypeVar("RowT")

#: one request's KV cache: (keys, values) per layer, each [1, heads, length, dim]
KV = list[tuple[torch.Tensor, torch.Tensor]]

#: positions a batch cache grows by when it is full (and holds free after a re-pad)
ROOM = 64

#: a zeroed buffer for keys (0) or values (1) of a shape, like a tensor
Alloc = Callable[[int, tuple[int, int, int, int], torch.Tensor], torch.Tensor]


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


def owned(kv: KV | None) -> KV | None:
    """``kv`` in tensors of its own (a row of a batch would keep the whole batch alive)."""
    if not kv or kv[0][0]._base is None:
        return kv
    return [(k.clone(), v.clone()) for k, v in kv]


def _room(tensor: torch.Tensor, more: int) -> torch.Tensor | None:
    """The buffer ``tensor`` is the first positions of, when it has room for ``more``
    positions after them (a cache :func:`.prefix.joined` made with room for the prompt,
    or a prefill wrote into one): the next positions are then written in place. None for
    any other tensor (a batch's row among others, a cache of its own)."""
    base = tensor._base
    if base is None or base.dim() != 4 or base.shape[0] != 1 or base.data_ptr() != tensor.data_ptr():
        return None
    if base.stride() != tensor.stride() or base.shape[-2] < tensor.shape[-2] + more:
        return None
    return base


def _cache(kv: KV | None, more: int) -> Any:
    from transformers import DynamicCache

    if not kv:
        return DynamicCache()
    buffers = [(_room(k, more), _room(v, more)) for k, v in kv]
    if any(k is None or v is None for k, v in buffers):
        return DynamicCache(ddp_cache_data=kv)  # concatenates: a copy of the cache per forward
    cache = DynamicCache()
    cache.layers = [_slab()(k, v, kv_length(kv)) for k, v in buffers]
    cache.layer_class_to_replicate = None
    return cache


def prefill(
    model: Any, kv: KV | None, chunks: list[list[int]], device: torch.device, *, last_only: bool = True
) -> tuple[list[KV], torch.Tensor]:
    """Read ``chunks`` (of the same length; several only when ``kv`` is None) after
    ``kv``: each chunk's new cache and the logits [B, V] of each chunk's last position
    (``last_only``: the model computes no other position's logits, as ``generate`` does)."""
    start = kv_length(kv)
    cache = _cache(kv, len(chunks[0]))
    input_ids = torch.tensor(chunks, dtype=torch.long, device=device)
    positions = (
        torch.arange(start, start + len(chunks[0]), device=device).unsqueeze(0).expand(len(chunks), -1)
    )
    extra = {"logits_to_keep": 1} if last_only else {}
    out = model(input_ids=input_ids, position_ids=positions, cache=cache, use_cache=True, **extra)
    taken = [(layer.keys, layer.values) for layer in out.cache.layers]
    if len(chunks) == 1:
        return [taken], out.logits[:, -1]
    return [[(k[i : i + 1], v[i : i + 1]) for k, v in taken] for i in range(len(chunks))], out.logits[:, -1]


@functools.cache
def _slab() -> type:
    """The cache layer of a :class:`Batch` (a class made on first use: ``transformers``
    is an optional extra, imported only when a model loads)."""
    from transformers.cache_utils import DynamicLayer

    class Slab(DynamicLayer):  # type: ignore[no-untyped-call]
        """One layer of a batch cache: keys and values in buffers [B, heads, capacity,
        dim], of which the first ``length`` positions are used; ``update`` writes the
        new positions in place and returns views (a ``DynamicLayer`` copies the whole
        cache into a new tensor instead)."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.buffers = (keys, values)
            self.device = keys.device
            self.is_initialized = True
            self.length = length
            self.keys, self.values = keys[:, :, :length], values[:, :, :length]

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            end = self.length + key_states.shape[-2]
            if end > self.buffers[0].shape[-2]:
                self.grow(end + ROOM)
            keys, values = self.buffers
            keys[:, :, self.length : end] = key_states
            values[:, :, self.length : end] = value_states
            self.length = end
            self.keys, self.values = keys[:, :, :end], values[:, :, :end]
            return self.keys, self.values

        def grow(self, capacity: int, alloc: Alloc | None = None) -> None:
            """Move to buffers of ``capacity`` positions (one copy of the cache)."""
            grown = []
            for which, old in enumerate(self.buffers):
                shape = (old.shape[0], old.shape[1], capacity, old.shape[3])
                new = old.new_zeros(shape) if alloc is None else alloc(which, shape, old)
                new[:, :, : self.length] = old[:, :, : self.length]
                grown.append(new)
            self.buffers = (grown[0], grown[1])

        def moved(self, length: int) -> None:
            """``length`` positions are used now (written by the compiled decode)."""
            keys, values = self.buffers
            self.length = length
            self.keys, self.values = keys[:, :, :length], values[:, :, :length]

        def get_seq_length(self) -> int:
            return int(self.length)

    return Slab


class Batch(Generic[RowT]):
    """The cache of the batched decode: ``rows`` (the works, by identity), each row's
    left padding, ``length`` (positions used, padding included), the attention mask
    (None without padding) and the next positions, kept on the device from step to step.
    While the next step decodes the same rows it goes on in place; a row's own cache is
    ``row(i)``, a view (:func:`owned` before keeping it).

    With a ``decoder`` (:mod:`.compiled`) the buffers are bucketed: more rows than
    ``rows`` (padding rows, which attend only to their own positions from ``length`` on)
    and a capacity of a bucket; each step then runs the decoder's fixed-shape forward."""

    __slots__ = ("cache", "decoder", "index", "length", "mask", "pad", "pads", "positions", "rows")

    def __init__(
        self, rows: list[RowT], cache: Any, pads: list[int], length: int, decoder: Decoder | None = None
    ) -> None:
        self.rows = rows
        self.index = {id(row): i for i, row in enumerate(rows)}
        self.cache = cache
        self.pads = pads
        self.length = length
        self.decoder = decoder
        device = cache.layers[0].device
        size = int(cache.layers[0].buffers[0].shape[0])
        every = pads + [length] * (size - len(pads))  # padding rows see only their own positions
        self.pad = torch.tensor(every, dtype=torch.long, device=device).unsqueeze(1)
        self.positions = length - self.pad
        self.mask: torch.Tensor | None = None
        if any(pads) and decoder is None:
            self.mask = self._mask(self.pad, self.capacity)

    @property
    def capacity(self) -> int:
        return int(self.cache.layers[0].buffers[0].shape[-2])

    @staticmethod
    def _mask(pad: torch.Tensor, capacity: int) -> torch.Tensor:
        columns = torch.arange(capacity, device=pad.device).unsqueeze(0)
        return (columns >= pad).to(torch.long)

    def same_rows(self, rows: Sequence[RowT]) -> bool:
        return len(rows) == len(self.rows) and all(id(row) in self.index for row in rows)

    def row(self, i: int) -> KV:
        """Row i's cache: views of the batch's buffers."""
        pad, end = self.pads[i], self.length
        return [
            (layer.keys[i : i + 1, :, pad:end], layer.values[i : i + 1, :, pad:end])
            for layer in self.cache.layers
        ]

    def step(self, model: Any, tokens: list[int]) -> torch.Tensor:
        """One forward of the batch reading ``tokens`` (in ``rows`` order): logits [B, V]."""
        if self.decoder is not None:
            return self._decode(self.decoder, tokens)
        if self.length + 1 > self.capacity:
            capacity = self.length + 1 + ROOM
            for layer in self.cache.layers:
                layer.grow(capacity)
            if self.mask is not None:
                self.mask = self._mask(self.length - self.positions, capacity)
        device = self.positions.device
        input_ids = torch.tensor(tokens, dtype=torch.long, device=device).unsqueeze(1)
        mask = None if self.mask is None else self.mask[:, : self.length + 1]
        out = model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=self.positions,
            cache=self.cache,
            use_cache=True,
        )
        self.length += 1
        self.positions = self.positions + 1
        logits: torch.Tensor = out.logits[:, -1]
        return logits

    def _decode(self, decoder: Decoder, tokens: list[int]) -> torch.Tensor:
        """One step of the bucketed forward (a bigger bucket of length when full)."""
        from .compiled import capacity_bucket

        layers = self.cache.layers
        if self.length + 1 > self.capacity:
            capacity = capacity_bucket(self.length + 1)
            for i, layer in enumerate(layers):
                layer.grow(capacity, functools.partial(decoder.buffer, i))
        logits = decoder.run(
            [layer.buffers for layer in layers], tokens, self.positions, self.pad, self.length
        )
        self.length += 1
        self.positions = self.positions + 1
        for layer in layers:
            layer.moved(self.length)
        return logits


def new_batch(
    rows: Sequence[RowT],
    cache_of: Callable[[RowT], KV],
    last: Batch[RowT] | None,
    decoder: Decoder | None = None,
) -> Batch[RowT]:
    """A new batch cache for ``rows``: the rows of ``last`` that stay first (moved in one
    copy per layer), then the others (``cache_of(row)``), each left-padded to the longest
    so that every row writes its next position in the same column; the attention mask
    hides the padding and each row keeps its own positions, so a row's result is the one
    it would have alone (up to the rounding of a wider matrix product). With a ``decoder``
    the buffers have the rows and the capacity of its buckets."""
    wanted = {id(row) for row in rows}
    kept = [row for row in last.rows if id(row) in wanted] if last is not None else []
    known = {id(row) for row in kept}
    fresh = [row for row in rows if id(row) not in known]
    caches = [cache_of(row) for row in fresh]
    lengths = [kv_length(kv) for kv in caches]
    if last is not None and kept:
        sources = [last.index[id(row)] for row in kept]
        lengths[:0] = [last.length - last.pads[i] for i in sources]
    longest = max(lengths)
    pads = [longest - n for n in lengths]
    capacity, size = longest + 1 + ROOM, len(rows)
    if decoder is not None:
        from .compiled import capacity_bucket, rows_bucket

        capacity, size = capacity_bucket(longest + 1), rows_bucket(len(rows))
    layers = []
    for layer in range(len(caches[0]) if caches else len(last.cache.layers)):  # type: ignore[union-attr]
        like = caches[0][layer] if caches else last.cache.layers[layer].buffers  # type: ignore[union-attr]
        shapes = [(size, t.shape[1], capacity, t.shape[3]) for t in like]
        if decoder is None:
            keys, values = (t.new_zeros(shape) for t, shape in zip(like, shapes, strict=True))
        else:
            keys, values = (decoder.buffer(layer, w, shapes[w], like[w]) for w in (0, 1))
        if last is not None and kept:
            # the kept rows' positions move by ``shift`` columns (< 0 when the longest row
            # left: the padding shrinks; every kept row had at least that much)
            shift, index = longest - last.length, torch.tensor(sources, device=keys.device)
            begin = max(0, -shift)
            for new, old in zip((keys, values), last.cache.layers[layer].buffers, strict=True):
                new[: len(kept), :, begin + shift : longest] = old[:, :, begin : last.length].index_select(
                    0, index
                )
        for j, kv in enumerate(caches, start=len(kept)):
            keys[j, :, pads[j] : longest] = kv[layer][0][0]
            values[j, :, pads[j] : longest] = kv[layer][1][0]
        layers.append(_slab()(keys, values, longest))
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layers = layers
    cache.layer_class_to_replicate = None
    return Batch([*kept, *fresh], cache, pads, longest, decoder)
