"""The prefix cache of the ``transformers`` runtime without a model: blocks found by their
chain (the same tokens after the same blocks), under each root apart, least recently used
leaves dropped first, never more than the room given."""

from __future__ import annotations

import pytest
import torch

from actorserve.models.llm.forward import KV
from actorserve.models.llm.prefix import BLOCK, PrefixCache, joined

LAYERS, HEADS, DIM = 2, 2, 4
#: bytes of one block: keys and values of BLOCK positions in every layer, float32
BLOCK_BYTES = LAYERS * 2 * HEADS * BLOCK * DIM * 4


def cache_of(ids: list[int]) -> KV:
    """Keys and values that spell out the token ids (so a join can be checked)."""
    column = torch.tensor(ids, dtype=torch.float32).view(1, 1, -1, 1).expand(1, HEADS, -1, DIM)
    return [(column + layer, -(column + layer)) for layer in range(LAYERS)]


def test_a_chain_is_found_block_by_block_and_joined_in_order() -> None:
    cache = PrefixCache()
    ids = list(range(100, 150))  # 3 whole blocks and 2 tokens
    assert cache.add(None, ids, cache_of(ids), room=10**6) == 3
    assert len(cache) == 3 and cache.nbytes == 3 * BLOCK_BYTES
    # the same start and more: its whole blocks, within the limit asked
    longer = [*ids, 7, 8, 9]
    assert len(cache.match(None, longer, len(longer) - 1)) == 3
    assert len(cache.match(None, longer, 2 * BLOCK + 5)) == 2
    chain = cache.match(None, longer, len(longer))
    whole = joined(chain, 64)
    assert torch.equal(whole[1][0], cache_of(ids[: 3 * BLOCK])[1][0])
    assert whole[1][0]._base is not None and whole[1][0]._base.shape[-2] == 64  # room to read on
    # a token differing in the second block: only the first block matches
    other = [*ids[:20], 0, *ids[21:]]
    assert len(cache.match(None, other, len(other))) == 1
    # the same block after another first block is another block
    assert cache.match(None, [0, *ids[1:]], 50) == []
    # another root (another owner) sees nothing; adding the blocks again adds none
    assert cache.match("bob", ids, 50) == []
    assert cache.add(None, ids, cache_of(ids), room=10**6) == 0


def test_least_recently_used_leaves_go_first_within_the_room() -> None:
    cache = PrefixCache()
    a = list(range(0, 2 * BLOCK))
    b = list(range(1000, 1000 + 2 * BLOCK))
    cache.add(None, a, cache_of(a), room=10**6)
    cache.add(None, b, cache_of(b), room=10**6)
    cache.match(None, a, len(a))  # a is now the most recently used
    # room for 4 blocks: c's 2 blocks drop b's two (its leaf first, then its root)
    c = list(range(2000, 2000 + 2 * BLOCK))
    assert cache.add(None, c, cache_of(c), room=4 * BLOCK_BYTES) == 2
    assert len(cache.match(None, a, len(a))) == 2 and len(cache.match(None, c, len(c))) == 2
    assert cache.match(None, b, len(b)) == []
    assert cache.nbytes == 4 * BLOCK_BYTES
    # room for 3 blocks: d's new block drops c's two, never a's (d's own chain)
    d = [*a, *range(3000, 3000 + BLOCK)]
    assert cache.add(None, d, cache_of(d), room=3 * BLOCK_BYTES) == 1
    assert len(cache.match(None, d, len(d))) == 3 and cache.match(None, c, len(c)) == []
    # no room past the chain itself: nothing is added, nothing of the chain dropped
    e = [*d, *range(4000, 4000 + BLOCK)]
    assert cache.add(None, e, cache_of(e), room=3 * BLOCK_BYTES) == 0
    assert len(cache.match(None, e, len(e))) == 3
    # drop takes leaves only: d's chain goes from its end
    assert cache.drop(BLOCK_BYTES) == BLOCK_BYTES
    assert len(cache.match(None, d, len(d))) == 2
    assert cache.drop(10**9) == 2 * BLOCK_BYTES
    assert len(cache) == 0 and cache.nbytes == 0


@pytest.mark.parametrize("length", [0, BLOCK - 1])
def test_less_than_a_block_is_never_cached(length: int) -> None:
    cache = PrefixCache()
    ids = list(range(length))
    assert cache.add(None, ids, cache_of(ids) if ids else [], room=10**6) == 0
    assert len(cache) == 0
