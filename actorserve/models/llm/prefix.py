"""The prefix cache of the ``transformers`` runtime: keys and values of token blocks that
recent requests read, so a request that starts with the same tokens (a client resending
its whole conversation) reads only what is new (docs/llm.md#prefix-reuse).

A block is :data:`BLOCK` tokens at a block boundary, found by its chain: the block before
it and its own tokens (as vLLM's prefix cache hashes a block with its parent's hash), so a
block is reused only after exactly the same tokens. Keys are compared whole (a dict of
``(parent, tokens)``), never by a hash alone, so a collision cannot hand a request
another text's cache. The first block's parent is the ``root`` the caller names (the
owner of the request when sequences are bound to tokens: one client's requests never
reuse, nor time, another's prefix).

Blocks are kept least recently used first. A lookup and an insert touch a chain from its
deepest block up, so a block is always at least as recent as its descendants and the
least recently used blocks are leaves: eviction never leaves a block unreachable.
No locking here: the runtime holds its budget lock around every call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from .forward import KV

#: tokens per block
BLOCK = 16

Key = tuple[Any, tuple[int, ...]]


class Block:
    """One block: its key, its number (the parent of the next block), its keys and
    values per layer ([1, heads, BLOCK, dim], tensors of its own) and their bytes."""

    __slots__ = ("children", "key", "kv", "nbytes", "number")

    def __init__(self, key: Key, number: int, kv: KV) -> None:
        self.key = key
        self.number = number
        self.kv = kv
        self.nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        self.children = 0


class PrefixCache:
    """Blocks of token ids and their KV, least recently used first; ``nbytes`` in all."""

    __slots__ = ("_blocks", "_next", "_numbered", "nbytes")

    def __init__(self) -> None:
        self._blocks: OrderedDict[Key, Block] = OrderedDict()
        self._numbered: dict[int, Block] = {}
        self._next = 1
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def _chain(self, root: Any, ids: Sequence[int], limit: int) -> list[Block]:
        chain: list[Block] = []
        parent: Any = ("root", root)
        for start in range(0, limit - BLOCK + 1, BLOCK):
            block = self._blocks.get((parent, tuple(ids[start : start + BLOCK])))
            if block is None:
                break
            chain.append(block)
            parent = block.number
        return chain

    def _touch(self, chain: list[Block]) -> None:
        for block in reversed(chain):  # the deepest first: a parent stays more recent
            self._blocks.move_to_end(block.key)

    def match(self, root: Any, ids: Sequence[int], limit: int) -> list[Block]:
        """The longest chain of cached blocks that ``ids`` begins with, within its first
        ``limit`` tokens (touched: now the most recently used)."""
        chain = self._chain(root, ids, limit)
        self._touch(chain)
        return chain

    def add(self, root: Any, ids: Sequence[int], kv: KV, room: int) -> int:
        """Keep the blocks of ``ids`` (whose keys and values are ``kv``, views are fine:
        each block is copied) that are not cached yet, while the cache fits in ``room``
        bytes (least recently used blocks are dropped for them, never those of this
        chain). The number of blocks added."""
        length = min(len(ids), int(kv[0][0].shape[-2])) if kv else 0
        chain = self._chain(root, ids, length)
        added = 0
        parent: Any = chain[-1].number if chain else ("root", root)
        keep = {block.key for block in chain}
        size = sum(2 * BLOCK * k.shape[1] * k.shape[3] * k.element_size() for k, _ in kv) if kv else 0
        for start in range(len(chain) * BLOCK, length - BLOCK + 1, BLOCK):
            end = start + BLOCK
            over = self.nbytes + size - room
            if over > 0 and self.drop(over, keep) < over:
                break
            key: Key = (parent, tuple(ids[start:end]))
            copy = [(k[:, :, start:end].clone(), v[:, :, start:end].clone()) for k, v in kv]
            block = Block(key, self._next, copy)
            self._next += 1
            if chain:
                chain[-1].children += 1
            self._blocks[key] = block
            self._numbered[block.number] = block
            self.nbytes += block.nbytes
            chain.append(block)
            keep.add(key)
            parent = block.number
            added += 1
        self._touch(chain)
        return added

    def drop(self, nbytes: int, keep: set[Key] | None = None) -> int:
        """Drop least recently used blocks (leaves only, none in ``keep``) until
        ``nbytes`` are freed or none is left to drop; the bytes freed."""
        freed = 0
        while freed < nbytes:
            victim = next(
                (b for b in self._blocks.values() if not b.children and (keep is None or b.key not in keep)),
                None,
            )
            if victim is None:
                break
            del self._blocks[victim.key]
            del self._numbered[victim.number]
            self.nbytes -= victim.nbytes
            freed += victim.nbytes
            parent = self._numbered.get(victim.key[0]) if isinstance(victim.key[0], int) else None
            if parent is not None:
                parent.children -= 1
        return freed


def joined(chain: list[Block], capacity: int) -> KV:
    """The keys and values of ``chain`` as one cache of their own, in buffers of
    ``capacity`` positions (the prefill after it writes in place: :func:`.forward.with_room`)."""
    out: KV = []
    for layer in range(len(chain[0].kv)):
        pair = []
        for which in (0, 1):
            first = chain[0].kv[layer][which]
            buffer = first.new_empty((1, first.shape[1], max(capacity, len(chain) * BLOCK), first.shape[3]))
            for i, block in enumerate(chain):
                buffer[:, :, i * BLOCK : (i + 1) * BLOCK] = block.kv[layer][which]
            pair.append(buffer[:, :, : len(chain) * BLOCK])
        out.append((pair[0], pair[1]))
    return out
