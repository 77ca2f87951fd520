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
That bookkeeping is the :class:`~attention_lib.block_manager.BlockManager`;
this module adds the tensors of keys and values and the ways to read them.

Attention reads the keys of a batch of sequences through their block tables
(:meth:`PagedKVCache.extend` returns a :class:`PagedBatch`, which
:class:`~attention_lib.CausalLM` accepts as a cache): the keys of every
sequence are gathered right-aligned, i.e. left-padded, with the padding mask
and positions of a ragged batch.

Explained in chapter 12, *Serving attention*.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .block_manager import BlockManager
from .kv_cache import KVCache, LayerKVCache
from .paged_attention import DEFAULT_TILE, paged_attention_core, walk_plan
from .validation import check_int


class PagedKVCache(BlockManager):
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
        super().__init__(num_blocks, block_size)
        sizes = {"num_layers": num_layers, "num_kv_heads": num_kv_heads, "head_dim": head_dim}
        for name, n in sizes.items():
            check_int(name, n, minimum=1)
        self.num_layers = num_layers
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.key = torch.zeros(shape, dtype=dtype, device=device)
        self.value = torch.zeros(shape, dtype=dtype, device=device)

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
    def block_nbytes(self) -> int:
        """Bytes of the keys and values of one block in every layer."""
        return 2 * self.key[:, 0].numel() * self.key.element_size()

    def _copy_block(self, old: int, new: int) -> None:
        self.key[:, new], self.value[:, new] = self.key[:, old], self.value[:, old]

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
            self.reserve(seq, num_new)
        return PagedBatch(self, list(seqs), old, num_new)

    def pack(self, seqs: Sequence[int], counts: Sequence[int]) -> PagedPack:
        """Reserve room for ``counts[i]`` more tokens of ``seqs[i]`` and return
        the :class:`~attention_lib.PagedPack` of the step: one row of new
        tokens per sequence, read in place
        (``model(tokens, cache=pack, positions=pack.positions)`` with
        ``tokens`` ``(S, max(counts))``, row ``i`` holding the ``counts[i]``
        new tokens of ``seqs[i]`` then any padding).

        Raises:
            ValueError: if ``seqs`` are not distinct ids of this cache, or a count is ``< 1``.
            RuntimeError: if the pool runs out of blocks (ask :meth:`can_extend` first).
        """
        self._check_seqs(seqs)
        if len(counts) != len(seqs) or not all(isinstance(c, int) and c >= 1 for c in counts):
            raise ValueError(f"expected one count >= 1 per sequence of {list(seqs)}: {counts}")
        starts = [self.lengths[s] for s in seqs]
        for seq, count in zip(seqs, counts):
            self.reserve(seq, count)
        return PagedPack(self, list(seqs), starts, list(counts))

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
        view = self._view or PagedLayer  # the view of one layer
        self.layers = [view(self, i) for i in range(pool.num_layers)]

    _view: type | None = None  # PagedLayer unless a subclass says

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
    cache: a row of new tokens per sequence, attention read in place.

    Made by :meth:`~attention_lib.PagedKVCache.pack` after room was reserved.
    Row ``i`` holds the ``counts[i]`` new tokens of sequence ``i`` (a prefill
    chunk, or one decode token), then padding up to the longest row;
    :attr:`positions` gives each token's position in its own sequence. Each
    attention layer writes the new keys and values into their slots and calls
    :func:`paged_attention` (through :meth:`PagedPackLayer.attend_in_place`):
    every sequence's queries read its own blocks, in place; a padding query
    reads nothing and writes nothing.

    Explained in chapter 12, *Serving attention*.

    Attributes:
        positions: ``(S, L)`` position of each new token in its sequence
            (``0`` on padding).
        query_positions: ``(S, L)`` the same, ``-1`` on padding.
        last: ``(S,)`` column of each sequence's last new token (whose
            logits give its next token).
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
        start, count = torch.tensor(starts), torch.tensor(counts)
        self.lengths = start + count  # (S,)
        cols = torch.arange(max(counts))
        self.query_positions = torch.where(cols < count[:, None], start[:, None] + cols, -1)
        self.positions = self.query_positions.clamp(min=0)  # (S, L)
        self.last = count - 1  # (S,)
        real = self.query_positions >= 0  # (S, L)
        self.rows, self.cols = real.nonzero(as_tuple=True)  # (N,) each
        positions = self.query_positions[real]  # (N,)
        blocks = self.tables[self.rows, positions // size]  # (N,)
        self.write = blocks * size + positions % size  # (N,): the flat slot of each new token
        self.layers = []  # made on first use (see layer)
        self.plans: dict = {}  # the walk of the layers' paged attention, made once

    def layer(self, index: int, make: object = None) -> PagedPackLayer:
        """The view of layer ``index`` on the pool (``make`` is ignored)."""
        while len(self.layers) <= index:
            self.layers.append(PagedPackLayer(self, len(self.layers)))
        return self.layers[index]

    def __len__(self) -> int:
        """``0``: the sequences of a step share no columns (each token's
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

    def __len__(self) -> int:
        return 0

    @property
    def position(self) -> int:
        return 0

    _what = "paged pack"  # what check_fits names

    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Refused: the pack is read in place, by :meth:`attend_in_place`.

        Raises:
            ValueError: always.
        """
        raise ValueError("a PagedPack is read in place: its mixer must call attend_in_place")

    def attend_in_place(
        self, q: Tensor, k: Tensor, v: Tensor, attention: Any, need_weights: bool = False
    ) -> Tensor:
        """Write the new keys and values ``(S, H_kv, L, d_k)`` into their slots
        and attend with the queries ``(S, H, L, d_k)`` through the block tables
        (:func:`paged_attention`, with ``attention``'s scale, window, chunk,
        soft-capping and sinks); returns ``(S, H, L, d_v)`` (zero on padding).

        Raises:
            ValueError: with ``need_weights`` (the weights are never formed).
        """
        if need_weights:
            raise ValueError("paged attention in place forms no weights: need_weights=False")
        pack, pool = self.batch, self.batch.pool
        for store, new in ((pool.key, k), (pool.value, v)):
            flat = store[self.index].view(-1, *store.shape[-2:])  # (blocks * size, H_kv, d)
            flat[pack.write] = new.transpose(1, 2)[pack.rows, pack.cols]  # (N, H_kv, d)
        tile_blocks, group = max(1, DEFAULT_TILE // pool.block_size), q.shape[1] // k.shape[1]
        key = (attention.window, attention.chunk_size, group)
        if key not in pack.plans:  # once per step for the layers that share it
            pack.plans[key] = walk_plan(pack.tables, pack.query_positions, pack.lengths,
                                        block_size=pool.block_size, group=group,
                                        window=key[0], chunk=key[1], tile_blocks=tile_blocks)  # fmt: skip
        return paged_attention_core(
            q,
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
            tile_blocks=tile_blocks,
            plan=pack.plans[key],
        )  # (S, H, L, d_v)
