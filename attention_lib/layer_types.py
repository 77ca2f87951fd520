"""Layer types: what each layer of a model mixes its tokens with, and what it caches.

Long-context models stop giving every layer the same view of the context.
Gemma 2 alternates sliding-window ("local") and full ("global") layers, Gemma 3
has five local layers per global one, Llama 4 attends within chunks in three
layers of four, and hybrid models replace some attention layers by a linear
recurrence. :class:`~attention_lib.CausalLM` takes one name per layer,
``layer_types=["sliding", "full", ...]``, and this table says what each name
means:

* ``make_mixer(d_model, num_heads, *, dropout, window, chunk_size, **options)``
  builds the layer's token-mixing module (the "self-attention" sublayer of its
  :class:`~attention_lib.EncoderLayer`), called as a self-attention:
  ``mixer(x, x, x, mask, is_causal=..., need_weights=..., kv_cache=...,
  positions=...)``;
* ``make_cache(mixer)`` makes the per-layer cache that
  :class:`~attention_lib.KVCache` keeps for it: only what the layer can see.

The attention types of this package, all :class:`~attention_lib.MultiHeadAttention`:

* ``"full"``: causal attention over every earlier token; the cache keeps every
  key and value;
* ``"sliding"``: attention over the last ``window`` tokens; the cache keeps
  the last ``window`` (a rolling :class:`~attention_lib.LayerKVCache`);
* ``"chunked"``: attention within chunks of ``chunk_size`` tokens; the cache
  keeps the current chunk only (:class:`~attention_lib.ChunkKVCache`);

and three without softmax (chapter 18), whose cache is a fixed-size
:class:`~attention_lib.gated_deltanet.LayerStateCache`: ``"linear"``, a
:class:`~attention_lib.gated_deltanet.GatedDeltaNet` (Qwen3-Next's linear
layer); ``"kda"``, a :class:`~attention_lib.kda.KimiDeltaAttention` (Kimi
Linear's, a per-channel decay); ``"mamba2"``, a
:class:`~attention_lib.mamba2.Mamba2` (options ``head_dim``,
``state_size``, ``groups``).

and two latent ones (chapter 17): ``"mla"``, a
:class:`~attention_lib.MultiHeadLatentAttention` (DeepSeek-V3's MLA, with
``absorb`` as an option), and ``"dsa"``, the same with DeepSeek-V3.2's
lightning indexer (``index_topk`` required); both cache a
:class:`~attention_lib.LatentKVCache`. Their sizes are options of the layer
(``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
``v_head_dim``, ``q_lora_rank``, ``index_heads``, ``index_head_dim``), by
default derived from ``d_k = d_model // num_heads``.

**Per-layer options as values.** A layer of a model is a :class:`LayerSpec`,
a small frozen value: the name of its type and its own options, e.g.
``LayerSpec("sliding", window=512, sink=True)`` or ``LayerSpec("full",
rope_base=None)`` (a NoPE layer). ``CausalLM(layer_types=[...])`` takes names
or specs; a name is a spec without options, and a spec's options override the
model-wide ones.

**Extending the table.** ``CausalLM(..., layer_table={**LAYER_TYPES,
"mine": LayerType(make_mixer, make_cache)})`` uses a table of its own: nothing
global changes. :data:`LAYER_TYPES` is the default table, and also a
registry: :func:`register_layer_type` adds a name to it for every later model
of the process, :func:`unregister_layer_type` removes it again.

Every mixer the table builds follows the mixer protocol of
:mod:`attention_lib.protocols` (``mix``, ``make_cache``), and every cache the
cache protocol.

Explained in chapter 16, *Long contexts*.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from torch import nn

from .gated_deltanet import GatedDeltaNet, LayerStateCache
from .kda import KimiDeltaAttention
from .kv_cache import ChunkKVCache, LayerKVCache
from .mamba2 import Mamba2
from .mha import MultiHeadAttention
from .mla import LatentKVCache, MultiHeadLatentAttention
from .validation import check_choice, check_instance


class LayerType(NamedTuple):
    """What a layer type builds: its token mixer and its per-layer cache.

    Explained in chapter 16, *Long contexts*.

    Attributes:
        make_mixer: builds the layer's token mixer, an ``nn.Module``, from
            ``d_model``, ``num_heads`` and the keywords ``dropout``,
            ``window``, ``chunk_size`` and the attention options; the module
            is called as a self-attention (see :mod:`attention_lib.layer_types`).
        make_cache: ``(mixer) -> cache``, an empty per-layer cache with
            ``update`` (or what the mixer needs), ``position`` (tokens seen),
            ``nbytes`` and ``len()`` (positions stored).
    """

    make_mixer: Callable[..., nn.Module]
    make_cache: Callable[[nn.Module], Any]


def _attention(extent: str | None = None) -> Callable[..., nn.Module]:
    """The ``make_mixer`` of an attention type: a :class:`MultiHeadAttention` that
    takes ``window`` (a sliding layer), ``chunk_size`` (a chunked one) or neither
    (a full one) of the model's options; it ignores the other."""

    def make_mixer(
        d_model: int, num_heads: int, *, dropout: float, window=None, chunk_size=None, **attention
    ) -> nn.Module:
        spans = {"window": window, "chunk_size": chunk_size}
        if extent is not None:
            attention[extent] = spans[extent]
        return MultiHeadAttention(d_model, num_heads, dropout, **attention)

    return make_mixer


def _recurrent(cls: type[nn.Module], *own: str) -> Callable[..., nn.Module]:
    """The ``make_mixer`` of a layer with a fixed-size state (chapter 18):
    no positions, no backend; it takes only its own options ``own``."""

    def make_mixer(
        d_model: int, num_heads: int, *, dropout: float, window=None, chunk_size=None, **options
    ) -> nn.Module:
        given = {name for name, value in options.items() if value is not None} - set(own)
        given -= {"backend", "rope_base", "rope_scaling", "num_kv_heads"}  # attention's only
        if dropout or given:
            raise ValueError(f"a recurrent layer takes no dropout and none of {sorted(given)}")
        mine = {name: value for name, value in options.items() if name in own and value is not None}
        return cls(d_model, num_heads, **mine)

    return make_mixer


#: Model-wide options a latent layer does not use (MultiHeadAttention's only).
_NOT_LATENT = {"backend", "rope_scaling", "num_kv_heads", "window", "chunk_size"}


def _latent(sparse: bool) -> Callable[..., nn.Module]:
    """The ``make_mixer`` of ``"mla"`` (``sparse=False``) or ``"dsa"``."""

    def make_mixer(
        d_model: int,
        num_heads: int,
        *,
        dropout: float,
        rope_base: float | None = None,
        kv_lora_rank: int | None = None,
        qk_nope_head_dim: int | None = None,
        qk_rope_head_dim: int | None = None,
        v_head_dim: int | None = None,
        index_topk: int | None = None,
        index_head_dim: int | None = None,
        **options: Any,
    ) -> nn.Module:
        name = "dsa" if sparse else "mla"
        own = {"q_lora_rank", "absorb", "index_heads", "scale", "bias", "device", "dtype"}
        given = {k for k, v in options.items() if v not in (None, False)} - _NOT_LATENT - own
        if dropout or given:
            raise ValueError(f"an {name!r} layer takes no dropout and none of {sorted(given)}")
        if sparse != (index_topk is not None):
            raise ValueError(f"index_topk is for 'dsa' layers (required there), got {index_topk}")
        d_k = d_model // num_heads
        rope = qk_rope_head_dim or max(2, d_k // 2 // 2 * 2)  # even
        latent = {k: v for k, v in options.items() if k in own}
        if sparse:
            latent |= {"index_topk": index_topk, "index_head_dim": index_head_dim or 2 * rope}
        return MultiHeadLatentAttention(
            d_model,
            num_heads,
            kv_lora_rank=kv_lora_rank or 2 * d_k,
            qk_nope_head_dim=qk_nope_head_dim or d_k,
            qk_rope_head_dim=rope,
            v_head_dim=v_head_dim or d_k,
            rope_base=10000.0 if rope_base is None else rope_base,
            **latent,
        )

    return make_mixer


#: The layer types of ``CausalLM(layer_types=...)``, by name (the default table).
LAYER_TYPES: dict[str, LayerType] = {
    "full": LayerType(_attention(), lambda mixer: LayerKVCache()),
    "sliding": LayerType(_attention("window"), lambda mixer: LayerKVCache(keep_last=mixer.window)),
    "chunked": LayerType(_attention("chunk_size"), lambda mixer: ChunkKVCache(mixer.chunk_size)),
    "linear": LayerType(_recurrent(GatedDeltaNet), lambda mixer: LayerStateCache()),  # ch. 18
    "kda": LayerType(_recurrent(KimiDeltaAttention, "head_dim"), lambda m: LayerStateCache()),
    "mamba2": LayerType(
        _recurrent(Mamba2, "head_dim", "state_size", "groups"), lambda m: LayerStateCache()
    ),
    "mla": LayerType(_latent(False), lambda mixer: LatentKVCache()),  # chapter 17
    "dsa": LayerType(_latent(True), lambda mixer: LatentKVCache()),
}


@dataclass(frozen=True, init=False)
class LayerSpec:
    """One layer of a model as a value: its layer type and its own options.

    ``LayerSpec("sliding", window=512, sink=True)``; ``LayerSpec("full",
    rope_base=None)`` is a NoPE layer; ``LayerSpec("dsa", index_topk=64)``.
    Frozen: a model keeps the specs it was built from (``model.layer_specs``).

    The per-layer values of chapter 16's layer types (not yet used by the
    chapter itself).

    Args:
        kind: a name of the model's layer table (default :data:`LAYER_TYPES`).
        **options: the layer's options, passed to its type's ``make_mixer``;
            they override the model-wide ones.

    Raises:
        TypeError: if ``kind`` is not a str.
    """

    kind: str
    options: tuple[tuple[str, Any], ...]

    def __init__(self, kind: str = "full", **options: Any) -> None:
        check_instance("kind", kind, str, "a layer type name (str)")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "options", tuple(sorted(options.items())))

    def __repr__(self) -> str:
        shown = "".join(f", {k}={v!r}" for k, v in self.options)
        return f"LayerSpec({self.kind!r}{shown})"

    def with_defaults(self, defaults: Mapping[str, Any]) -> LayerSpec:
        """This spec with ``defaults`` under its own options (its own win)."""
        return LayerSpec(self.kind, **{**defaults, **dict(self.options)})

    def build(
        self,
        d_model: int,
        num_heads: int,
        *,
        dropout: float = 0.0,
        table: Mapping[str, LayerType] | None = None,
    ) -> nn.Module:
        """The layer's token mixer: ``table[kind].make_mixer(d_model, num_heads,
        dropout=dropout, **options)``.

        Raises:
            ValueError: if ``kind`` is not in ``table``, or from ``make_mixer``.
        """
        table = LAYER_TYPES if table is None else table
        check_choice("layer type", self.kind, tuple(table))
        return table[self.kind].make_mixer(
            d_model, num_heads, dropout=dropout, **dict(self.options)
        )


def unregister_layer_type(name: str) -> None:
    """Remove ``name`` from :data:`LAYER_TYPES` (undo :func:`register_layer_type`).

    Raises:
        ValueError: if ``name`` is not in the table.
    """
    check_choice("name", name, tuple(LAYER_TYPES))
    del LAYER_TYPES[name]


def register_layer_type(
    name: str, make_mixer: Callable[..., nn.Module], make_cache: Callable[[nn.Module], Any]
) -> None:
    """Add a layer type to :data:`LAYER_TYPES` (or replace one of the same name), for
    every model built later in the process; :func:`unregister_layer_type` removes
    it. A model can also take a table of its own, ``CausalLM(...,
    layer_table=...)``, which changes nothing global.

    Explained in chapter 16, *Long contexts*.

    Args:
        name: the name used in ``layer_types``.
        make_mixer: builds the layer's token mixer (see :class:`LayerType`).
        make_cache: makes its empty per-layer cache from the mixer.
    """
    LAYER_TYPES[name] = LayerType(make_mixer, make_cache)
