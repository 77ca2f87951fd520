"""The serving engine's cache for every layer type: groups of layers, each paged its own way.

A model whose layers keep different things cannot keep them in one pool of
key/value blocks. vLLM's hybrid allocator groups the layers by what they
keep, and so does :class:`ServingCache`: one **group** per kind of layer
cache, each with its own block tables.

* softmax attention (:class:`~attention_lib.MultiHeadAttention`), one group
  per (key/value heads, width, window, chunk): a
  :class:`~attention_lib.PagedKVCache`, read in place. A sliding (or chunked)
  group gives back the blocks that fell out of every query's window (or
  chunk), while the full layers' group keeps all of them;
* latent attention (:class:`~attention_lib.MultiHeadLatentAttention`, MLA and
  DSA): a :class:`PagedLatentCache`, blocks of latents and RoPE keys (the
  layer's :class:`~attention_lib.LatentKVCache`, paged), gathered for the
  layer;
* recurrent layers (Gated DeltaNet, Kimi Delta Attention, Mamba-2):
  :class:`StateSlots`, one fixed-size state slot per running sequence (its
  recurrent state and short-convolution inputs).

Every group answers the same questions (``new_sequence``,
``free_sequence``, ``blocks_needed``, ``blocks_for``, ``num_free_blocks``,
``release_before``, ``pack``, ``nbytes_of``), and each ``pack`` gives each of
its layers a view that follows the cache protocol of
:mod:`attention_lib.protocols` as the layer's own cache does: the layers do
not know they are served. A new kind of layer is one more entry in
:data:`PAGED_GROUPS`.

A step runs the sequences that each add the same number of tokens as one
``(S, L)`` batch (:meth:`ServingCache.step`): a recurrent state cannot
skip padding, so nothing is padded.

Explained in chapter 12, *Serving attention*.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .block_manager import BlockManager
from .gated_deltanet import GatedDeltaNet, LayerStateCache
from .kda import KimiDeltaAttention
from .kv_cache import KVCache
from .mamba2 import Mamba2
from .mha import MultiHeadAttention
from .mla import LatentKVCache, MultiHeadLatentAttention
from .paged_cache import PagedBatch, PagedKVCache


class PagedLatentCache(BlockManager):
    """Blocks of MLA latents: per token and layer, the latent ``c``, the RoPE
    key and (DSA) the indexer's key, in a pool of blocks.

    Explained in chapter 12, *Serving attention*.

    Attributes:
        fields: ``(latent, rope_key[, index_key])``, each
            ``(num_layers, num_blocks, block_size, width)``.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        num_layers: int,
        widths: Sequence[int],
        dtype: torch.dtype,
        device: torch.device | None = None,
    ) -> None:
        super().__init__(num_blocks, block_size)
        self.num_layers = num_layers
        self.fields = [
            torch.zeros(num_layers, num_blocks, block_size, w, dtype=dtype, device=device)
            for w in widths
        ]

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block in every layer."""
        return sum(f[:, 0].numel() * f.element_size() for f in self.fields)

    def _copy_block(self, old: int, new: int) -> None:
        for f in self.fields:
            f[:, new] = f[:, old]

    def pack(self, seqs: Sequence[int], counts: Sequence[int]) -> PagedBatch:
        """Reserve ``counts[0]`` more tokens in each of ``seqs`` (equal counts)
        and return the step's :class:`~attention_lib.PagedBatch` of
        :class:`PagedLatentLayer` views (left-padded, with ``mask``)."""
        if len(set(counts)) != 1:
            raise ValueError(f"latent blocks are gathered: one count for every sequence, {counts}")
        old = [self.lengths[s] for s in seqs]
        for seq in seqs:
            self.reserve(seq, counts[0])
        return _LatentBatch(self, list(seqs), old, counts[0])


class PagedLatentLayer(LatentKVCache):
    """One layer's view of a :class:`PagedLatentCache` for one step: the
    :class:`~attention_lib.LatentKVCache` protocol on blocks.

    Explained in chapter 12, *Serving attention*.
    """

    def __init__(self, batch: PagedBatch, index: int) -> None:
        super().__init__()
        self.batch, self.index, self.added = batch, index, 0

    def __len__(self) -> int:
        """The batch's ``T`` columns before the new tokens (then ``T + L``)."""
        return self.batch.past + self.added

    def update(
        self, latent: Tensor, rope_key: Tensor, index_key: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Write the new ``(S, L, width)`` entries into their slots and return
        every entry of the batch, ``(S, T + L, width)``, left-padded."""
        out = []
        for store, new in zip(self.batch.pool.fields, (latent, rope_key, index_key)):
            flat = store[self.index].view(-1, store.shape[-1])  # (blocks * size, width)
            flat[self.batch.write] = new
            out.append(flat[self.batch.read])  # (S, T + L, width)
        self.added = self.batch.num_new
        return out[0], out[1], out[2] if len(out) > 2 else None


class _LatentBatch(PagedBatch):
    _view = PagedLatentLayer


class StateSlots:
    """One fixed-size slot per running sequence for recurrent layers: every
    tensor the layer's :class:`~attention_lib.gated_deltanet.LayerStateCache`
    keeps (its ``state``, the short convolution's last inputs ``conv``), per
    layer ``(num_slots, ...)``, made at the first write (its shape is the
    layer's own).

    Explained in chapter 12, *Serving attention*.
    """

    FIELDS = ("state", "conv")

    def __init__(self, num_slots: int, *, num_layers: int) -> None:
        self.num_blocks = num_slots
        self.stores: dict[str, list[Tensor | None]] = {f: [None] * num_layers for f in self.FIELDS}
        self.free = list(range(num_slots))
        self.slot: dict[int, int] = {}
        self.lengths: dict[int, int] = {}
        self._next_id = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def _held(self) -> list[Tensor]:
        return [t for layers in self.stores.values() for t in layers if t is not None]

    def new_sequence(self) -> int:
        """Give a new sequence a zeroed slot; returns its id."""
        seq, self._next_id = self._next_id, self._next_id + 1
        slot = self.free.pop(0)
        for store in self._held():
            store[slot] = 0
        self.slot[seq], self.lengths[seq] = slot, 0
        return seq

    def free_sequence(self, seq: int) -> None:
        self.free.append(self.slot.pop(seq))
        del self.lengths[seq]

    def blocks_needed(self, seq: int, num_new: int) -> int:
        """``0``: a running sequence's slot does not grow."""
        return 0

    def blocks_for(self, num_tokens: int) -> int:
        """``1``: a new sequence takes one slot, whatever its length."""
        return 1

    def release_before(self, seq: int, position: int) -> int:
        return 0

    def nbytes_of(self, seq: int) -> int:
        """Bytes of one slot in every layer of the group (once written)."""
        return sum(t[0].numel() * t.element_size() for t in self._held())

    def pack(self, seqs: Sequence[int], counts: Sequence[int]) -> _SlotPack:
        fresh = all(self.lengths[s] == 0 for s in seqs)
        for seq, count in zip(seqs, counts):
            self.lengths[seq] += count
        rows = torch.tensor([self.slot[s] for s in seqs])
        return _SlotPack(self, rows, fresh)


class _SlotPack:
    def __init__(self, slots: StateSlots, rows: Tensor, fresh: bool) -> None:
        self.slots, self.rows, self.fresh = slots, rows, fresh

    def layer(self, index: int) -> SlotState:
        return SlotState(self, index)


def _slot_field(name: str) -> property:
    """A field of :class:`SlotState`: read from and written to the slots."""

    def get(self: SlotState) -> Tensor | None:
        store = self._pack.slots.stores[name][self._index]
        if store is None or self._pack.fresh:
            return None  # as a new cache reads
        return store[self._pack.rows]  # (S, ...)

    def put(self: SlotState, value: Tensor | None) -> None:
        if value is None:
            return
        stores = self._pack.slots.stores[name]
        if stores[self._index] is None:  # the first write: the layer's shape
            slots = self._pack.slots.num_blocks
            stores[self._index] = value.new_zeros(slots, *value.shape[1:])
        stores[self._index][self._pack.rows] = value

    return property(get, put)


class SlotState(LayerStateCache):
    """One recurrent layer's view of :class:`StateSlots` for one step: the
    :class:`~attention_lib.gated_deltanet.LayerStateCache` protocol, its
    ``state`` and ``conv`` read from and written to the sequences' slots
    (``None`` when every sequence starts, as a new cache reads).

    Explained in chapter 12, *Serving attention*.
    """

    def __init__(self, pack: _SlotPack, index: int) -> None:
        self._pack, self._index, self.position = pack, index, 0

    state = _slot_field("state")
    conv = _slot_field("conv")


def _attention(mixers: list[MultiHeadAttention], blocks: int, size: int, weight: Tensor) -> Any:
    m = mixers[0]
    return PagedKVCache(blocks, size, num_layers=len(mixers), num_kv_heads=m.num_kv_heads,
                        head_dim=m.d_k, dtype=weight.dtype, device=weight.device)  # fmt: skip


def _latent(mixers: list[MultiHeadLatentAttention], blocks: int, size: int, weight: Tensor) -> Any:
    m = mixers[0]
    widths = [m.kv_lora_rank, m.qk_rope_head_dim] + ([m.indexer.head_dim] if m.indexer else [])
    return PagedLatentCache(blocks, size, num_layers=len(mixers), widths=widths,
                            dtype=weight.dtype, device=weight.device)  # fmt: skip


def _first_key(mixer: nn.Module) -> Callable[[int], int]:
    """The first key position a query at position ``p`` of this layer reads."""
    window, chunk = getattr(mixer, "window", None), getattr(mixer, "chunk_size", None)
    if window is not None:
        return lambda p: max(0, p - window + 1)
    if chunk is not None:
        return lambda p: p // chunk * chunk
    return lambda p: 0


#: How each kind of token mixer is served, as ``mixer type -> (key, make)``.
#: Layers of equal ``key(mixer)`` share a group, and ``make(mixers,
#: num_blocks, block_size, max_seqs, weight)`` makes it.
PAGED_GROUPS: dict[type, tuple[Callable, Callable]] = {
    MultiHeadAttention: (
        lambda m: ("attention", m.num_kv_heads, m.d_k, m.window, m.chunk_size),
        lambda ms, n, size, seqs, w: _attention(ms, n, size, w),
    ),
    MultiHeadLatentAttention: (
        lambda m: ("latent", m.kv_lora_rank, m.qk_rope_head_dim, m.indexer is not None),
        lambda ms, n, size, seqs, w: _latent(ms, n, size, w),
    ),
    **{
        recurrent: (
            lambda m: ("recurrent", type(m)),
            lambda ms, n, size, seqs, w: StateSlots(seqs, num_layers=len(ms)),
        )
        for recurrent in (GatedDeltaNet, KimiDeltaAttention, Mamba2)
    },
}


class ServingCache:
    """The caches of every layer of a :class:`~attention_lib.CausalLM` for the
    engine: one group per kind of layer cache (see the module).

    Explained in chapter 12, *Serving attention*.

    Args:
        model: the model.
        num_blocks: blocks of each block group.
        block_size: tokens per block.
        max_seqs: the most sequences at once (the linear layers' slots).

    Attributes:
        groups: the group caches, in the order of their first layer.
        names: each group's name: its first layer's type (``"full"``,
            ``"sliding"``, ``"linear"``, ``"mla"``, ...).
        where: for every layer, ``(group, index in the group)``.

    Raises:
        ValueError: naming a layer whose mixer cannot be served.
    """

    def __init__(self, model: nn.Module, num_blocks: int, block_size: int, max_seqs: int) -> None:
        keys: dict[tuple, list[int]] = {}
        mixers = [layer.self_attn for layer in model.blocks.layers]
        for i, (layer, mixer) in enumerate(zip(model.blocks.layers, mixers)):
            if type(mixer) not in PAGED_GROUPS:
                kind = getattr(layer, "layer_type", None) or type(mixer).__name__
                raise ValueError(f"layer {i} ({kind!r}, {type(mixer).__name__}) cannot be served")
            keys.setdefault(PAGED_GROUPS[type(mixer)][0](mixer), []).append(i)
        weight, self.groups, self.names, self.rules = model.embedding.weight, [], [], []
        self.where: list[tuple[int, int]] = [(0, 0)] * len(mixers)
        for g, layers in enumerate(keys.values()):
            first = mixers[layers[0]]
            make = PAGED_GROUPS[type(first)][1]
            group = make([mixers[i] for i in layers], num_blocks, block_size, max_seqs, weight)
            self.groups.append(group)
            self.names.append(getattr(model.blocks.layers[layers[0]], "layer_type", None)
                              or ("sliding" if first.window else "full"))  # fmt: skip
            self.rules.append(_first_key(first))
            for j, i in enumerate(layers):
                self.where[i] = (g, j)
        self.block_size, self.lengths = block_size, {}
        self.gathers = any(isinstance(g, PagedLatentCache) for g in self.groups)
        self._split = self.gathers and any(m.chunk_size for m in mixers
                                            if isinstance(m, MultiHeadAttention))  # fmt: skip

    @property
    def prefix_caching(self) -> bool:
        """Whether prefixes can be shared: every group holds blocks (a
        recurrent state at a block's end is not kept)."""
        return all(isinstance(g, BlockManager) for g in self.groups)

    def match_prefix(self, tokens: Sequence[int]) -> list[list[int]]:
        """Per group, the published blocks of the longest prefix of full
        blocks of ``tokens`` that every group still has."""
        hits = [g.match_prefix(tokens) for g in self.groups]
        shortest = min(len(h) for h in hits)
        return [h[:shortest] for h in hits]

    def share_prefix(self, seq: int, hits: list[list[int]]) -> int:
        """Start the empty ``seq`` with the blocks ``hits`` (from
        :meth:`match_prefix`) in every group; returns the tokens they hold."""
        for g, blocks in zip(self.groups, hits):
            g.share_prefix(seq, blocks)
        self.lengths[seq] = len(hits[0]) * self.block_size
        return self.lengths[seq]

    def publish(self, seq: int, tokens: Sequence[int]) -> None:
        """Publish the full blocks of ``seq`` in every group (see
        :meth:`~attention_lib.block_manager.BlockManager.publish`)."""
        for g in self.groups:
            g.publish(seq, tokens)

    @property
    def num_free_blocks(self) -> int:
        return sum(g.num_free_blocks for g in self.groups if isinstance(g, BlockManager))

    @property
    def num_used_blocks(self) -> int:
        return sum(g.num_used_blocks for g in self.groups if isinstance(g, BlockManager))

    def all_free(self) -> bool:
        """Whether no sequence is held: every block and slot free, no reference left."""
        blocks = all(int(g.ref_count.sum()) == 0 and not g.tables
                     for g in self.groups if isinstance(g, BlockManager))  # fmt: skip
        return (
            blocks
            and not self.lengths
            and self.free_counts() == [g.num_blocks for g in self.groups]
        )

    def free_counts(self) -> list[int]:
        return [g.num_free_blocks for g in self.groups]

    def new_sequence(self) -> int:
        ids = {g.new_sequence() for g in self.groups}
        (seq,) = ids  # the groups start and free sequences together: one id
        self.lengths[seq] = 0
        return seq

    def free_sequence(self, seq: int) -> None:
        for g in self.groups:
            g.free_sequence(seq)
        del self.lengths[seq]

    def blocks_needed(self, seq: int, num_new: int) -> list[int]:
        """Per group, the free blocks (or slots) ``num_new`` more tokens of ``seq`` take."""
        return [g.blocks_needed(seq, num_new) for g in self.groups]

    def blocks_for(self, num_tokens: int) -> list[int]:
        """Per group, what a new sequence of ``num_tokens`` tokens takes."""
        size = self.block_size
        return [
            g.blocks_for(num_tokens) if isinstance(g, StateSlots) else -(-num_tokens // size)
            for g in self.groups
        ]

    def release(self, seq: int, computed: int) -> None:
        """Give back the blocks of ``seq`` no later query of a group reads."""
        for g, rule in zip(self.groups, self.rules):
            if first := rule(computed):
                g.release_before(seq, first)

    def nbytes_of(self, seq: int) -> dict[str, int]:
        """Bytes ``seq`` holds in each group, by group name."""
        out: dict[str, int] = {}
        for name, g in zip(self.names, self.groups):
            out[name] = out.get(name, 0) + g.nbytes_of(seq)
        return out

    def pass_key(self, seq: int, count: int) -> tuple[int, int]:
        """The sequences whose ``(count, length)`` keys are equal run as one
        batch: ``length`` is ``-1`` (any) unless the latent layers' padding
        mask is refused (a model with chunked layers)."""
        return count, self.lengths[seq] if self._split else -1

    def step(self, seqs: Sequence[int], count: int) -> ServingStep:
        """Reserve ``count`` more tokens in every group for each of ``seqs`` and
        return the :class:`ServingStep` the model runs them with."""
        return ServingStep(self, list(seqs), count)


class ServingStep(KVCache):
    """One step of :class:`ServingCache`, as a model's cache: ``count`` new
    tokens for each of ``S`` sequences, tokens ``(S, count)``, run as
    ``model(tokens, cache=step, positions=step.positions, mask=step.mask)``;
    layer ``i`` gets its group's view.

    Explained in chapter 12, *Serving attention*.

    Attributes:
        positions: ``(S, count)`` the positions of the new tokens.
        mask: ``None``, or the ``(S, T + count)`` padding keep-mask of the
            gathered (latent) layers when the sequences' lengths differ.
    """

    def __init__(self, cache: ServingCache, seqs: list[int], count: int) -> None:
        super().__init__()
        starts = torch.tensor([cache.lengths[s] for s in seqs])
        for s in seqs:
            cache.lengths[s] += count
        self.positions = starts[:, None] + torch.arange(count)  # (S, count)
        self.passes = [g.pack(seqs, [count] * len(seqs)) for g in cache.groups]
        self.where, self.past, self.mask = cache.where, 0, None
        if cache.gathers:  # the latent layers' columns: T held before, left-padded
            self.past = int(starts.max())
            if int(starts.min()) != self.past:
                self.mask = self.past - starts[:, None] <= torch.arange(self.past + count)

    def layer(self, index: int, make: object = None) -> Any:
        group, local = self.where[index]
        return self.passes[group].layer(local)

    def __len__(self) -> int:
        return self.past

    @property
    def position(self) -> int:
        return self.past
