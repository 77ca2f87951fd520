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

and one without softmax, ``"linear"``: a
:class:`~attention_lib.gated_deltanet.GatedDeltaNet` (Qwen3-Next's linear
layer) whose cache is a fixed-size
:class:`~attention_lib.gated_deltanet.LayerStateCache` (chapter 16).

A new kind of layer is one more entry (:func:`register_layer_type`), not a new
branch in the model.

Explained in chapter 14, *Long contexts*.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from torch import nn

from .gated_deltanet import GatedDeltaNet, LayerStateCache
from .kv_cache import ChunkKVCache, LayerKVCache
from .mha import MultiHeadAttention


class LayerType(NamedTuple):
    """What a layer type builds: its token mixer and its per-layer cache.

    Explained in chapter 14, *Long contexts*.

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


def _linear(
    d_model: int, num_heads: int, *, dropout: float, window=None, chunk_size=None, **attention
):
    """Gated DeltaNet (chapter 16): no positions, no backend; it computes nothing else."""
    given = {name for name, value in attention.items() if value is not None}
    given -= {"backend", "rope_base", "rope_scaling", "num_kv_heads"}  # attention's only
    if dropout or given:
        raise ValueError(f"a 'linear' layer takes no dropout and none of {sorted(given)}")
    return GatedDeltaNet(d_model, num_heads)


#: The layer types of ``CausalLM(layer_types=...)``, by name.
LAYER_TYPES: dict[str, LayerType] = {
    "full": LayerType(_attention(), lambda mixer: LayerKVCache()),
    "sliding": LayerType(_attention("window"), lambda mixer: LayerKVCache(window=mixer.window)),
    "chunked": LayerType(_attention("chunk_size"), lambda mixer: ChunkKVCache(mixer.chunk_size)),
    "linear": LayerType(_linear, lambda mixer: LayerStateCache()),  # chapter 16
}


def register_layer_type(
    name: str, make_mixer: Callable[..., nn.Module], make_cache: Callable[[nn.Module], Any]
) -> None:
    """Add a layer type to :data:`LAYER_TYPES` (or replace one of the same name).

    Explained in chapter 14, *Long contexts*.

    Args:
        name: the name used in ``layer_types``.
        make_mixer: builds the layer's token mixer (see :class:`LayerType`).
        make_cache: makes its empty per-layer cache from the mixer.
    """
    LAYER_TYPES[name] = LayerType(make_mixer, make_cache)
