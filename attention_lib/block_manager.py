"""The block manager of a paged cache: block tables, reference counts, prefix hashes.

A paged cache (:class:`~attention_lib.PagedKVCache`, chapter 12) stores every
sequence's per-token entries in fixed-size **blocks** of ``block_size``
tokens from one pool; token ``p`` of a sequence lives in block
``table[p // block_size]`` at slot ``p % block_size``. Everything about
*which* block holds what is bookkeeping without a tensor, and is this module:
the free list, each sequence's block table and length, reference counts
(blocks shared by :meth:`BlockManager.fork` or a cached prefix), copy on write
of a shared, partly filled last block, blocks released once no query reads
them (they fell out of a sliding window), and **prefix caching**: every full
block is published under a hash of (its parent block's hash, its tokens), so
that a later sequence with the same prefix finds it (vLLM, nano-vllm). An
unheld published block stays findable until the pool reuses it, least
recently released first.

A subclass owns the tensors and says how to copy a block
(:meth:`BlockManager._copy_block`).

Explained in chapter 12, *Serving attention*.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

import torch
from torch import Tensor

from .validation import check_int


class BlockManager:
    """Block tables over a pool of ``num_blocks`` blocks of ``block_size`` tokens.

    Explained in chapter 12, *Serving attention*.

    Attributes:
        ref_count: ``(num_blocks,)`` how many sequences hold each block (0: free).
        tables: the block table (a list of block ids, ``-1`` for a released
            block) of every sequence, by id.
        lengths: the number of tokens of every sequence, by id.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = check_int("num_blocks", num_blocks, minimum=1)
        self.block_size = check_int("block_size", block_size, minimum=1)
        self.ref_count = torch.zeros(num_blocks, dtype=torch.long)
        self.free: list[int] = list(range(num_blocks))  # block ids, the next one first
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self._next_id = 0
        # prefix caching: the hash of every full block published, and back
        self.block_hash: dict[int, int] = {}
        self.cached: dict[int, int] = {}
        self._block_tokens: dict[int, tuple[int, ...]] = {}
        self._hashes: dict[int, list[int]] = {}  # each sequence's chain of full-block hashes

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    def new_sequence(self) -> int:
        """Start an empty sequence (no blocks yet) and return its id."""
        seq, self._next_id = self._next_id, self._next_id + 1
        self.tables[seq], self.lengths[seq], self._hashes[seq] = [], 0, []
        return seq

    def _check_seqs(self, seqs: Sequence[int]) -> None:
        """``seqs`` are distinct ids of sequences this cache holds."""
        if any(s not in self.tables for s in seqs) or len(set(seqs)) != len(seqs):
            raise ValueError(f"expected distinct sequence ids of {sorted(self.tables)}: {seqs}")

    def fork(self, parent: int) -> int:
        """A new sequence that shares every block of ``parent`` (prefix sharing):
        their reference counts go up, nothing is copied."""
        self._check_seqs([parent])
        seq = self.new_sequence()
        self.tables[seq], self.lengths[seq] = list(self.tables[parent]), self.lengths[parent]
        self._hashes[seq] = list(self._hashes[parent])
        self.ref_count[[b for b in self.tables[seq] if b >= 0]] += 1
        return seq

    def free_sequence(self, seq: int) -> None:
        """Forget ``seq``; blocks that no other sequence holds return to the pool."""
        self._check_seqs([seq])
        for block in self.tables.pop(seq):
            if block >= 0:  # -1: a block already released (out of a sliding window)
                self._release(block)
        del self.lengths[seq], self._hashes[seq]

    def crop(self, seq: int, n: int) -> None:
        """Forget the last ``n`` tokens of ``seq`` (speculative decoding rejects
        drafted tokens, chapter 13): blocks left empty return to the pool, and
        a published block that becomes partly filled is unpublished (its
        slots will be written again).

        Raises:
            ValueError: if ``seq`` is unknown or ``n`` is not in
                ``[0, length]``, or a block the crop keeps was released.
        """
        self._check_seqs([seq])
        length = self.lengths[seq]
        if not 0 <= check_int("n", n, minimum=0) <= length:
            raise ValueError(f"cannot crop {n} tokens: sequence {seq} holds {length}")
        table, kept = self.tables[seq], length - n
        blocks = -(-kept // self.block_size)  # blocks that still hold a token
        if -1 in table[blocks - 1 : blocks] and n:
            raise ValueError(f"cannot crop {n} tokens: the block of token {kept - 1} was released")
        for block in table[blocks:]:
            if block >= 0:
                self._release(block)
        del table[blocks:], self._hashes[seq][kept // self.block_size :]
        last = table[-1] if table and kept % self.block_size else -1
        if last >= 0 and self.ref_count[last] == 1 and last in self.block_hash:
            del self.cached[self.block_hash.pop(last)], self._block_tokens[last]
        self.lengths[seq] = kept

    def _release(self, block: int) -> None:
        """One holder fewer; an unheld block goes to the end of the free list
        (a published one stays findable until it is reused: LRU eviction)."""
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self.free.append(block)

    def release_before(self, seq: int, position: int) -> int:
        """Give back the blocks of ``seq`` whose tokens all lie before
        ``position`` (no query will read them again: they fell out of every
        layer's sliding window or chunk); their table entries become ``-1``.
        Returns how many blocks were released."""
        self._check_seqs([seq])
        table, released = self.tables[seq], 0
        for i in range(min(position // self.block_size, len(table))):
            if table[i] >= 0:
                self._release(table[i])
                table[i], released = -1, released + 1
        return released

    def slots(self, seq: int) -> Tensor:
        """``(length,)`` flat slot ``block * block_size + offset`` of each token of ``seq``."""
        table = torch.tensor(self.tables[seq], dtype=torch.long)
        positions = torch.arange(self.lengths[seq])
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def nbytes_of(self, seq: int) -> int:
        """Bytes of the blocks ``seq`` holds (``block_nbytes``: the subclass's)."""
        return sum(b >= 0 for b in self.tables[seq]) * self.block_nbytes

    # --- prefix caching: full blocks found by a hash of (parent hash, tokens)

    def _chain(self, tokens: Sequence[int], parent: int | None = None) -> list[int]:
        """The hash of every full block of ``tokens``, each chained to the one before."""
        out, size = [], self.block_size
        for start in range(0, len(tokens) - size + 1, size):
            parent = _block_hash(parent, tokens[start : start + size])
            out.append(parent)
        return out

    def match_prefix(self, tokens: Sequence[int]) -> list[int]:
        """The published blocks that hold the longest prefix of ``tokens`` made
        of full blocks (the chain of hashes stops at the first miss; the
        tokens are compared too, so a hash collision cannot mix prompts)."""
        blocks, size = [], self.block_size
        for i, h in enumerate(self._chain(tokens)):
            block = self.cached.get(h)
            if block is None or self._block_tokens[block] != tuple(
                tokens[i * size : (i + 1) * size]
            ):
                break
            blocks.append(block)
        return blocks

    def share_prefix(self, seq: int, blocks: Sequence[int]) -> None:
        """Start the empty sequence ``seq`` with the published ``blocks``
        (from :meth:`match_prefix`): their reference counts go up; an unheld
        one leaves the free list (it is no longer evictable)."""
        self._check_seqs([seq])
        if self.lengths[seq]:
            raise ValueError(f"sequence {seq} is not empty: it holds {self.lengths[seq]} tokens")
        for block in blocks:
            if self.ref_count[block] == 0:
                self.free.remove(block)
            self.ref_count[block] += 1
        self.tables[seq] = list(blocks)
        self.lengths[seq] = len(blocks) * self.block_size
        self._hashes[seq] = [self.block_hash[b] for b in blocks]

    def publish(self, seq: int, tokens: Sequence[int]) -> None:
        """Publish the full blocks of ``seq`` not published yet (``tokens``:
        its tokens so far, whose entries the blocks hold), so later sequences
        with the same prefix find them."""
        hashes, table = self._hashes[seq], self.tables[seq]
        full = min(len(tokens), self.lengths[seq]) // self.block_size
        if full <= len(hashes):
            return
        start = len(hashes) * self.block_size
        new = self._chain(tokens[start : full * self.block_size], hashes[-1] if hashes else None)
        for i, h in enumerate(new, start=len(hashes)):
            hashes.append(h)
            block = table[i]
            if h in self.cached or block < 0 or block in self.block_hash:
                continue  # the same content is published already (keep the first)
            self.cached[h], self.block_hash[block] = block, h
            self._block_tokens[block] = tuple(
                tokens[i * self.block_size : (i + 1) * self.block_size]
            )

    # --- room for new tokens

    def blocks_needed(self, seq: int, num_new: int) -> int:
        """Free blocks that appending ``num_new`` tokens to ``seq`` would take
        (new blocks, and a private copy of a shared, partly filled last block)."""
        length, table = self.lengths[seq], self.tables[seq]
        new = -(-(length + num_new) // self.block_size) - len(table)
        partial = length % self.block_size and num_new > 0
        copy = 1 if partial and self.ref_count[table[-1]] > 1 else 0
        return new + copy

    def can_extend(self, seqs: Sequence[int], num_new: int) -> bool:
        """Whether the pool has the blocks to append ``num_new`` tokens to every one of ``seqs``."""
        self._check_seqs(seqs)
        return sum(self.blocks_needed(s, num_new) for s in seqs) <= len(self.free)

    def _allocate(self) -> int:
        if not self.free:
            raise RuntimeError(f"out of blocks: all {self.num_blocks} are in use")
        block = self.free.pop(0)  # the least recently released
        self.ref_count[block] = 1
        if block in self.block_hash:  # evict its published content
            del self.cached[self.block_hash.pop(block)], self._block_tokens[block]
        return block

    def _copy_block(self, old: int, new: int) -> None:
        """Copy the entries of block ``old`` into block ``new`` (the subclass's tensors)."""
        raise NotImplementedError

    def reserve(self, seq: int, num_new: int) -> None:
        """Blocks for ``num_new`` more tokens of ``seq``, copying a shared
        partial block first (no checks: ask :meth:`blocks_needed`)."""
        table, length = self.tables[seq], self.lengths[seq]
        if length % self.block_size and num_new > 0 and self.ref_count[table[-1]] > 1:
            old, new = table[-1], self._allocate()  # copy on write
            self._copy_block(old, new)
            self.ref_count[old] -= 1
            table[-1] = new
        while len(table) * self.block_size < length + num_new:
            table.append(self._allocate())
        self.lengths[seq] = length + num_new


def _block_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """A 64-bit hash of (the parent block's hash, the block's tokens), the same
    in every process and on every machine (BLAKE2b; nano-vllm uses xxHash)."""
    data = array("q", [-1 if parent is None else parent % 2**63, *tokens]).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
