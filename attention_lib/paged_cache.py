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

Explained in chapter 12, *Serving attention*.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .kv_cache import KVCache, LayerKVCache
from .paged_attention import DEFAULT_TILE, paged_attention_core
from .validation import check_int


class PagedKVCache:
    """A pool of ``num_blocks`` blocks of ``block_size`` tokens, for every layer,
    shared by the sequences it holds.

    Explained in chapter 12, *Serving attention*.

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
        # prefix caching: the hash of every full block published, and back
        self.block_hash: dict[int, int] = {}
        self.cached: dict[int, int] = {}
        self._block_tokens: dict[int, tuple[int, ...]] = {}
        self._hashes: dict[int, list[int]] = {}  # each sequence's chain of full-block hashes

    @classmethod
    def for_model(cls, model: torch.nn.Module, num_blocks: int, block_size: int) -> PagedKVCache:
        """The pool for a :class:`~attention_lib.CausalLM`: its layers, key/value
        heads, head width, dtype and device. Every layer must be softmax
        attention (:class:`~attention_lib.MultiHeadAttention`: full, sliding
        or chunked, with any of chapter 15's options) with the same heads.

        Raises:
            ValueError: naming the layer type of a layer whose cache is not
                blocks of keys and values (a ``"linear"`` layer's fixed-size
                state, an ``"mla"`` layer's latents), or layers of different
                key/value shapes.
        """
        from .mha import MultiHeadAttention  # the one mixer whose cache is blocks

        shapes = set()
        for i, layer in enumerate(model.blocks.layers):
            mixer = layer.self_attn
            if not isinstance(mixer, MultiHeadAttention):  # a model we cannot serve: ValueError
                kind = getattr(layer, "layer_type", None) or type(mixer).__name__
                what = f"layer {i} ({kind!r}, {type(mixer).__name__})"
                raise ValueError(f"{what}: the paged engine serves softmax attention only")  # noqa: TRY004
            shapes.add((mixer.num_kv_heads, mixer.d_k))
        if len(shapes) != 1:
            raise ValueError(f"the layers' (num_kv_heads, d_k) differ: {sorted(shapes)}")
        (kv_heads, d_k), weight = shapes.pop(), model.embedding.weight
        return cls(
            num_blocks,
            block_size,
            num_layers=model.num_layers,
            num_kv_heads=kv_heads,
            head_dim=d_k,
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
        its tokens so far, whose keys the blocks hold), so later sequences
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

    def pack(self, seqs: Sequence[int], counts: Sequence[int]) -> PagedPack:
        """Reserve room for ``counts[i]`` more tokens of ``seqs[i]`` and return
        the :class:`~attention_lib.PagedPack` of the step: every
        new token of every sequence in one row, read in place
        (``model(tokens, cache=pack, positions=pack.positions)`` with
        ``tokens`` the ``(1, sum(counts))`` new tokens, sequence after sequence).

        Raises:
            ValueError: if ``seqs`` are not distinct ids of this cache, or a count is ``< 1``.
            RuntimeError: if the pool runs out of blocks (ask :meth:`can_extend` first).
        """
        self._check_seqs(seqs)
        if len(counts) != len(seqs) or not all(isinstance(c, int) and c >= 1 for c in counts):
            raise ValueError(f"expected one count >= 1 per sequence of {list(seqs)}: {counts}")
        starts = [self.lengths[s] for s in seqs]
        for seq, count in zip(seqs, counts):
            self._reserve(seq, count)
        return PagedPack(self, list(seqs), starts, list(counts))

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

    Explained in chapter 12, *Serving attention*.

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

    Explained in chapter 12, *Serving attention*.
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

    @property
    def _rows(self) -> int:
        """The batch rows ``B`` of the keys written: one per sequence."""
        return len(self.batch.seqs)

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
        held = (self._rows, *pool.shape[-2:], pool.dtype, pool.device)
        if held != (given := (batch, kv_heads, d_k, dtype, device)):
            raise ValueError(
                f"{self._what} holds (B, H_kv, d_k, dtype, device) {held}, not {given}"
            )

    _what = "paged cache"  # what check_fits names

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


class PagedPack(KVCache):
    """One engine step on a :class:`~attention_lib.PagedKVCache`, as a model's
    cache: the new tokens of several sequences packed in one row, attention
    read in place.

    Made by :meth:`~attention_lib.PagedKVCache.pack` after room was reserved.
    The step's tokens run through the model as one row ``(1, N)``: ``count``
    tokens of the first sequence, then of the second, ... (a prefill chunk
    of one request and one decode token of another are alike), with
    :attr:`positions` giving each token's position in its own sequence; no
    padding is computed. Each attention layer writes the new keys and values
    into their slots and calls :func:`paged_attention` (through
    :meth:`PagedPackLayer.attend_in_place`): every sequence's queries read its
    own blocks, in place.

    Explained in chapter 12, *Serving attention*.

    Attributes:
        positions: ``(1, N)`` position of each new token in its sequence.
        last: ``(S,)`` index in the row of each sequence's last new token
            (whose logits give its next token).
        tables: ``(S, max_blocks)`` block tables, ``-1`` where there is no block.
        lengths: ``(S,)`` tokens of each sequence after the step.
    """

    def __init__(self, pool: Any, seqs: list[int], starts: list[int], counts: list[int]) -> None:
        super().__init__()
        self.pool, self.seqs = pool, seqs
        size = pool.block_size
        widest = max(len(pool.tables[s]) for s in seqs)
        self.tables = torch.tensor(
            [pool.tables[s] + [-1] * (widest - len(pool.tables[s])) for s in seqs]
        )  # (S, widest)
        start = torch.tensor(starts)
        count = torch.tensor(counts)
        self.lengths = start + count  # (S,)
        cols = torch.arange(max(counts))
        self.query_positions = torch.where(cols < count[:, None], start[:, None] + cols, -1)
        real = self.query_positions >= 0  # (S, Lmax)
        self.rows, self.cols = real.nonzero(as_tuple=True)  # (N,) each: the packed order
        positions = self.query_positions[real]  # (N,)
        self.positions = positions[None]  # (1, N)
        self.last = count.cumsum(0) - 1  # (S,)
        blocks = self.tables[self.rows, positions // size]  # (N,)
        self.write = blocks * size + positions % size  # (N,): the flat slot of each new token
        self.layers = []  # made on first use (see layer)

    def layer(self, index: int, make: object = None) -> PagedPackLayer:
        """The view of layer ``index`` on the pool (``make`` is ignored)."""
        while len(self.layers) <= index:
            self.layers.append(PagedPackLayer(self, len(self.layers)))
        return self.layers[index]

    def __len__(self) -> int:
        """``0``: the sequences of a packed step share no columns (each token's
        position is given)."""
        return 0

    @property
    def position(self) -> int:
        return 0

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks the step's sequences hold (shared blocks once)."""
        blocks = {b for s in self.seqs for b in self.pool.tables[s] if b >= 0}
        return len(blocks) * self.pool.block_nbytes


class PagedPackLayer(PagedLayer):
    """One layer of a :class:`PagedPack`; :class:`~attention_lib.MultiHeadAttention`
    calls :meth:`attend_in_place` instead of ``update`` and attending.

    Explained in chapter 12, *Serving attention*.
    """

    def __init__(self, pack: PagedPack, index: int) -> None:
        super().__init__(pack, index)

    def __len__(self) -> int:
        return 0

    @property
    def position(self) -> int:
        return 0

    _what, _rows = "paged pack", 1  # check_fits: the pack is one row of packed tokens

    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Refused: the pack is read in place, by :meth:`attend_in_place`.

        Raises:
            ValueError: always.
        """
        raise ValueError("a PagedPack is read in place: its mixer must call attend_in_place")

    def attend_in_place(
        self, q: Tensor, k: Tensor, v: Tensor, attention: Any, need_weights: bool = False
    ) -> Tensor:
        """Write the new keys and values ``(1, H_kv, N, d_k)`` into their slots
        and attend with the queries ``(1, H, N, d_k)`` through the block tables
        (:func:`paged_attention`, with ``attention``'s scale, window, chunk,
        soft-capping and sinks); returns ``(1, H, N, d_v)``.

        Raises:
            ValueError: with ``need_weights`` (the weights are never formed).
        """
        if need_weights:
            raise ValueError("paged attention in place forms no weights: need_weights=False")
        pack, pool = self.batch, self.batch.pool
        for store, new in ((pool.key, k), (pool.value, v)):
            flat = store[self.index].view(-1, *store.shape[-2:])  # (blocks * size, H_kv, d)
            flat[pack.write] = new[0].transpose(0, 1)  # (N, H_kv, d) into the slots
        queries = torch.zeros(
            len(pack.seqs),
            *pack.query_positions.shape[1:],
            *q.shape[1:2],
            q.shape[-1],
            dtype=q.dtype,
            device=q.device,
        )  # (S, Lmax, H, d_k) fmt: skip
        queries[pack.rows, pack.cols] = q[0].transpose(0, 1)  # (N, H, d_k)
        out = paged_attention_core(
            queries.transpose(1, 2),
            pool.key[self.index],
            pool.value[self.index],
            pack.tables,
            pack.query_positions,
            pack.lengths,
            scale=q.shape[-1] ** -0.5 if attention.scale is None else attention.scale,
            window=attention.window,
            chunk=attention.chunk_size,
            softcap=attention.softcap,
            sink=attention.sink,
            tile_blocks=max(1, DEFAULT_TILE // pool.block_size),
        )  # (S, H, Lmax, d_v) fmt: skip
        return out.transpose(1, 2)[pack.rows, pack.cols].transpose(0, 1)[None]  # (1, H, N, d_v)


def _block_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """A 64-bit hash of (the parent block's hash, the block's tokens), the same
    in every process and on every machine (BLAKE2b; nano-vllm uses xxHash)."""
    data = array("q", [-1 if parent is None else parent % 2**63, *tokens]).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
