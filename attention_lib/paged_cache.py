"""A paged key-value cache: fixed-size blocks from one pool, a block table per sequence.

A contiguous :class:`~attention_lib.KVCache` gives every sequence one tensor
that grows (or, in a server, is preallocated to the longest length a request
may reach). A server holding many requests of different lengths then wastes
the memory between each sequence's length and that maximum. PagedAttention
(vLLM, Kwon et al. 2023) stores the cache as the operating system stores
memory: in **blocks** of ``block_size`` tokens from one preallocated pool.
Each sequence has a **block table**, the list of its blocks in order; token
``p`` of a sequence lives in block ``table[p // block_size]`` at slot
``p % block_size``. A sequence never holds more than one partly filled block,
so at most ``block_size - 1`` slots per sequence are wasted.

Blocks carry **reference counts**, so sequences can share them: :meth:`PagedKVCache.fork`
gives a new sequence the blocks of another (a common prompt is stored once).
A full shared block is never written again; before a sequence appends to a
shared, partly filled last block it gets its own copy (**copy on write**).

Attention reads the keys of a batch of sequences through their block tables
(:meth:`PagedKVCache.extend` returns a :class:`PagedBatch`, which
:class:`~attention_lib.CausalLM` accepts as a cache): the keys of every
sequence are gathered right-aligned, i.e. left-padded, with the padding mask
and positions of a ragged batch.

Explained in chapter 11, *Serving attention*.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .kv_cache import KVCache, LayerKVCache
from .validation import check_int


class PagedKVCache:
    """A pool of ``num_blocks`` blocks of ``block_size`` tokens, for every layer,
    shared by the sequences it holds.

    Explained in chapter 11, *Serving attention*.

    Args:
        num_blocks: blocks in the pool.
        block_size: tokens per block.
        num_layers: attention layers of the model (one pool per layer).
        num_kv_heads: key/value heads ``H_kv`` per layer.
        head_dim: width ``d_k`` of a head.
        dtype: dtype of the stored keys and values.
        device: device of the pool.

    Attributes:
        key: ``(num_layers, num_blocks, block_size, H_kv, d_k)`` stored keys.
        value: ``(num_layers, num_blocks, block_size, H_kv, d_k)`` stored values.
        ref_count: ``(num_blocks,)`` how many sequences hold each block (0: free).
        tables: the block table (a list of block ids) of every sequence, by id.
        lengths: the number of tokens of every sequence, by id.

    Example:
        >>> cache = PagedKVCache(8, 4, num_layers=1, num_kv_heads=1, head_dim=2)
        >>> seq = cache.new_sequence()
        >>> _ = cache.extend([seq], 6)  # room for 6 tokens: 2 blocks
        >>> cache.tables[seq], cache.num_free_blocks
        ([0, 1], 6)
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.num_blocks = check_int("num_blocks", num_blocks, minimum=1)
        self.block_size = check_int("block_size", block_size, minimum=1)
        sizes = {"num_layers": num_layers, "num_kv_heads": num_kv_heads, "head_dim": head_dim}
        for name, n in sizes.items():
            check_int(name, n, minimum=1)
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.key = torch.zeros(shape, dtype=dtype, device=device)
        self.value = torch.zeros(shape, dtype=dtype, device=device)
        self.ref_count = torch.zeros(num_blocks, dtype=torch.long)
        self.free: list[int] = list(range(num_blocks))  # block ids, the next one first
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self._next_id = 0

    @classmethod
    def for_model(cls, model: torch.nn.Module, num_blocks: int, block_size: int) -> PagedKVCache:
        """The pool for a :class:`~attention_lib.CausalLM`: its layers, key/value
        heads, head width, dtype and device.

        Raises:
            ValueError: for a model with ``layer_types`` (its sliding, chunked or
                linear layers keep caches of their own kinds, not blocks).
        """
        if getattr(model, "layer_types", None) is not None:
            raise ValueError(f"needs layers alike, got layer_types={model.layer_types}")
        attention = model.blocks.layers[0].self_attn
        weight = attention.W_k.weight
        return cls(
            num_blocks,
            block_size,
            num_layers=model.num_layers,
            num_kv_heads=attention.num_kv_heads,
            head_dim=attention.d_k,
            dtype=weight.dtype,
            device=weight.device,
        )

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    @property
    def block_nbytes(self) -> int:
        """Bytes of the keys and values of one block in every layer."""
        return 2 * self.key[:, 0].numel() * self.key.element_size()

    def new_sequence(self) -> int:
        """Start an empty sequence (no blocks yet) and return its id."""
        seq, self._next_id = self._next_id, self._next_id + 1
        self.tables[seq], self.lengths[seq] = [], 0
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
        self.ref_count[self.tables[seq]] += 1
        return seq

    def free_sequence(self, seq: int) -> None:
        """Forget ``seq``; blocks that no other sequence holds return to the pool."""
        self._check_seqs([seq])
        for block in self.tables.pop(seq):
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                self.free.append(block)
        del self.lengths[seq]

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
        block = self.free.pop(0)
        self.ref_count[block] = 1
        return block

    def _reserve(self, seq: int, num_new: int) -> None:
        """Blocks for ``num_new`` more tokens of ``seq``, copying a shared partial block."""
        table, length = self.tables[seq], self.lengths[seq]
        if length % self.block_size and num_new > 0 and self.ref_count[table[-1]] > 1:
            old, new = table[-1], self._allocate()  # copy on write
            self.key[:, new], self.value[:, new] = self.key[:, old], self.value[:, old]
            self.ref_count[old] -= 1
            table[-1] = new
        while len(table) * self.block_size < length + num_new:
            table.append(self._allocate())
        self.lengths[seq] = length + num_new

    def extend(self, seqs: Sequence[int], num_new: int) -> PagedBatch:
        """Reserve room for ``num_new`` more tokens in each of ``seqs`` and return
        the :class:`PagedBatch` through which a model writes their keys and values
        and reads all of them (``model(tokens, cache=batch, mask=batch.mask,
        positions=batch.positions)``).

        Raises:
            ValueError: if ``seqs`` are not distinct ids of this cache, or ``num_new < 1``.
            RuntimeError: if the pool runs out of blocks (ask :meth:`can_extend` first).
        """
        check_int("num_new", num_new, minimum=1)
        self._check_seqs(seqs)
        old = [self.lengths[s] for s in seqs]
        for seq in seqs:
            self._reserve(seq, num_new)
        return PagedBatch(self, list(seqs), old, num_new)

    def slots(self, seq: int) -> Tensor:
        """``(length,)`` flat slot ``block * block_size + offset`` of each token of ``seq``."""
        table = torch.tensor(self.tables[seq], dtype=torch.long)
        positions = torch.arange(self.lengths[seq])
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def gather(self, layer: int, seq: int) -> tuple[Tensor, Tensor]:
        """The keys and values of ``seq`` in ``layer``, read through its block
        table: two ``(H_kv, length, d_k)`` tensors, as a contiguous cache holds them."""
        slots = self.slots(seq)
        flat = [t[layer].flatten(0, 1)[slots] for t in (self.key, self.value)]  # (T, H_kv, d_k)
        return flat[0].transpose(0, 1), flat[1].transpose(0, 1)  # (H_kv, T, d_k)

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"sequences={len(self.tables)}, free={self.num_free_blocks})"
        )


class PagedBatch(KVCache):
    """A batch of sequences of a :class:`PagedKVCache`, as a model's cache.

    Made by :meth:`PagedKVCache.extend`, after room for ``num_new`` tokens
    per sequence was reserved. Each layer's
    :meth:`PagedLayer.update` writes the new keys and values into their slots,
    then returns every key and value of the batch gathered through the block
    tables, right-aligned in ``T + num_new`` columns (``T``: the longest
    sequence before the step), i.e. left-padded like a ragged batch; pass
    :attr:`mask` and :attr:`positions` to the model with it.

    Explained in chapter 11, *Serving attention*.

    Attributes:
        mask: ``(B, T + num_new)`` bool keep-mask, ``False`` on the padding.
        positions: ``(B, num_new)`` the positions of the new tokens in each sequence.
    """

    def __init__(self, pool: PagedKVCache, seqs: list[int], old: list[int], num_new: int) -> None:
        super().__init__()
        self.pool, self.seqs, self.num_new = pool, seqs, num_new
        self.past = max(old)  # T: the columns before the new tokens
        width = self.past + num_new
        old_t = torch.tensor(old)
        columns = torch.arange(width)
        start = self.past - old_t[:, None]  # (B, 1): the first real column of each row
        self.mask = columns >= start  # (B, T + L)
        self.positions = old_t[:, None] + torch.arange(num_new)  # (B, L)
        slots = torch.zeros(len(seqs), width, dtype=torch.long)  # (B, T + L); padding: slot 0
        for row, seq in enumerate(seqs):
            slots[row, width - pool.lengths[seq] :] = pool.slots(seq)
        self.read = slots  # (B, T + L)
        self.write = slots[:, self.past :]  # (B, L): where the new tokens go
        self.layers = [PagedLayer(self, i) for i in range(pool.key.shape[0])]

    def layer(self, index: int, make: object = None) -> PagedLayer:
        """The view of layer ``index`` (``make`` is ignored: the pool exists)."""
        return self.layers[index]

    def __len__(self) -> int:
        """``T``: the columns of keys before the new tokens (padding included)."""
        return self.past

    @property
    def position(self) -> int:
        return self.past

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks the batch's sequences hold (shared blocks once)."""
        blocks = {b for s in self.seqs for b in self.pool.tables[s]}
        return len(blocks) * self.pool.block_nbytes


class PagedLayer(LayerKVCache):
    """One layer of a :class:`PagedBatch`: the update protocol of
    :class:`~attention_lib.LayerKVCache` on the blocks of the pool.

    Explained in chapter 11, *Serving attention*.
    """

    def __init__(self, batch: PagedBatch, index: int) -> None:
        super().__init__()
        self.batch, self.index = batch, index
        self.added = 0  # the new tokens written by update (0 before it)

    def __len__(self) -> int:
        """Columns of keys held: the batch's ``T``, then ``T + num_new`` once written."""
        return self.batch.past + self.added

    @property
    def position(self) -> int:
        return self.batch.past + self.added

    @property
    def nbytes(self) -> int:
        """Bytes of this layer's share of the blocks the batch's sequences hold."""
        return self.batch.nbytes // self.batch.pool.key.shape[0]

    @property
    def numbers_per_token(self) -> int:
        """``2 * H_kv * d_k``: a key and a value per head."""
        return 2 * self.batch.pool.key.shape[-2] * self.batch.pool.key.shape[-1]

    def select(self, rows: Tensor) -> None:
        """Refused: a :class:`PagedBatch` is the view of one step; drop a
        sequence with :meth:`PagedKVCache.free_sequence` (the next step's
        batch leaves it out), copy one with :meth:`PagedKVCache.fork`.

        Raises:
            ValueError: always.
        """
        raise ValueError("a PagedBatch is one step's view: use PagedKVCache.free_sequence/fork")

    def crop(self, n: int) -> None:
        """Refused: a :class:`PagedBatch` is the view of one step (see :meth:`select`).

        Raises:
            ValueError: always.
        """
        raise ValueError("a PagedBatch is one step's view: crop a sequence in its PagedKVCache")

    def check_fits(
        self, batch: int, kv_heads: int, d_k: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        """Refuse keys that do not fit the pool (see :meth:`LayerKVCache.check_fits`)."""
        pool = self.batch.pool.key
        held = (len(self.batch.seqs), *pool.shape[-2:], pool.dtype, pool.device)
        if held != (given := (batch, kv_heads, d_k, dtype, device)):
            raise ValueError(f"paged cache holds (B, H_kv, d_k, dtype, device) {held}, not {given}")

    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``(B, H_kv, L, d_k)`` new keys and values into their slots and
        return the batch's keys and values, ``(B, H_kv, T + L, d_k)`` each."""
        out = []
        for pool, new in ((self.batch.pool.key, key), (self.batch.pool.value, value)):
            flat = pool[self.index].view(-1, *pool.shape[-2:])  # (blocks * size, H_kv, d_k)
            flat[self.batch.write] = new.transpose(1, 2)  # (B, L, H_kv, d_k) into the slots
            out.append(flat[self.batch.read].transpose(1, 2))  # (B, H_kv, T + L, d_k)
        self.added = self.batch.num_new
        return out[0], out[1]
