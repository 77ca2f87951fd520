"""StreamingLLM's cache: sink tokens and a rolling window, at *cache* positions.

``KVCache(window=w, sink_tokens=s)`` keeps the first ``s`` tokens and the
last ``w``, and its keys stay rotated (RoPE) at the positions the tokens had in
the text. Past the training length that breaks a model twice: the queries'
positions grow without bound, and the sinks drift ever further from every
query. StreamingLLM (Xiao et al., 2024) gives positions *within the cache*
instead: the ``s`` sinks sit at ``0 .. s - 1`` and the window right after them,
so no query is ever further than ``s + w`` from a key, however long the
stream. When the window slides by ``n`` tokens, every key it keeps moves ``n``
places to the left; RoPE being a rotation, its cached key is rotated back by
``n`` positions (no recomputation). The new tokens' positions are
:meth:`StreamingKVCache.positions`, to pass to the model.

The result equals recomputing the kept tokens' keys at the positions
``0, 1, ...`` for a layer whose keys depend on the token alone (the first
layer); a deeper layer's keys were computed when their token still saw its
whole past, as in StreamingLLM.

Explained in chapter 15, *Where attention goes*.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .kv_cache import KVCache, LayerKVCache
from .rope import apply_rope
from .validation import check_base, check_int


class _ReindexedLayerKVCache(LayerKVCache):
    """One layer of :class:`StreamingKVCache`: a rolling cache with sinks whose
    keys are re-rotated when the window slides, so that they always sit at
    their place in the cache.

    Args:
        keep_last: the window ``w``: the last ``w`` tokens are kept.
        sink_tokens: the ``s`` first tokens, kept for ever.
        rope_base: the RoPE base of the model's layers (rotate-half layout,
            every coordinate rotated, as ``MultiHeadAttention(rope_base=...)``).

    Attributes:
        key: ``(B, H_kv, T, d_k)`` keys, the one at index ``i`` rotated at
            position ``i``; ``None`` while empty.
        value: ``(B, H_kv, T, d_k)`` values.
    """

    def __init__(self, keep_last: int, sink_tokens: int, *, rope_base: float) -> None:
        super().__init__(keep_last, sink_tokens)
        self.rope_base = rope_base

    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new keys (rotated at positions ``len(self), ...``) and
        values, return all of them, then keep the sinks and the last
        ``keep_last`` and rotate the kept window back by the number dropped.

        Shapes: ``key``, ``value`` ``(B, H_kv, L_new, d_k)``; returns
        ``(B, H_kv, T + L_new, d_k)`` each, as :meth:`LayerKVCache.update`.
        """
        dropped = self.dropped
        key, value = super().update(key, value)
        shift = self.dropped - dropped
        if shift and self.key is not None:
            sinks = self.sink_tokens or 0
            window = self.key[..., sinks:, :]  # (B, H_kv, keep_last, d_k)
            back = torch.full((window.shape[-2],), -shift, device=window.device)  # (w,)
            window = apply_rope(window, back, base=self.rope_base)  # n places to the left
            self.key = torch.cat([self.key[..., :sinks, :], window], dim=-2)
        return key, value


class StreamingKVCache(KVCache):
    """StreamingLLM's cache for a RoPE model without a window: the first
    ``sink_tokens`` tokens and the last ``keep_last``, every key at its place
    in the cache (see the module's docstring). Call the model with
    ``positions=cache.positions(L)``.

    Explained in chapter 15, *Where attention goes*.

    Args:
        keep_last: the window ``w`` (``>= 1``).
        sink_tokens: the sinks ``s`` (``>= 0``).
        rope_base: the RoPE base of the model's layers.

    Raises:
        TypeError: if a size is not an int or ``rope_base`` not a number.
        ValueError: if ``keep_last < 1``, ``sink_tokens < 0`` or ``rope_base <= 1``.

    Example:
        >>> cache = StreamingKVCache(keep_last=4, sink_tokens=1, rope_base=10000.0)
        >>> cache.positions(3)
        tensor([0, 1, 2])
    """

    def __init__(self, keep_last: int, sink_tokens: int, *, rope_base: float) -> None:
        keep_last = check_int("keep_last", keep_last, minimum=1)
        sink_tokens = check_int("sink_tokens", sink_tokens, minimum=0)
        super().__init__(keep_last, sink_tokens)
        self.rope_base = check_base(rope_base)

    def layer(self, index: int, make: Any = None) -> Any:
        """The cache of layer ``index``: a rolling
        :class:`~attention_lib.LayerKVCache` with sinks that re-rotates its
        keys, created empty the first time (``make`` is not used: every layer
        of the model keeps the same kind). A building block: no checks."""
        while len(self.layers) <= index:
            self.layers.append(
                _ReindexedLayerKVCache(
                    self.keep_last or 1, self.sink_tokens or 0, rope_base=self.rope_base
                )
            )
        return self.layers[index]

    def positions(self, length: int) -> Tensor:
        """The positions of the next ``length`` tokens: their places in the
        cache, ``len(self), ..., len(self) + length - 1`` (at most
        ``sink_tokens + keep_last + length - 1``, however long the stream).

        Raises:
            TypeError, ValueError: if ``length`` is not an int ``>= 1``.
        """
        length = check_int("length", length, minimum=1)
        return torch.arange(len(self), len(self) + length)  # (L,)
