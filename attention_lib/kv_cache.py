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

A **rolling** cache (``KVCache(keep_last=w)``, chapter 10's ``KVCache(window=w)``
under its older name) keeps only the keys and values of the last ``w`` tokens,
so its size stops growing: a model with a sliding window of ``w`` never looks
further back. ``window`` names one thing in this package, what a query of
sliding-window attention sees (``MultiHeadAttention(window=...)``,
:func:`~attention_lib.causal_mask`); what a cache keeps is ``keep_last``.

Explained in chapter 9, *Attention that writes*.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .validation import check_int


def _nbytes(t: Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _check_rolling(keep_last: object, sink_tokens: object, window: object) -> tuple:
    """``(keep_last, sink_tokens)``: ``keep_last`` (or ``window``, its older name)
    ``None`` or an int ``>= 1``, ``sink_tokens`` ``None`` or an int ``>= 0`` with it."""
    name = "keep_last"
    if window is not None:  # the older name
        if keep_last is not None:
            raise ValueError(f"keep_last={keep_last}, window={window}: window is its older name")
        keep_last, name = window, "window (keep_last)"
    keep_last = None if keep_last is None else check_int(name, keep_last, minimum=1)
    if sink_tokens is not None and keep_last is None:
        raise ValueError("sink_tokens needs keep_last (or window, its older name)")
    sinks = None if sink_tokens is None else check_int("sink_tokens", sink_tokens, minimum=0)
    return keep_last, sinks


class Snapshots:
    """``snapshot()``, then ``crop`` back to it: how a cache that cannot simply
    forget its last tokens (a recurrent state, a rolling cache that has
    dropped some, a chunk that has moved on) still rolls back exactly.

    :meth:`snapshot` keeps references to what the cache holds (the caches
    replace their tensors, they never write into them, so nothing is
    copied); ``crop(n)`` with ``n`` the tokens seen since then restores it.
    Speculative decoding takes one before each verification (chapter 13).

    Explained in chapter 13, *Decoding faster*.
    """

    _FIELDS: tuple[str, ...] = ()
    _saved: tuple | None = None

    def snapshot(self) -> None:
        """Remember this point: a later ``crop`` of every token seen since
        comes back to it exactly (explained in chapter 13)."""
        self._saved = (self.position, tuple(getattr(self, f) for f in self._FIELDS))

    def _restore(self, n: int) -> bool:
        """Come back to the snapshot if it was taken ``n >= 1`` tokens ago."""
        if not n or self._saved is None or self._saved[0] != self.position - n:
            return False
        for name, held in zip(self._FIELDS, self._saved[1]):
            setattr(self, name, held)
        return True


class _Rolling:
    """What a cache that may roll answers: ``keep_last`` and its older name."""

    keep_last: int | None

    @property
    def window(self) -> int | None:
        """``keep_last`` under its older name (chapters 10 and 15 write
        ``KVCache(window=w)``): the tokens a rolling cache keeps, not the
        window of sliding-window attention (what a query sees)."""
        return self.keep_last


class LayerKVCache(Snapshots, _Rolling):
    """The cached keys and values of one attention layer.

    :class:`~attention_lib.MultiHeadAttention` calls :meth:`update` with the
    keys and values of the new positions and attends to what it returns.

    Explained in chapter 9, *Attention that writes*.

    Args:
        keep_last: keep only the last ``keep_last`` positions (a rolling cache
            for sliding-window attention, chapter 10); ``None`` keeps all. Not
            an attention window: a layer with a window of ``w`` (a query sees
            itself and ``w - 1`` keys before it) keeps ``keep_last=w``.
        sink_tokens: with ``keep_last``, also keep the first ``sink_tokens``
            positions for ever (StreamingLLM, chapter 15): the cache holds the
            sinks, then the last ``keep_last`` positions. ``None`` (default) for
            a plain rolling cache.
        window: the older name of ``keep_last`` (chapters 10 and 15 use it).

    Attributes:
        key: ``(B, H_kv, T, d_k)`` cached keys, or ``None`` while empty.
        value: ``(B, H_kv, T, d_k)`` cached values, or ``None`` while empty.
        keep_last: the positions a rolling cache keeps, or ``None``
            (``window`` is its older name).
        sink_tokens: the positions kept for ever, or ``None``.
        dropped: how many positions a rolling cache has dropped; without sinks
            the cached keys belong to positions ``dropped .. dropped + T - 1``.
    """

    def __init__(
        self,
        keep_last: int | None = None,
        sink_tokens: int | None = None,
        *,
        window: int | None = None,
    ) -> None:
        self.key: Tensor | None = None
        self.value: Tensor | None = None
        self.keep_last, self.sink_tokens = _check_rolling(keep_last, sink_tokens, window)
        self.dropped = 0

    _FIELDS = ("key", "value", "dropped")

    def __len__(self) -> int:
        """The number of positions ``T`` stored."""
        return 0 if self.key is None else self.key.shape[-2]

    @property
    def position(self) -> int:
        """The number of positions appended so far (kept or dropped): the
        position of the next token."""
        return self.dropped + len(self)

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached keys and values."""
        return _nbytes(self.key) + _nbytes(self.value)

    @property
    def numbers_per_token(self) -> int:
        """Numbers kept per token and sequence: ``2 * H_kv * d_k`` (a key and a
        value per head), ``0`` while empty."""
        return 0 if self.key is None else 2 * self.key.shape[1] * self.key.shape[-1]

    def select(self, rows: Tensor) -> None:
        """Keep the batch rows ``rows`` (a 1-D integer tensor), in that order:
        drop finished sequences or reorder beams (the cache protocol of
        :mod:`attention_lib.protocols`). A building block: no checks."""
        if self.key is not None and self.value is not None:
            self.key, self.value = self.key[rows], self.value[rows]
        self._saved = None  # another batch

    def crop(self, n: int) -> None:
        """Forget the last ``n`` tokens (speculative decoding rejects drafted
        tokens, chapter 13; the cache protocol of :mod:`attention_lib.protocols`).
        Back to a :meth:`snapshot` taken ``n`` tokens ago, it restores it.

        Raises:
            ValueError: if ``n`` is not in ``[0, len(self)]``, or the cache has
                dropped tokens (a rolling cache cannot get them back, and the
                tokens after the crop would need them) and holds no snapshot
                taken ``n`` tokens ago.
        """
        n = check_int("n", n, minimum=0)
        if self._restore(n):
            return
        if n > len(self) or (n and self.dropped):
            raise ValueError(f"cannot crop {n} of {len(self)} held tokens ({self.dropped} dropped)")
        if n and self.key is not None and self.value is not None:
            self.key, self.value = self.key[..., : len(self) - n, :], self.value[..., :-n, :]

    def check_fits(
        self, batch: int, kv_heads: int, d_k: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        """Refuse new keys ``(batch, kv_heads, L, d_k)`` of ``dtype`` on ``device`` that
        do not fit what the cache holds (a cache filled by another model or batch).

        Raises:
            ValueError: naming what the cache holds and what was given.
        """
        k = self.key  # nothing held yet: anything fits
        held = None if k is None else (*k.shape[:2], k.shape[-1], k.dtype, k.device)
        if held not in (None, (batch, kv_heads, d_k, dtype, device)):
            given = f"B={batch}, H_kv={kv_heads}, d_k={d_k}, {dtype} on {device}"
            raise ValueError(f"kv_cache holds (B, H_kv, d_k, dtype, device) = {held}, not {given}")

    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new positions and return all keys and values so far.

        No checks: the caller validated its input (see :meth:`check_fits`).

        Args:
            key: ``(B, H_kv, L_new, d_k)`` keys of the new positions.
            value: ``(B, H_kv, L_new, d_k)`` values of the new positions.

        Returns:
            ``(key, value)``, each ``(B, H_kv, T + L_new, d_k)``: the cached
            positions first, then the new ones. A rolling cache returns them
            all too (the first new queries may need older keys than the last
            ones), but keeps only the last ``keep_last``.
        """
        if self.key is not None and self.value is not None:
            key = torch.cat([self.key, key], dim=-2)  # (B, H_kv, T + L_new, d_k)
            value = torch.cat([self.value, value], dim=-2)
        self.key, self.value = key, value
        sinks = self.sink_tokens or 0
        if self.keep_last is not None and len(self) > sinks + self.keep_last:
            drop = len(self) - sinks - self.keep_last
            # cat/clone: a slice would keep the whole concatenation alive
            self.key, self.value = (
                torch.cat([t[..., :sinks, :], t[..., sinks + drop :, :]], dim=-2)
                for t in (key, value)
            )  # (B, H_kv, sinks + window, d_k)
            self.dropped += drop
        return key, value


class ChunkKVCache(LayerKVCache):
    """The cache of a chunked-attention layer (Llama 4's local layers): only the
    current chunk.

    A query of a chunked layer sees only the keys of its own chunk of
    ``chunk`` positions (``0 .. chunk - 1``, ``chunk .. 2 chunk - 1``, ...), so
    when a chunk is full its keys and values are dropped: the cache never holds
    more than ``chunk - 1`` positions, and the keys it holds always start a
    chunk (what :class:`~attention_lib.masks.Causal`'s ``chunk`` assumes).

    Explained in chapter 16, *Long contexts*.

    Args:
        chunk: the chunk length ``c >= 1``.

    Attributes:
        chunk: the chunk length.
        dropped: how many positions were dropped (a multiple of ``chunk``).
    """

    def __init__(self, chunk: int) -> None:
        super().__init__()
        self.chunk = check_int("chunk", chunk, minimum=1)

    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new positions, keep those of the chunk of the next position,
        and return all of them (see :meth:`LayerKVCache.update`)."""
        key, value = super().update(key, value)  # (B, H_kv, T + L_new, d_k)
        drop = self.position // self.chunk * self.chunk - self.dropped  # a whole chunk or more
        if drop:
            self.key, self.value = (t[..., drop:, :].clone() for t in (key, value))
            self.dropped += drop
        return key, value

    def crop(self, n: int) -> None:
        """Forget the last ``n`` tokens of the current chunk (the chunks before
        it are never read again), or come back to a :meth:`snapshot` taken
        ``n`` tokens ago (across a chunk boundary; chapter 13).

        Raises:
            ValueError: if ``n`` is not in ``[0, len(self)]`` and no snapshot
                was taken ``n`` tokens ago.
        """
        n = check_int("n", n, minimum=0)
        if self._restore(n):
            return
        if n > len(self):
            raise ValueError(f"cannot crop {n} tokens: the current chunk holds {len(self)}")
        if n and self.key is not None and self.value is not None:
            self.key, self.value = self.key[..., : len(self) - n, :], self.value[..., :-n, :]


class KVCache(_Rolling):
    """The keys and values of every layer of a decoder, in the order of the tokens.

    It starts empty. Passing it to :class:`~attention_lib.CausalLM` (``model(tokens,
    cache=cache)``) appends the keys and values of ``tokens`` to every layer; the
    next call only has to process the tokens that follow.

    Explained in chapter 9, *Attention that writes*; ``sink_tokens``
    (StreamingLLM) in chapter 15, *Where attention goes*.

    Args:
        keep_last: keep only the last ``keep_last`` tokens in every layer (a
            rolling cache for a model with a sliding window of that many
            tokens, chapter 10); ``None`` keeps all.
        sink_tokens: with ``keep_last``, also keep the first ``sink_tokens``
            tokens for ever (StreamingLLM, chapter 15); a model without a
            window then attends to the sinks and the last ``keep_last`` tokens.
        window: the older name of ``keep_last`` (chapters 10 and 15 write
            ``KVCache(window=w)``); not an attention window.

    A model whose layers see different spans (``CausalLM(layer_types=...)``,
    chapter 16) makes each layer's cache itself: a
    :class:`LayerKVCache` for a full layer, a rolling one for a sliding layer, a
    :class:`ChunkKVCache` for a chunked one (:mod:`attention_lib.layer_types`).

    Attributes:
        layers: one cache per layer (created on first use): a
            :class:`LayerKVCache` or another per-layer cache with ``position``,
            ``nbytes`` and ``len()``.
        keep_last: the tokens a rolling cache keeps, or ``None`` (``window``
            is its older name).

    Example:
        >>> cache = KVCache()
        >>> len(cache), cache.nbytes
        (0, 0)
    """

    def __init__(
        self,
        keep_last: int | None = None,
        sink_tokens: int | None = None,
        *,
        window: int | None = None,
    ) -> None:
        self.layers: list[Any] = []
        self.keep_last, self.sink_tokens = _check_rolling(keep_last, sink_tokens, window)

    def layer(self, index: int, make: Callable[[], Any] | None = None) -> Any:
        """The cache of layer ``index``, created empty the first time it is asked
        for: by ``make()`` if given (a model whose layers keep different caches,
        see :mod:`attention_lib.layer_types`), else a
        ``LayerKVCache(keep_last, sink_tokens)``. A building block: no checks."""
        while len(self.layers) < index:
            self.layers.append(LayerKVCache(self.keep_last, self.sink_tokens))
        if len(self.layers) == index:
            self.layers.append(
                LayerKVCache(self.keep_last, self.sink_tokens) if make is None else make()
            )
        return self.layers[index]

    def snapshot(self) -> None:
        """Take a :class:`~attention_lib.kv_cache.Snapshots` snapshot of every layer that takes one: a
        later :meth:`crop` of the tokens seen since comes back to it
        (chapter 13)."""
        for layer in self.layers:
            if isinstance(layer, Snapshots):
                layer.snapshot()

    def crop(self, n: int) -> None:
        """Forget the last ``n`` tokens in every layer (speculative decoding's
        rollback, chapter 13): afterwards the cache is as if it had never
        seen them. All layers or none: if one layer refuses, the others are
        left as they were.

        Raises:
            ValueError: if ``n < 0`` or a layer cannot (see each layer's ``crop``,
                and :meth:`snapshot`).
        """
        n = check_int("n", n, minimum=0)
        before = [dict(vars(layer)) for layer in self.layers]  # references, no copies
        try:
            for layer in self.layers:
                layer.crop(n)
        except ValueError:
            for layer, held in zip(self.layers, before):
                vars(layer).update(held)
            raise

    def __len__(self) -> int:
        """The number of tokens stored by the layer that stores the most (the same
        in every layer of a model whose layers are all alike)."""
        return max((len(layer) for layer in self.layers), default=0)

    @property
    def position(self) -> int:
        """The number of tokens seen so far (stored or, by a rolling cache,
        dropped): the position of the next token."""
        return self.layers[0].position if self.layers else 0

    @property
    def nbytes(self) -> int:
        """Bytes of the stored keys and values of all layers:
        ``2 * layers * B * H_kv * T * d_k * itemsize``."""
        return sum(layer.nbytes for layer in self.layers)

    def __repr__(self) -> str:
        rolls = "" if self.keep_last is None else f"keep_last={self.keep_last}, "
        rolls += "" if self.sink_tokens is None else f"sink_tokens={self.sink_tokens}, "
        return (
            f"KVCache({rolls}layers={len(self.layers)}, tokens={len(self)}, nbytes={self.nbytes})"
        )
