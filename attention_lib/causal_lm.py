"""A small decoder-only (GPT-style) causal language model.

A decoder-only model is chapter 7's pre-LN encoder with one change: a causal
mask, so that position ``i`` sees only the tokens ``0 .. i`` and can be trained
to predict token ``i + 1``. :class:`CausalLM` therefore reuses
:class:`~attention_lib.Encoder` as its stack of blocks and adds a token
embedding, positions and a linear head over the vocabulary.

With a :class:`~attention_lib.KVCache`, the new tokens are the *last*
positions of the sequence, after the cached ones: their queries attend to the
cached keys and to their own, under chapter 5's bottom-right causal alignment
(``tril(diagonal=Lk - Lq)``), and their positions continue where the cache ends.

Chapter 10 adds the options of today's LLMs: rotary position embeddings
(``positional="rope"``), grouped-query attention (``num_kv_heads``) and a
sliding window (``window``, with a rolling :class:`~attention_lib.KVCache`).

Explained in chapter 9, *Attention that writes*.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .blocks import BlockSpec
from .encoder import POSITIONAL_KINDS, Encoder, position_module
from .hf_models import DecoderConverters
from .kv_cache import KVCache
from .layer_types import LayerSpec, LayerType
from .mha import MultiHeadAttention
from .protocols import Step
from .validation import (
    check_bool,
    check_choice,
    check_instance,
    check_int,
    check_mask,
    check_positions,
    check_real,
    check_token_ids,
)

#: Accepted values of ``CausalLM(positional=...)``: chapter 7's kinds and RoPE.
DECODER_POSITIONAL_KINDS = (*POSITIONAL_KINDS, "rope")


class CausalLM(DecoderConverters, nn.Module):
    """A decoder-only language model: embedding + positions + causal pre-LN blocks + head.

    ``logits[:, i]`` scores the token that follows ``tokens[:, : i + 1]``.
    The blocks are chapter 7's :class:`~attention_lib.EncoderLayer` s under a
    causal mask (a decoder-only block *is* an encoder block that may not look
    ahead), followed by a final ``LayerNorm`` and a linear head.

    Explained in chapter 9, *Attention that writes*; layer types, chunks and
    NoPE layers in chapter 16, *Long contexts*. :meth:`from_hf` builds one
    from a 🤗 transformers decoder (Llama 3, Qwen3, Gemma 2 and 3, SmolLM3,
    DeepSeek-V3 with dense layers, Qwen3-Next with dense layers, gpt-oss).

    Args:
        vocab_size: number of token ids ``0 .. vocab_size - 1``.
        d_model: model width.
        num_heads: attention heads per layer (must divide ``d_model``).
        num_layers: number of blocks.
        max_len: the longest sequence (prompt and generated tokens together).
        d_ff: feed-forward hidden width; defaults to ``4 * d_model``.
        dropout: dropout probability (``train()`` only).
        positional: ``"learned"`` (an ``nn.Embedding(max_len, d_model)`` added
            to the token embeddings), ``"sinusoidal"`` (chapter 7's fixed
            encodings), ``"rope"`` (rotary position embeddings in every
            attention layer, chapter 10; nothing is added to the embeddings)
            or ``None`` (no positions).
        backend: attention backend of every layer (see
            :class:`~attention_lib.MultiHeadAttention`).
        num_kv_heads: key/value heads per layer (grouped-query attention,
            chapter 10): the KV cache shrinks by ``num_heads / num_kv_heads``.
            ``None`` means ``num_heads``.
        rope_base: the RoPE base with ``positional="rope"``.
        window: sliding-window attention (chapter 10): position ``i`` sees the
            tokens ``i - window < j <= i`` only; generation then keeps a rolling
            cache of ``window`` tokens. ``None`` for plain causal attention.
        layer_types: one name per layer, ``"full"``, ``"sliding"`` (with
            ``window``), ``"chunked"`` (with ``chunk_size``), ``"linear"``
            (Gated DeltaNet, a fixed-size state; chapter 18), or another name
            of :data:`~attention_lib.layer_types.LAYER_TYPES` (Gemma 2 and 3's
            local and global layers, Llama 4's chunks; chapter 16).
            Each layer then keeps its own cache, only what it
            can see. ``None`` (default): every layer alike, ``window`` in all.
        chunk_size: the chunk of the ``"chunked"`` layers.
        nope_layers: indices of the layers that get no RoPE (NoPE, Llama 4's
            global layers), with ``positional="rope"``.
        block: the norms and MLP of every block and the final norm, a
            :class:`~attention_lib.BlockSpec` (RMSNorm, SwiGLU/GeGLU,
            sandwich norms); ``None`` (default): ``LayerNorm`` and a ReLU MLP.
        tie_embeddings: the head reads the embedding matrix (one weight for
            both, as Gemma and small Llamas and Qwens).
        embed_scale: multiply the token embeddings by this (Gemma:
            ``sqrt(d_model)``); ``None`` for none.
        logit_softcap: the logits become ``c * tanh(logits / c)`` (Gemma 2's
            final soft-capping); ``None`` for none.
        head_bias: whether the head has a bias (today's LLMs have none).
        **attention: further options of every layer's
            :class:`~attention_lib.MultiHeadAttention`: ``qk_norm``,
            ``softcap``, ``sink`` and ``gate`` (chapter 15), ...

    Shapes:
        - tokens: ``(B, L)`` integer ids; with a cache of ``T`` tokens,
          ``T + L <= max_len``
        - logits: ``(B, L, vocab_size)``
        - weights (with ``need_weights=True``): ``(B, num_layers, H, L, T + L)``
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
        max_len: int = 128,
        *,
        d_ff: int | None = None,
        dropout: float = 0.0,
        positional: str | None = "learned",
        backend: str = "lib",
        num_kv_heads: int | None = None,
        rope_base: float = 10000.0,
        window: int | None = None,
        layer_types: Sequence[str | LayerSpec] | None = None,
        chunk_size: int | None = None,
        nope_layers: Sequence[int] = (),
        layer_table: Mapping[str, LayerType] | None = None,
        block: BlockSpec | None = None,
        tie_embeddings: bool = False,
        embed_scale: float | None = None,
        logit_softcap: float | None = None,
        head_bias: bool = True,
        **attention: Any,
    ) -> None:
        super().__init__()
        check_choice("positional", positional, DECODER_POSITIONAL_KINDS)
        self.window = None if window is None else check_int("window", window, minimum=1)
        self.layer_specs = self.layer_types = None
        if layer_types is not None:  # names or LayerSpecs: one value per layer
            self.layer_specs = tuple(
                LayerSpec(kind) if isinstance(kind, str) else kind for kind in layer_types
            )
            for spec in self.layer_specs:
                check_instance("layer_types[i]", spec, LayerSpec, "a layer type name or LayerSpec")
            self.layer_types = tuple(spec.kind for spec in self.layer_specs)
        # chunked attention in some layer: a fact of the layer types, not of attributes
        self._chunked = (
            chunk_size is not None if layer_types is None else "chunked" in self.layer_types
        )
        if self.layer_specs is not None:  # per-layer spans: each layer's cache is its own
            self.window = None
            spans = {"sliding": ("window", window), "chunked": ("chunk_size", chunk_size)}
            for spec in self.layer_specs:
                name, default = spans.get(spec.kind, (None, 0))
                if name is not None and dict(spec.options).get(name, default) is None:
                    raise ValueError("'sliding' layers need a window, 'chunked' ones chunk_size")
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=1)
        self.max_len = check_int("max_len", max_len, minimum=1)
        check_int("d_model", d_model, minimum=1)  # before nn.Embedding sees it
        self.positional = positional
        self.embedding = nn.Embedding(vocab_size, d_model)
        # RoPE rotates queries and keys inside attention: nothing is added here.
        self.position = (
            None if positional == "rope" else position_module(positional, d_model, max_len)
        )
        self.blocks = Encoder(
            d_model,
            num_heads,
            num_layers,
            d_ff,
            dropout,
            backend=backend,
            num_kv_heads=num_kv_heads,
            rope_base=rope_base if positional == "rope" else None,
            window=window,
            chunk_size=chunk_size,
            layer_types=self.layer_specs,
            nope_layers=nope_layers,
            layer_table=layer_table,
            block=block,
            **attention,
        )
        self.head = nn.Linear(d_model, vocab_size, bias=check_bool("head_bias", head_bias))
        if check_bool("tie_embeddings", tie_embeddings):
            self.head.weight = self.embedding.weight  # one (vocab_size, d_model) matrix
        self.embed_scale = None if embed_scale is None else check_real("embed_scale", embed_scale)
        self.logit_softcap = (
            None if logit_softcap is None else check_real("logit_softcap", logit_softcap, above=0)
        )
        self._made: list[tuple] | None = None

    @property
    def num_layers(self) -> int:
        return len(self.blocks.layers)

    def forward(
        self,
        tokens: Tensor,
        *,
        cache: KVCache | None = None,
        need_weights: bool = False,
        mask: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Next-token logits for every position of ``tokens``.

        Args:
            tokens: ``(B, L)`` integer ids in ``[0, vocab_size)``, ``L >= 1``.
            cache: a :class:`~attention_lib.KVCache` holding the keys and values
                of the ``T`` tokens before ``tokens`` (empty for a new sequence);
                the keys and values of ``tokens`` are appended to it.
            need_weights: also return the attention weights of every layer and head.
            mask: a padding keep-mask ``(B, P + L)`` over every token so far
                (the ``P = cache.position`` seen before, then ``tokens``):
                ``True``/1 = a real token, ``False``/0 = padding that no query
                attends to (left padding of a ragged batch, chapter 12);
                combined with the causal mask. ``None``: every token is real.
                Or a per-token keep-mask ``(B, L, P + L)`` (``B`` may be 1):
                row ``i`` says which tokens new token ``i`` sees, *instead of*
                the causal mask (a token tree verified in one pass, with
                ``positions`` by depth: :func:`~attention_lib.speculative.tree_mask`,
                chapter 13); only for a model whose layers are all full
                softmax attention, with a cache that holds every token.
            positions: ``(B, L)`` or ``(L,)`` integer positions of ``tokens``,
                e.g. each left-padded sequence counting from its own first
                real token (chapter 12); ``None`` means ``P, P + 1, ...``.

        Returns:
            ``logits`` ``(B, L, vocab_size)``, or ``(logits, weights)`` with
            ``weights`` of shape ``(B, num_layers, H, L, T + L)``.

        Raises:
            TypeError: if ``tokens`` is not an integer tensor or ``cache`` not a
                :class:`~attention_lib.KVCache`.
            ValueError: if ``tokens`` is not ``(B, L)`` with ``L >= 1``, holds ids
                outside ``[0, vocab_size)``, or would run past ``max_len``; if
                the cache belongs to another batch, dtype or model; or if
                ``mask`` or ``positions`` do not fit.
        """
        check_token_ids(tokens, self.vocab_size)
        past = 0 if cache is None else self.check_cache(cache, len(tokens))
        length, limit = tokens.shape[1], self.max_len
        check_int("the length L of tokens (B, L)", length, minimum=1)
        check_bool("need_weights", need_weights)
        if past + length > limit:  # chapter 10 shows this error
            raise ValueError(f"{past} cached + {length} new tokens is longer than max_len={limit}")
        if positions is None:
            positions = torch.arange(past, past + length, device=tokens.device)  # (L,)
        elif check_positions(positions, tokens.shape, tokens.device).numel() and not (
            0 <= int(positions.min()) <= int(positions.max()) < limit
        ):
            raise ValueError(f"positions must lie in [0, max_len={limit}), got {positions}")
        keep, causal = None, True
        if isinstance(mask, Tensor) and mask.dim() == 3:  # per token (B, L, P + L): chapter 13
            self._check_tree_mask(cache)
            keep = check_mask(mask, (tokens.shape[0], length, past + length), device=tokens.device)
            keep, causal = keep.expand(tokens.shape[0], length, -1)[:, None], False
        elif mask is not None:  # padding: (B, P + L) -> the stored and new keys (B, 1, 1, T + L)
            if cache is not None and cache.sink_tokens is not None:  # columns are not the last
                raise ValueError("a padding mask needs a cache without sink_tokens")
            if self._chunked:
                # transformers counts a padded row's chunks from its first real token
                raise ValueError("chunked layers take no padding mask (chunks would shift)")
            keep = check_mask(mask, (tokens.shape[0], past + length), device=tokens.device)
            keep = keep.expand(tokens.shape[0], -1)[:, None, None, :]  # (B, 1, 1, P + L)
        x = self.embedding(tokens)  # (B, L, d)
        if self.embed_scale is not None:  # Gemma: sqrt(d_model)
            x = x * self.embed_scale
        if isinstance(self.position, nn.Embedding):  # learned positions
            x = x + self.position(positions)  # (B, L, d) + (L, d)
        elif self.position is not None:  # sinusoidal
            x = self.position(x, positions)  # (B, L, d)
        # Causal in every layer: bottom-right after the cached tokens (chapter 5), the
        # layers' window if any, and RoPE at `positions`; prepared once (the RoPE
        # tables at the first layer that asks), passed down the unchecked path.
        step = Step(positions, causal=causal, keep=keep)
        out = self.blocks.run(x, step, cache, need_weights=need_weights)
        if not need_weights:
            return self._logits(out)  # (B, L, V)
        hidden, weights = out
        return self._logits(hidden), weights  # (B, L, V), (B, layers, H, L, T + L)

    def _check_tree_mask(self, cache: KVCache | None) -> None:
        """A per-token mask replaces the causal one: refused where a layer
        would need its own (a window, chunks, a recurrence) or a cache has
        dropped columns."""
        for layer in self.blocks.layers:
            attn = layer.self_attn
            spans = getattr(attn, "window", None), getattr(attn, "chunk_size", None)
            if not isinstance(attn, MultiHeadAttention) or spans != (None, None):
                given = f"{type(attn).__name__} with (window, chunk_size) = {spans}"
                raise ValueError(f"a per-token mask needs full attention in every layer: {given}")
        if cache is not None and (cache.keep_last is not None or cache.sink_tokens is not None):
            raise ValueError("a per-token mask needs a cache that keeps every token")

    def _logits(self, hidden: Tensor) -> Tensor:
        """The head, then the final soft-capping if any: ``(B, L, d) -> (B, L, V)``."""
        logits = self.head(hidden)
        if self.logit_softcap is None:
            return logits
        return self.logit_softcap * torch.tanh(logits / self.logit_softcap)

    def check_cache(self, cache: object, batch: int | None = None) -> int:
        """Refuse a ``cache`` that this model cannot continue (another number of
        layers, a rolling window that is too small, or sink tokens with a
        windowed model: they would make its window's positions wrong; a model
        without a window reads a cache with ``sink_tokens`` as StreamingLLM
        does, chapter 15); return the number of
        tokens it has seen. Each layer's attention checks that its own cache
        holds the right batch, heads, width and dtype. With ``batch``, every
        layer's cache is checked against it here, once per call (the layers then
        check nothing).

        Raises:
            TypeError: if ``cache`` is not a :class:`~attention_lib.KVCache`.
            ValueError: naming what does not fit.
        """
        check_instance("cache", cache, KVCache, "a KVCache or None")
        if self.layer_types is not None:  # each layer has made (and keeps) its own cache
            made = self._made or [_kind(layer.make_cache()) for layer in self.blocks.layers]
            self._made = made  # the kinds of cache the layers make (asked once)
            if cache.keep_last or cache.sink_tokens is not None or _kinds(cache) not in ([], made):
                raise ValueError("a model with layer_types needs a KVCache() it has filled itself")
            return self._check_layer_caches(cache, batch)
        if cache.sink_tokens is not None and self.window is not None:  # positions not contiguous
            raise ValueError("a cache with sink_tokens is for a model without a window")
        kept = cache.keep_last  # tokens kept; the model's window: tokens a query sees
        drops = kept is not None and (self.window is None or kept < self.window)
        if drops and cache.sink_tokens is None:  # StreamingLLM's cache drops keys on purpose
            raise ValueError(f"cache keep_last={kept} < the model's window={self.window}")
        if cache.layers and len(cache.layers) != self.num_layers:
            raise ValueError(f"cache holds {len(cache.layers)} layers, not {self.num_layers}")
        return self._check_layer_caches(cache, batch)

    def _check_layer_caches(self, cache: KVCache, batch: int | None) -> int:
        """With ``batch``, each layer's mixer checks its cache (batch, shapes,
        dtype), here once per call; returns the tokens the cache has seen."""
        if batch is not None:
            weight = self.embedding.weight
            for i, layer in enumerate(self.blocks.layers):
                if hasattr(layer.self_attn, "check_cache"):  # a layer not run yet: an empty cache
                    held = cache.layers[i] if i < len(cache.layers) else layer.make_cache()
                    layer.self_attn.check_cache(held, batch, weight.dtype, weight.device)
        return cache.position


def _kind(layer_cache: Any) -> tuple:
    """What kind of per-layer cache this is: its type, the tokens it keeps and its chunk."""
    return (
        type(layer_cache),
        getattr(layer_cache, "keep_last", None),
        getattr(layer_cache, "chunk", None),
    )


def _kinds(cache: KVCache) -> list[tuple]:
    return [_kind(layer_cache) for layer_cache in cache.layers]
