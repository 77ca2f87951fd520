"""The key-value cache of a decoder: the keys and values it has already computed.

A causal language model generates one token at a time. Without a cache, every
step runs the whole sequence through the model again, although the keys and
values of the old positions cannot change (a causal mask keeps the past blind
to the future). A :class:`KVCache` stores them instead: each step projects
only the new token, appends its key and value to the cache of every layer, and
lets the new query attend to all of them, with chapter 5's bottom-right causal
alignment.

Layout: one :class:`LayerKVCache` per attention layer, holding ``key`` and
``value`` tensors of shape ``(B, H_kv, T, d_k)`` (``H_kv`` is the number of
key/value heads, equal to the number of heads in plain multi-head attention).

Explained in chapter 9, *Attention that writes*.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _nbytes(t: Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


class LayerKVCache:
    """The cached keys and values of one attention layer.

    :class:`~attention_lib.MultiHeadAttention` calls :meth:`update` with the
    keys and values of the new positions and attends to what it returns.

    Explained in chapter 9, *Attention that writes*.

    Attributes:
        key: ``(B, H_kv, T, d_k)`` cached keys, or ``None`` while empty.
        value: ``(B, H_kv, T, d_k)`` cached values, or ``None`` while empty.
    """

    def __init__(self) -> None:
        self.key: Tensor | None = None
        self.value: Tensor | None = None

    def __len__(self) -> int:
        """The number of positions ``T`` stored."""
        return 0 if self.key is None else self.key.shape[-2]

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached keys and values."""
        return _nbytes(self.key) + _nbytes(self.value)

    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new positions and return all keys and values so far.

        No checks: the model that owns the cache validated its input once.

        Args:
            key: ``(B, H_kv, L_new, d_k)`` keys of the new positions.
            value: ``(B, H_kv, L_new, d_k)`` values of the new positions.

        Returns:
            ``(key, value)``, each ``(B, H_kv, T + L_new, d_k)``: the cached
            positions first, then the new ones.
        """
        if self.key is None or self.value is None:
            self.key, self.value = key, value
        else:
            self.key = torch.cat([self.key, key], dim=-2)  # (B, H_kv, T + L_new, d_k)
            self.value = torch.cat([self.value, value], dim=-2)
        return self.key, self.value


class KVCache:
    """The keys and values of every layer of a decoder, in the order of the tokens.

    It starts empty. Passing it to :class:`~attention_lib.CausalLM` (``model(tokens,
    cache=cache)``) appends the keys and values of ``tokens`` to every layer; the
    next call only has to process the tokens that follow.

    Explained in chapter 9, *Attention that writes*.

    Attributes:
        layers: one :class:`LayerKVCache` per attention layer (created on first use).

    Example:
        >>> cache = KVCache()
        >>> len(cache), cache.nbytes
        (0, 0)
    """

    def __init__(self) -> None:
        self.layers: list[LayerKVCache] = []

    def layer(self, index: int) -> LayerKVCache:
        """The cache of layer ``index`` (created empty the first time it is asked for)."""
        while len(self.layers) <= index:
            self.layers.append(LayerKVCache())
        return self.layers[index]

    def __len__(self) -> int:
        """The number of tokens stored (the same in every layer)."""
        return len(self.layers[0]) if self.layers else 0

    @property
    def nbytes(self) -> int:
        """Bytes of the stored keys and values of all layers:
        ``2 * layers * B * H_kv * T * d_k * itemsize``."""
        return sum(layer.nbytes for layer in self.layers)

    def __repr__(self) -> str:
        return f"KVCache(layers={len(self.layers)}, tokens={len(self)}, nbytes={self.nbytes})"
