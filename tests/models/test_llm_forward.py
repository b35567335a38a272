"""The batch cache of the ``transformers`` runtime's decode (``forward.Batch``) without a
model: rows joining, leaving and growing keep each row's cache, padding, positions and
attention mask exact (the runtime's tests check the text against ``transformers``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from actorserve.models.llm.forward import KV, ROOM, Batch, new_batch

pytest.importorskip("transformers")

LAYERS, HEADS, DIM = 2, 3, 4


class Row:
    """A request of the test: its cache as it should be (grown by every step)."""

    def __init__(self, name: str, length: int) -> None:
        self.name = name
        self.kv: KV = [
            (torch.randn(1, HEADS, length, DIM), torch.randn(1, HEADS, length, DIM)) for _ in range(LAYERS)
        ]

    def cache(self) -> KV:
        return self.kv

    @property
    def length(self) -> int:
        return int(self.kv[0][0].shape[-2])


class FakeModel:
    """Writes, for each row, keys and values made of its input token (per layer) into the
    cache, as a decoder's forward does, and records what it was given."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> Any:
        self.seen.append(kwargs)
        ids = kwargs["input_ids"].to(torch.float32)  # [B, 1]
        cache = kwargs["cache"]
        for layer in range(LAYERS):
            new = (ids + layer).view(-1, 1, 1, 1).expand(-1, HEADS, 1, DIM)
            cache.layers[layer].update(new, -new)
        return SimpleNamespace(logits=torch.zeros(ids.shape[0], 1, 5))


def step(batch: Batch[Row], model: FakeModel, rows: list[Row], token: int) -> None:
    """One decode of ``batch``, and what each row's cache should become."""
    batch.step(model, [token + i for i in range(len(batch.rows))])
    for i, row in enumerate(batch.rows):
        new = torch.full((1, HEADS, 1, DIM), float(token + i))
        row.kv = [
            (torch.cat([k, new + layer], 2), torch.cat([v, -(new + layer)], 2))
            for layer, (k, v) in enumerate(row.kv)
        ]
    assert sorted(r.name for r in batch.rows) == sorted(r.name for r in rows)


def check(batch: Batch[Row], model: FakeModel) -> None:
    """Each row's view equals its cache; the last forward had each row's own position and
    a mask hiding exactly its padding."""
    for i, row in enumerate(batch.rows):
        for (k, v), (want_k, want_v) in zip(batch.row(i), row.kv, strict=True):
            assert torch.equal(k, want_k) and torch.equal(v, want_v)
    seen = model.seen[-1]
    lengths = [row.length for row in batch.rows]
    assert seen["position_ids"].view(-1).tolist() == [n - 1 for n in lengths]
    longest = max(lengths)
    if len(set(lengths)) == 1:
        assert seen["attention_mask"] is None
    else:
        assert seen["attention_mask"].tolist() == [[0] * (longest - n) + [1] * n for n in lengths]


def test_rows_join_leave_and_grow_with_their_own_caches() -> None:
    torch.manual_seed(0)
    model = FakeModel()
    a, b, c = Row("a", 5), Row("b", 9), Row("c", 1)
    rows = [a, b, c]
    batch = new_batch(rows, Row.cache, None)
    assert batch.pads == [4, 0, 8]
    for token in range(3):
        step(batch, model, rows, 10 * token)
        check(batch, model)
    # b (the longest) leaves and d joins: the kept rows move left in one copy
    d = Row("d", 6)
    rows = [c, a, d]
    batch = new_batch(rows, Row.cache, batch)
    assert [r.name for r in batch.rows] == ["a", "c", "d"]  # kept rows first, in their order
    assert batch.pads == [0, 4, 2]
    step(batch, model, rows, 100)
    check(batch, model)
    # a longer row joins: the kept rows move right
    e = Row("e", 20)
    rows = [a, c, d, e]
    batch = new_batch(rows, Row.cache, batch)
    assert batch.pads == [11, 15, 13, 0]
    # the cache grows past its room (ROOM more steps) and keeps every row
    for token in range(ROOM + 5):
        step(batch, model, rows, 1000 + 10 * token)
    assert batch.capacity >= e.length
    check(batch, model)
    # a row's cache leaves as a view; the runtime clones it (owned) before keeping it
    assert batch.row(0)[0][0]._base is not None


def test_same_rows_in_any_order_continue_the_batch() -> None:
    a, b = Row("a", 3), Row("b", 3)
    batch = new_batch([a, b], Row.cache, None)
    assert batch.mask is None
    assert batch.same_rows([b, a])
    assert not batch.same_rows([a])
    assert not batch.same_rows([a, Row("c", 3)])
