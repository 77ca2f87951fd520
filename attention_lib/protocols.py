"""The two protocols every layer of a model follows: token mixers and their caches.

A decoder block is ``x + mixer(norm(x))`` then ``x + ffn(norm(x))``; only the
*token mixer* differs between layer types: softmax attention
(:class:`~attention_lib.MultiHeadAttention`, full, sliding or chunked),
latent attention (:class:`~attention_lib.MultiHeadLatentAttention`, with or
without DeepSeek's sparse indexer) or a linear recurrence
(:class:`~attention_lib.gated_deltanet.GatedDeltaNet`). Each keeps its own
kind of per-layer cache. This module writes down, once, how a model talks to
any of them, so that a new kind is one more class, not a new branch in the
model.

**The mixer protocol** (:class:`TokenMixer`). A mixer is called as the
self-attention sublayer of a decoder through its *unchecked* path,
``mixer(x, step=step, kv_cache=cache, need_weights=False)`` (through the
module, so that its hooks see the call; ``forward`` hands it to
``mixer.mix(x, step, cache, need_weights=...)``), with

* ``x``: ``(B, L, d_model)``, the new tokens (after the block's norm);
* ``step``: a :class:`Step`, the per-call facts the model prepared **once**
  for all its layers: the positions of the new tokens, whether attention is
  causal (bottom-right after the tokens the layer's cache holds, chapter 5),
  the padding keep-mask over every token so far, and a table of RoPE
  ``cos``/``sin`` computed at most once per (width, base, scaling, dtype);
* ``cache``: the layer's :class:`LayerCache` (or ``None``): the mixer appends
  the new tokens to it and attends to (or continues from) what it holds.

It returns ``(B, L, d_model)``, or ``(output, weights)`` with
``need_weights=True`` for mixers that have weights (the others raise
``ValueError``). ``mix`` checks nothing: the model validated its inputs.
``mixer.make_cache()`` makes the mixer's empty cache and
``mixer.check_cache(cache, batch, dtype, device)`` refuses one it cannot
continue (the model asks every layer once per call, before any layer runs).
Without ``step``, every mixer's ``forward`` stays the checked entry point
for direct use: it validates its arguments, then takes the same computation.

The model (:class:`~attention_lib.CausalLM`, and through it
:func:`~attention_lib.generate` and the serving
:class:`~attention_lib.serving.Engine`) validates its inputs once per call
(tokens, cache, padding mask, positions), builds the :class:`Step`, and runs
every layer on this path: the checks do not grow with depth.

Cross-attention is *not* part of the protocol: it mixes two sequences, so it
stays :class:`~attention_lib.MultiHeadAttention`'s own richer call,
``mha(query, key, value, mask, ...)`` (chapter 6), which the encoder-decoder
of chapter 7 uses.

**The cache protocol** (:class:`LayerCache`). Every per-layer cache
(:class:`~attention_lib.LayerKVCache`, full or rolling with sinks;
:class:`~attention_lib.ChunkKVCache`; :class:`~attention_lib.LatentKVCache`;
:class:`~attention_lib.gated_deltanet.LayerStateCache`;
:class:`~attention_lib.paged_cache.PagedLayer`) answers the same questions
the same way:

* ``position``: tokens *seen* (the position of the next token);
* ``len(cache)``: entries *held* (tokens whose keys it stores; ``0`` for a
  fixed-size recurrent state);
* ``nbytes``: bytes held, never a silent ``0`` while it holds something;
* ``numbers_per_token``: numbers kept per token and sequence (``0`` for a
  fixed-size state; ``0`` while empty);
* ``select(rows)``: keep only the batch rows ``rows`` (a 1-D integer
  tensor), in that order: drops finished sequences, reorders beams;
* ``crop(n)``: forget the last ``n`` tokens (speculative decoding rejects
  drafted tokens); a cache that cannot (a recurrent state, a rolling cache
  that has already dropped tokens) raises ``ValueError`` saying so.

Explained in chapter 18, *Attention without softmax* (the hybrid model whose
layers mix tokens in different ways); layer types in chapter 16, *Long
contexts*.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from .rope import rope_cos_sin


@runtime_checkable
class LayerCache(Protocol):
    """What every per-layer cache answers (see :mod:`attention_lib.protocols`).

    The layers of chapter 18's hybrid models follow it (the chapter does not
    name it).
    """

    @property
    def position(self) -> int:
        """Tokens seen so far: the position of the next token."""
        ...

    def __len__(self) -> int:
        """Entries held (tokens whose keys are stored)."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        ...

    @property
    def numbers_per_token(self) -> int:
        """Numbers kept per token and sequence (0 for a fixed-size state)."""
        ...

    def select(self, rows: Tensor) -> None:
        """Keep the batch rows ``rows``, in that order."""
        ...

    def crop(self, n: int) -> None:
        """Forget the last ``n`` tokens (``ValueError`` if the cache cannot)."""
        ...


@dataclass(frozen=True, eq=False)
class Step:
    """The per-call facts a model prepares once and hands to every layer's mixer.

    The layers of chapter 18's hybrid models follow it (the chapter does not
    name it).

    Attributes:
        positions: ``(L,)`` or ``(B, L)`` integer positions of the new tokens.
        causal: each new token sees only the tokens up to itself
            (bottom-right after the tokens the layer's cache holds); each
            mixer adds its own window or chunk.
        keep: ``None``, or the padding keep-mask ``(B, 1, 1, P + L)`` over
            every token so far (``P`` seen before the call): a layer whose
            cache holds ``T`` entries uses its last ``T + L`` columns
            (``keep_for``); with ``causal=False``, a per-token keep-mask
            ``(B, 1, L, P + L)`` instead (a token tree, chapter 13).
    """

    positions: Tensor
    causal: bool = True
    keep: Tensor | None = None
    _tables: dict = field(default_factory=dict, repr=False)

    def keep_for(self, length: int) -> Tensor | None:
        """The padding keep-mask over the last ``length`` tokens, or ``None``."""
        return None if self.keep is None else self.keep[..., self.keep.shape[-1] - length :]

    def rope(
        self, width: int, base: float, dtype: torch.dtype, scaling: tuple | None = None
    ) -> tuple[Tensor, Tensor]:
        """RoPE ``cos``, ``sin`` ``(.., L, width / 2)`` at :attr:`positions`,
        computed the first time a layer asks for them, then shared."""
        key = (width, base, scaling, dtype)
        if key not in self._tables:
            self._tables[key] = rope_cos_sin(
                self.positions, width, base=base, dtype=dtype, scaling=scaling
            )
        return self._tables[key]


@runtime_checkable
class TokenMixer(Protocol):
    """What every token mixer of a decoder layer does (see :mod:`attention_lib.protocols`).

    The layers of chapter 18's hybrid models follow it (the chapter does not
    name it).
    """

    def mix(
        self, x: Tensor, step: Step, cache: LayerCache | None, *, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Mix the new tokens ``x (B, L, d_model)`` after those ``cache`` holds.
        No checks (``mixer(x, step=step, kv_cache=cache)`` calls it)."""
        ...

    def make_cache(self) -> LayerCache:
        """An empty cache of the kind this mixer keeps."""
        ...

    def check_cache(
        self, cache: object, batch: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        """Raise ``TypeError``/``ValueError`` if the mixer cannot continue ``cache``."""
        ...
