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

import torch
from torch import Tensor, nn

from ._checks import check_bool, check_int, trusted_inputs
from .encoder import (
    POSITIONAL_KINDS,
    Encoder,
    SinusoidalPositionalEncoding,
    _check_token_ids,
    _position_module,
)
from .kv_cache import KVCache

#: Accepted values of ``CausalLM(positional=...)``: chapter 7's kinds and RoPE.
DECODER_POSITIONAL_KINDS = (*POSITIONAL_KINDS, "rope")


def _bottom_right_causal_mask(
    q_len: int, k_len: int, device: torch.device, window: int | None = None
) -> Tensor:
    """Keep-mask of ``q_len`` queries that are the *last* of ``k_len`` positions.

    Query ``i`` sits at position ``p = k_len - q_len + i`` and may attend to keys
    ``0 .. p`` (chapter 5, *Masking*); with a ``window``, only to keys
    ``p - window < j <= p`` (chapter 10). With ``q_len == k_len`` it is the
    ordinary causal (or sliding-window) mask. No checks (an internal helper).
    """
    keep = torch.ones(q_len, k_len, dtype=torch.bool, device=device)  # (Lq, Lk)
    keep = keep.tril(diagonal=k_len - q_len)
    if window is not None:
        keep = keep.triu(diagonal=k_len - q_len - window + 1)  # and j > p - window
    return keep


class CausalLM(nn.Module):
    """A decoder-only language model: embedding + positions + causal pre-LN blocks + head.

    ``logits[:, i]`` scores the token that follows ``tokens[:, : i + 1]``.
    The blocks are chapter 7's :class:`~attention_lib.EncoderLayer` s under a
    causal mask (a decoder-only block *is* an encoder block that may not look
    ahead), followed by a final ``LayerNorm`` and a linear head.

    Explained in chapter 9, *Attention that writes*.

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
    ) -> None:
        super().__init__()
        if positional not in DECODER_POSITIONAL_KINDS:
            raise ValueError(
                f"positional must be one of {DECODER_POSITIONAL_KINDS}, got {positional!r}"
            )
        self.window = None if window is None else check_int("window", window, minimum=1)
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=1)
        self.max_len = check_int("max_len", max_len, minimum=1)
        check_int("d_model", d_model, minimum=1)  # before nn.Embedding sees it
        self.positional = positional
        self.embedding = nn.Embedding(vocab_size, d_model)
        # RoPE rotates queries and keys inside attention: nothing is added here.
        self.position = (
            None if positional == "rope" else _position_module(positional, d_model, max_len)
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
        )
        self.head = nn.Linear(d_model, vocab_size)

    @property
    def num_layers(self) -> int:
        return len(self.blocks.layers)

    def forward(
        self, tokens: Tensor, *, cache: KVCache | None = None, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Next-token logits for every position of ``tokens``.

        Args:
            tokens: ``(B, L)`` integer ids in ``[0, vocab_size)``, ``L >= 1``.
            cache: a :class:`~attention_lib.KVCache` holding the keys and values
                of the ``T`` tokens before ``tokens`` (empty for a new sequence);
                the keys and values of ``tokens`` are appended to it.
            need_weights: also return the attention weights of every layer and head.

        Returns:
            ``logits`` ``(B, L, vocab_size)``, or ``(logits, weights)`` with
            ``weights`` of shape ``(B, num_layers, H, L, T + L)``.

        Raises:
            TypeError: if ``tokens`` is not an integer tensor or ``cache`` not a
                :class:`~attention_lib.KVCache`.
            ValueError: if ``tokens`` is not ``(B, L)`` with ``L >= 1``, holds ids
                outside ``[0, vocab_size)``, or would run past ``max_len``; or
                if the cache belongs to another batch, dtype or model.
        """
        self._check_tokens(tokens)
        self._check_cache(cache, tokens)
        check_bool("need_weights", need_weights)
        with trusted_inputs():  # the submodules run as modules (hooks work), unchecked
            return self._forward(tokens, cache, need_weights=need_weights)

    def _forward(
        self, tokens: Tensor, cache: KVCache | None, *, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """:meth:`forward` without the checks (the per-token core of generation);
        call it inside :func:`~attention_lib._checks.trusted_inputs`."""
        length = tokens.shape[1]
        past = 0 if cache is None else cache.position  # tokens seen before these
        kept = 0 if cache is None else len(cache)  # ... of which the cache holds
        positions = torch.arange(past, past + length, device=tokens.device)  # (L,)
        x = self.embedding(tokens)  # (B, L, d)
        if isinstance(self.position, SinusoidalPositionalEncoding):
            x = x + self.position.pe[positions].to(x.dtype)  # (B, L, d) + (L, d)
        elif self.position is not None:
            x = x + self.position(positions)  # (B, L, d) + (L, d)
        # One new token sees every cached key and itself: nothing to mask (but the
        # oldest key of a full rolling cache has just left the window).
        mask = None
        if length > 1 or self.window is not None:
            mask = _bottom_right_causal_mask(length, kept + length, x.device, self.window)
        out = self.blocks(x, mask, need_weights=need_weights, cache=cache)
        if not need_weights:
            return self.head(out)  # (B, L, V)
        hidden, weights = out
        return self.head(hidden), weights  # (B, L, V), (B, layers, H, L, T + L)

    def _check_tokens(self, tokens: object) -> None:
        tokens = _check_token_ids(tokens, self.vocab_size)
        if tokens.shape[1] == 0:
            raise ValueError(
                f"tokens must have shape (B, L) with L >= 1, got shape {tuple(tokens.shape)}"
            )

    def _check_cache(self, cache: object, tokens: Tensor) -> None:
        past = 0
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}")
            if cache.window is not None and (self.window is None or cache.window < self.window):
                raise ValueError(
                    f"a rolling cache of window={cache.window} would drop keys that this "
                    f"model (window={self.window}) still attends to"
                )
            past = cache.position
        if past + tokens.shape[1] > self.max_len:
            raise ValueError(
                f"{past} cached + {tokens.shape[1]} new tokens is longer than "
                f"max_len={self.max_len}"
            )
        if not isinstance(cache, KVCache) or past == 0:
            return
        if len(cache.layers) != self.num_layers:
            raise ValueError(
                f"cache holds {len(cache.layers)} layers, this model has {self.num_layers}"
            )
        key = cache.layers[0].key
        weight = self.head.weight
        if key is None or key.shape[0] != tokens.shape[0]:
            raise ValueError(
                f"cache holds a batch of {0 if key is None else key.shape[0]} sequences, "
                f"tokens has {tokens.shape[0]}"
            )
        if key.dtype != weight.dtype or key.device != weight.device:
            raise ValueError(
                f"cache holds {key.dtype} on {key.device}, the model is {weight.dtype} "
                f"on {weight.device}"
            )
