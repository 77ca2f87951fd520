"""A small pre-LN Transformer encoder built from
:class:`~attention_lib.MultiHeadAttention`.

The pieces, in the order in which chapter 7 introduces them:

* :func:`~attention_lib.sinusoidal_positional_encoding` and
  :class:`~attention_lib.SinusoidalPositionalEncoding`: self-attention alone is
  permutation-equivariant, so the position of each token has to be added to its
  embedding;
* :class:`~attention_lib.FeedForward`: the position-wise two-layer MLP of every layer;
* :class:`~attention_lib.EncoderLayer`: self-attention and feed-forward blocks, each
  wrapped as ``x + block(LayerNorm(x))`` (pre-LN);
* :class:`~attention_lib.Encoder`: a stack of layers and a final ``LayerNorm``;
* :class:`~attention_lib.TokenClassifier`: embedding + positions + encoder + a linear
  head that predicts one class per position (the toy tasks of
  :mod:`attention_lib.tasks`).

Every forward pass can return the attention weights of every layer and head,
stacked as ``(B, num_layers, H, L, L)``, ready for
:func:`~attention_lib.attention_grid` (``weights[b]`` is ``(layers, H, L, L)``).

Explained in chapter 7, *Attention that has learned something*.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .bert import TextEncoder, text_encoder_from_hf
from .blocks import BlockSpec
from .kv_cache import KVCache, LayerKVCache
from .layer_types import LAYER_TYPES, LayerSpec, LayerType
from .mha import MultiHeadAttention
from .protocols import Step
from .rope import inverse_frequencies
from .validation import (
    check_base,
    check_choice,
    check_dropout_p,
    check_instance,
    check_int,
    check_token_ids,
)

#: Accepted values of ``TokenClassifier(positional=...)`` and ``CausalLM(positional=...)``.
POSITIONAL_KINDS = ("sinusoidal", "learned", None)
#: Accepted values of ``Encoder(norm_placement=...)``: pre-LN (the book's) or post-LN (BERT's).
NORM_PLACEMENTS = ("pre", "post")
#: Accepted values of ``FeedForward(activation=...)``: the book's ReLU, BERT's (exact) GELU.
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


def position_module(positional: object, d_model: int, max_len: int) -> nn.Module | None:
    """The module that adds positions to the token embeddings of a model:
    ``SinusoidalPositionalEncoding``, a learned ``nn.Embedding(max_len, d_model)``,
    or ``None`` (no positions)."""
    check_choice("positional", positional, POSITIONAL_KINDS)
    if positional == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model, max_len)
    return nn.Embedding(max_len, d_model) if positional == "learned" else None


def sinusoidal_positional_encoding(
    max_len: int,
    d_model: int,
    *,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""The sinusoidal positional encodings of *Attention Is All You Need*.

    .. math::

        PE_{p,\,2i} &= \sin\!\left(p\,\omega_i\right),

        PE_{p,\,2i+1} &= \cos\!\left(p\,\omega_i\right),

        \omega_i &= \mathrm{base}^{-2i/d_\mathrm{model}}.

    Each pair of columns ``(2i, 2i+1)`` is a point turning on the unit circle at
    its own angular speed ``omega_i``, from one turn per ``2 pi`` positions
    (column 0) down to one turn per ``2 pi * base`` positions. So every row has
    norm ``sqrt(d_model / 2)``, the encoding of ``p + k`` is a fixed rotation of
    the encoding of ``p``, and the dot product of two rows depends only on their
    distance. An odd ``d_model`` drops the last cosine column.

    Explained in chapter 7, *Attention that has learned something*.

    Args:
        max_len: number of positions ``0 .. max_len - 1``.
        d_model: width of each encoding (the model width).
        base: the wavelength scale (10000 in the paper).
        dtype: floating dtype of the result.
        device: device of the result.

    Returns:
        Tensor of shape ``(max_len, d_model)`` with values in ``[-1, 1]``.

    Raises:
        TypeError: if ``max_len`` or ``d_model`` is not an int, or ``dtype`` not floating.
        ValueError: if ``max_len`` or ``d_model`` is not positive, or ``base <= 1``.
    """
    max_len = check_int("max_len", max_len, minimum=1)
    d_model = check_int("d_model", d_model, minimum=1)
    omega = inverse_frequencies(d_model, check_base(base), device)  # (ceil(d/2),)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating dtype, got {dtype!r}")
    # Angles in float64, rounded once at the end, so every dtype gets its best values.
    position = torch.arange(max_len, dtype=torch.float64, device=device)[:, None]  # (L, 1)
    angle = position * omega  # (L, ceil(d/2))
    pe = torch.empty(max_len, d_model, dtype=torch.float64, device=device)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.to(dtype)  # (L, d_model)


class SinusoidalPositionalEncoding(nn.Module):
    """Adds :func:`sinusoidal_positional_encoding` to a batch of embeddings.

    The table is a non-trainable buffer (it moves with ``.to()`` but is not a
    parameter, and is not saved in the ``state_dict``). Chapter 7 builds the
    table itself with :func:`sinusoidal_positional_encoding`; this module is
    how :class:`TokenClassifier` adds it.

    Args:
        d_model: embedding width.
        max_len: longest sequence the module accepts.
        base: the wavelength scale (10000 in the paper).

    Shapes:
        - x: ``(B, L, d_model)`` with ``L <= max_len``
        - output: ``(B, L, d_model)``, ``x + PE[:L]``
    """

    pe: Tensor

    def __init__(self, d_model: int, max_len: int = 512, *, base: float = 10000.0) -> None:
        super().__init__()
        pe = sinusoidal_positional_encoding(max_len, d_model, base=base)  # (max_len, d)
        self.d_model, self.max_len = d_model, max_len
        self.register_buffer("pe", pe, persistent=False)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Return ``x + PE[positions]`` for ``x`` of shape ``(B, L, d_model)``
        (``positions`` defaults to ``0 .. L-1``). A building block: no checks."""
        pe = self.pe[: x.shape[1]] if positions is None else self.pe[positions]  # (L, d)
        return x + pe.to(x.dtype)  # (B, L, d) + (L, d) -> (B, L, d)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}"


class FeedForward(nn.Module):
    """The position-wise feed-forward block: ``Linear -> ReLU -> Dropout -> Linear``
    (or GELU instead of ReLU, as in BERT).

    The same two-layer MLP is applied to every position separately (it never
    mixes positions; only attention does). It widens each vector to ``d_ff``
    (usually ``4 * d_model``), applies a ReLU and projects back. Parameters:
    ``2 * d_model * d_ff + d_ff + d_model``.

    The second block of every :class:`EncoderLayer`; chapter 7 trains the
    models built from them and counts their parameters.

    Args:
        d_model: input and output width.
        d_ff: hidden width.
        dropout: dropout probability after the ReLU (active in ``train()`` only).
        activation: ``"relu"`` (default) or ``"gelu"`` (the exact, erf GELU of
            BERT: :meth:`Encoder.from_hf`).

    Shapes:
        - x: ``(..., d_model)``
        - output: ``(..., d_model)``
    """

    def __init__(
        self, d_model: int, d_ff: int, dropout: float = 0.0, *, activation: str = "relu"
    ) -> None:
        super().__init__()
        check_int("d_model", d_model, minimum=1)
        check_int("d_ff", d_ff, minimum=1)
        check_choice("activation", activation, tuple(ACTIVATIONS))
        self.linear1 = nn.Linear(d_model, d_ff)
        self.activation = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(check_dropout_p(dropout, name="dropout"))
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """Apply the MLP to every position of ``x`` (``(..., d_model)``). A building
        block: no checks."""
        hidden = self.activation(self.linear1(x))  # (..., d_ff)
        if self.training:  # nn.Dropout is the identity in eval(): not called then
            hidden = self.dropout(hidden)
        return self.linear2(hidden)  # (..., d_model)


class EncoderLayer(nn.Module):
    """One pre-LN Transformer encoder layer.

    .. code-block:: text

        x = x + Dropout(SelfAttention(LayerNorm(x)))
        x = x + Dropout(FeedForward(LayerNorm(x)))

    The residual connections keep an unchanged copy of ``x`` flowing through the
    layer, so each block only has to learn a *correction*. Normalising the
    *input* of each block (pre-LN, rather than the output as in the original
    post-LN Transformer) keeps that residual path free of normalisation, which
    makes small models train stably without a learning-rate warm-up.

    Explained in chapter 7, *Attention that has learned something*.

    Args:
        d_model: model width.
        num_heads: number of attention heads (must divide ``d_model``).
        d_ff: hidden width of the feed-forward block; defaults to ``4 * d_model``.
        dropout: dropout on attention weights and after each block (``train()`` only).
        **attention: keyword options of the self-attention, a
            :class:`~attention_lib.MultiHeadAttention`: ``backend`` (whatever
            it is, ``need_weights=True`` computes with the lib backend),
            ``num_kv_heads``, ``rope_base`` and ``window`` (chapter 10),
            ``qk_norm``, ``softcap``, ``sink`` and ``gate`` (chapter 15), ...
        layer_type: a name of :data:`~attention_lib.layer_types.LAYER_TYPES`
            (``"full"``, ``"sliding"``, ``"chunked"``, ...): its ``make_mixer``
            builds the token mixer from these options (chapter 16);
            ``None`` (default) for a ``MultiHeadAttention``.
        block: what the layer's norms and MLP are, a
            :class:`~attention_lib.BlockSpec` (RMSNorm, gated MLPs,
            sandwich norms of today's decoders); ``None`` (default) for the
            ``LayerNorm`` and ReLU :class:`FeedForward` described above.
        norm_placement: ``"pre"`` (default, above) or ``"post"``, the
            original Transformer's and BERT's ``x = LayerNorm(x + block(x))``
            (:meth:`Encoder.from_hf`).
        activation: the :class:`FeedForward`'s, ``"relu"`` (default) or
            ``"gelu"`` (BERT's).

    A building block: its ``forward`` checks nothing itself; its
    self-attention, a :class:`~attention_lib.MultiHeadAttention`, validates
    what it is given.

    Shapes:
        - x: ``(B, L, d_model)``
        - mask: keep-mask broadcastable to ``(B, H, L, L)`` (``True`` = may attend),
          e.g. ``padding_mask(lengths)`` of shape ``(B, 1, 1, L)``
        - output: ``(B, L, d_model)``
        - weights (with ``need_weights=True``): ``(B, H, L, L)``
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.0,
        *,
        layer_type: str | LayerSpec | None = None,
        layer_table: Mapping[str, LayerType] | None = None,
        block: BlockSpec | None = None,
        norm_placement: str = "pre",
        activation: str = "relu",
        **attention: Any,
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model, minimum=1)
        d_ff = 4 * d_model if d_ff is None else d_ff
        check_instance("block", block, (BlockSpec, type(None)), "a BlockSpec or None")
        check_choice("norm_placement", norm_placement, NORM_PLACEMENTS)
        self.norm_placement = norm_placement
        if norm_placement == "post" and block is not None and block.sandwich:
            raise ValueError("norm_placement='post' with a sandwich block: one or the other")
        self.block = block
        self.norm1 = nn.LayerNorm(d_model) if block is None else block.make_norm(d_model)
        self.layer_type = self.spec = None
        self._table = LAYER_TYPES if layer_table is None else layer_table
        if layer_type is None:
            self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, **attention)
        else:  # the token mixer of this layer type (a table, chapter 16)
            if isinstance(layer_type, str):
                layer_type = LayerSpec(layer_type)
            check_instance("layer_type", layer_type, LayerSpec, "a str, a LayerSpec or None")
            self.spec = layer_type.with_defaults(attention)
            self.layer_type = self.spec.kind
            self.self_attn = self.spec.build(d_model, num_heads, dropout=dropout, table=self._table)
        self.dropout1 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model) if block is None else block.make_norm(d_model)
        if block is None or block.mlp == "relu":
            self.ffn = FeedForward(d_model, d_ff, dropout=dropout, activation=activation)
        else:  # a gated MLP (today's decoders)
            self.ffn = block.make_mlp(d_model, d_ff)
        self.dropout2 = nn.Dropout(dropout)
        # sandwich norms (Gemma 2 and 3): each sublayer's output is normalised too
        sandwich = block is not None and block.sandwich
        self.post_norm1 = block.make_norm(d_model) if sandwich else None
        self.post_norm2 = block.make_norm(d_model) if sandwich else None

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        is_causal: bool = False,
        need_weights: bool = False,
        kv_cache: LayerKVCache | None = None,
        positions: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Run the layer; with ``need_weights=True`` also return the weights.

        Args:
            x: ``(B, L, d_model)`` input.
            mask: keep-mask broadcastable to ``(B, H, L, T + L)``, or ``None``.
            is_causal: causal self-attention (bottom-right after a cache; see
                :meth:`MultiHeadAttention.forward <attention_lib.MultiHeadAttention.forward>`).
            need_weights: also return the self-attention weights.
            kv_cache: the self-attention's cache of ``T`` earlier keys and
                values (chapter 9); the keys then count them too.
            positions: the RoPE positions of the tokens, if the layer has RoPE.

        Returns:
            ``output`` ``(B, L, d_model)``, or ``(output, weights)`` with
            weights ``(B, H, L, T + L)``.

        Raises:
            TypeError, ValueError: on bad input, as
                :meth:`MultiHeadAttention.forward <attention_lib.MultiHeadAttention.forward>`.
        """
        h = self.norm1(x) if self.norm_placement == "pre" else x  # (B, L, d)
        attended = self.self_attn(
            h,
            h,
            h,
            mask,
            is_causal=is_causal,
            need_weights=need_weights,
            kv_cache=kv_cache,
            positions=positions,
        )  # (B, L, d), or with (B, H, L, Lk) weights
        attn, weights = attended if need_weights else (attended, None)
        return self._residuals(x, attn, weights)

    def mix(
        self, x: Tensor, step: Step, cache: Any, *, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The layer on the unchecked path of a model: its token mixer's
        ``mix`` with the ``step`` the model prepared once (the mixer protocol
        of :mod:`attention_lib.protocols`), called through the module (so that
        its hooks see the call). A mixer without ``mix`` (a layer type of your
        own) is called as a self-attention, and checks itself. (The path of
        chapter 9's :class:`~attention_lib.CausalLM`.)
        """
        h = self.norm1(x) if self.norm_placement == "pre" else x  # (B, L, d)
        mixer = self.self_attn
        if hasattr(mixer, "mix"):  # through __call__: hooks on the mixer still see it
            attended = mixer(h, step=step, kv_cache=cache, need_weights=need_weights)
        else:
            held = 0 if cache is None else len(cache)
            mask = step.keep_for(held + x.shape[1])
            attended = mixer(
                h, h, h, mask, is_causal=step.causal, need_weights=need_weights,
                kv_cache=cache, positions=step.positions,
            )  # fmt: skip
        attn, weights = attended if need_weights else (attended, None)
        return self._residuals(x, attn, weights)

    def _residuals(self, x: Tensor, attn: Tensor, weights: Tensor | None) -> Any:
        """``x + attn``, then ``x + ffn(norm2(x))``, each sublayer's output
        normalised first in a sandwich block; with the weights if given.
        Post-LN: ``norm1(x + attn)``, then ``norm2(x + ffn(x))``."""
        drop = self.training  # nn.Dropout is the identity in eval(): not called then
        if self.norm_placement == "post":
            x = self.norm1(x + (self.dropout1(attn) if drop else attn))  # (B, L, d)
            out = self.ffn(x)
            x = self.norm2(x + (self.dropout2(out) if drop else out))  # (B, L, d)
            return x if weights is None else (x, weights)
        if self.post_norm1 is not None:
            attn = self.post_norm1(attn)
        x = x + (self.dropout1(attn) if drop else attn)
        out = self.ffn(self.norm2(x))  # (B, L, d)
        if self.post_norm2 is not None:
            out = self.post_norm2(out)
        x = x + (self.dropout2(out) if drop else out)  # (B, L, d)
        return x if weights is None else (x, weights)

    def make_cache(self) -> Any:
        """An empty cache for this layer: its layer type's ``make_cache``, or a
        plain :class:`~attention_lib.LayerKVCache` without a layer type."""
        if self.layer_type is None:
            return LayerKVCache()
        return self._table[self.layer_type].make_cache(self.self_attn)


class Encoder(nn.Module):
    """A stack of pre-LN :class:`EncoderLayer` s followed by a final ``LayerNorm``.

    With pre-LN the residual stream itself is never normalised inside the
    layers, so the stack ends with one ``LayerNorm`` before any head reads it.
    Parameters: ``num_layers * (4 d^2 + 2 d d_ff + d_ff + 9 d) + 2 d`` for
    ``d = d_model`` (see :meth:`num_parameters`).

    Explained in chapter 7, *Attention that has learned something*.

    Args:
        d_model: model width.
        num_heads: number of attention heads per layer.
        num_layers: number of layers.
        d_ff: hidden width of the feed-forward blocks; defaults to ``4 * d_model``.
        dropout: dropout probability (``train()`` only).
        layer_types: one name of :data:`~attention_lib.layer_types.LAYER_TYPES`
            per layer (``"full"``, ``"sliding"`` with ``window``, ``"chunked"``
            with ``chunk_size``; chapter 16), or ``None``
            (default): every layer a ``MultiHeadAttention`` with the same options.
        nope_layers: indices of layers without RoPE (NoPE, Llama 4's global
            layers): their attention gets ``rope_base=None``.
        block: every layer's norms and MLP, and the final norm's kind, a
            :class:`~attention_lib.BlockSpec`; ``None`` (default):
            ``LayerNorm`` and ReLU :class:`FeedForward`.
        norm_placement: ``"pre"`` (default) or ``"post"`` (BERT's, see
            :class:`EncoderLayer`): a post-LN stack has no final norm, its
            layers' outputs are normalised already.
        activation: the feed-forward activation, ``"relu"`` (default) or
            ``"gelu"``.
        **attention: the self-attention options of every layer (see
            :class:`EncoderLayer`).

    Shapes:
        - x: ``(B, L, d_model)``
        - mask: keep-mask broadcastable to ``(B, H, L, L)``
        - output: ``(B, L, d_model)``
        - weights (with ``need_weights=True``): ``(B, num_layers, H, L, L)``
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_layers: int,
        d_ff: int | None = None,
        dropout: float = 0.0,
        *,
        layer_types: Sequence[str | LayerSpec] | None = None,
        nope_layers: Sequence[int] = (),
        layer_table: Mapping[str, LayerType] | None = None,
        block: BlockSpec | None = None,
        norm_placement: str = "pre",
        activation: str = "relu",
        **attention: Any,
    ) -> None:
        super().__init__()
        check_int("num_layers", num_layers, minimum=1)
        self.d_model = d_model  # checked by the layers
        kinds = [None] * num_layers if layer_types is None else list(layer_types)
        if len(kinds) != num_layers or not set(nope_layers) <= set(range(num_layers)):
            given = f"layer_types={layer_types}, nope_layers={nope_layers}"
            raise ValueError(f"one layer type per layer, indices < {num_layers} layers: {given}")
        self.layers = nn.ModuleList(
            EncoderLayer(
                d_model,
                num_heads,
                d_ff,
                dropout,
                layer_type=kind,
                layer_table=layer_table,
                block=block,
                norm_placement=norm_placement,
                activation=activation,
                **(_without_rope(attention) if i in nope_layers else attention),
            )
            for i, kind in enumerate(kinds)
        )
        self.norm: nn.Module | None = None  # post-LN: the layers normalise their outputs
        if norm_placement == "pre":
            self.norm = nn.LayerNorm(d_model) if block is None else block.make_norm(d_model)

    @classmethod
    def from_hf(cls, model: nn.Module) -> TextEncoder:
        """The book's modules with the weights of a 🤗 transformers ``BertModel``
        (all-MiniLM-L6-v2, BERT itself): a :class:`~attention_lib.bert.TextEncoder`,
        its embeddings and a post-LN GELU ``Encoder`` whose self-attentions are
        :meth:`MultiHeadAttention.from_hf <attention_lib.MultiHeadAttention.from_hf>`.
        See :func:`~attention_lib.bert.text_encoder_from_hf`.

        Explained in chapter 8, *Attention in a trained model*.
        """
        return text_encoder_from_hf(model, cls)

    @staticmethod
    def num_parameters(d_model: int, num_layers: int, d_ff: int | None = None) -> int:
        """The exact number of parameters of ``Encoder(d_model, h, num_layers, d_ff)``.

        Per layer: attention ``4 (d^2 + d)`` (W_q, W_k, W_v, W_o with biases),
        feed-forward ``2 d d_ff + d_ff + d``, two LayerNorms ``2 * 2 d``; plus the
        final LayerNorm ``2 d``. The number of heads does not matter: the heads
        split ``d_model``, they do not add weights.
        """
        d_ff = 4 * d_model if d_ff is None else d_ff
        attention = 4 * (d_model * d_model + d_model)
        feed_forward = 2 * d_model * d_ff + d_ff + d_model
        layer_norms = 2 * (2 * d_model)
        return num_layers * (attention + feed_forward + layer_norms) + 2 * d_model

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        is_causal: bool = False,
        need_weights: bool = False,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Run every layer; with ``need_weights=True`` also return all weights.

        The mask, the causal flag and the positions are passed unchanged to
        every layer, whose self-attention validates them.

        Args:
            x: ``(B, L, d_model)`` input.
            mask: keep-mask broadcastable to ``(B, H, L, T + L)``, or ``None``.
            is_causal: causal self-attention in every layer.
            need_weights: also return the attention weights of every layer.
            cache: a :class:`~attention_lib.KVCache`; layer ``i`` appends its
                keys and values to ``cache.layer(i)`` and attends to all of them
                (chapter 9).
            positions: the RoPE positions of the tokens (see
                :meth:`MultiHeadAttention.forward <attention_lib.MultiHeadAttention.forward>`).

        Returns:
            ``output`` ``(B, L, d_model)``, or ``(output, weights)`` with weights
            of shape ``(B, num_layers, H, L, T + L)``.

        Raises:
            TypeError, ValueError: on bad input, as
                :meth:`MultiHeadAttention.forward <attention_lib.MultiHeadAttention.forward>`,
                or a ``cache`` that is not a :class:`~attention_lib.KVCache`.
        """
        check_instance("cache", cache, (KVCache, type(None)), "a KVCache or None")
        all_weights = []
        for i, layer in enumerate(self.layers):
            out = layer(
                x,
                mask,
                is_causal=is_causal,
                need_weights=need_weights,
                kv_cache=None if cache is None else cache.layer(i, self._cache_maker(layer)),
                positions=positions,
            )
            x, weights = out if need_weights else (out, None)  # (B, L, d), (B, H, L, Lk)
            all_weights.append(weights)
        return self._final(x, all_weights if need_weights else None)

    def run(
        self, x: Tensor, step: Step, cache: KVCache | None, *, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """:meth:`forward` on the unchecked path of a model: every layer's
        :meth:`EncoderLayer.mix` with the ``step`` prepared once.

        Explained in chapter 9, *Attention that writes*.
        """
        all_weights = []
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else cache.layer(i, self._cache_maker(layer))
            out = layer.mix(x, step, layer_cache, need_weights=need_weights)
            x, weights = out if need_weights else (out, None)  # (B, L, d), (B, H, L, Lk)
            all_weights.append(weights)
        return self._final(x, all_weights if need_weights else None)

    def _final(self, x: Tensor, all_weights: list[Tensor] | None) -> Any:
        """The final norm, then the layers' weights stacked ``(B, num_layers, H, L, Lk)``."""
        x = x if self.norm is None else self.norm(x)
        if all_weights is None:
            return x
        if len({w.shape for w in all_weights}) > 1:  # caches of different spans
            raise ValueError("need_weights: the layers' caches hold different numbers of keys")
        return x, torch.stack(all_weights, dim=1)  # (B, num_layers, H, L, Lk)

    @staticmethod
    def _cache_maker(layer: EncoderLayer) -> Any:
        """How ``cache.layer`` makes ``layer``'s cache: its type's, or the KVCache's own."""
        return None if layer.layer_type is None else layer.make_cache


def _without_rope(attention: dict[str, Any]) -> dict[str, Any]:
    """The attention options of a NoPE layer: no RoPE base, hence no RoPE scaling."""
    return {
        **attention,
        "rope_base": None,
        **({"rope_scaling": None} if attention.get("rope_scaling") else {}),
    }


class TokenClassifier(nn.Module):
    """Token embedding + positions + :class:`Encoder` + a linear head per position.

    For sequence-to-sequence tasks in which output ``i`` is one class per input
    position ``i`` (the toy tasks of :mod:`attention_lib.tasks`: reverse, sort,
    shift). The embedding is not scaled by ``sqrt(d_model)``: ``nn.Embedding``
    initialises it with unit variance, the same order as the encodings.

    Explained in chapter 7, *Attention that has learned something*.

    Args:
        vocab_size: number of input token ids ``0 .. vocab_size - 1``.
        num_classes: number of output classes; defaults to ``vocab_size``.
        d_model: model width.
        num_heads: attention heads per layer.
        num_layers: encoder layers.
        d_ff: feed-forward hidden width; defaults to ``4 * d_model``.
        max_len: longest sequence accepted.
        dropout: dropout probability (``train()`` only).
        positional: ``"sinusoidal"`` (fixed encodings added to the embeddings),
            ``"learned"`` (an ``nn.Embedding(max_len, d_model)`` added instead) or
            ``None`` (no position information at all: the model is then
            permutation-equivariant).
        backend: attention backend of every layer (see :class:`EncoderLayer`).

    Shapes:
        - tokens: ``(B, L)`` integer ids, ``L <= max_len``
        - mask: keep-mask broadcastable to ``(B, H, L, L)``, e.g. ``padding_mask(lengths)``
        - logits: ``(B, L, num_classes)``
        - weights (with ``need_weights=True``): ``(B, num_layers, H, L, L)``
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int | None = None,
        *,
        d_model: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
        d_ff: int | None = None,
        max_len: int = 64,
        dropout: float = 0.0,
        positional: str | None = "sinusoidal",
        backend: str = "lib",
    ) -> None:
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=1)
        num_classes = vocab_size if num_classes is None else num_classes
        self.num_classes = check_int("num_classes", num_classes, minimum=1)
        self.max_len = check_int("max_len", max_len, minimum=1)
        check_int("d_model", d_model, minimum=1)  # before nn.Embedding sees it
        self.positional = positional
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.position = position_module(positional, d_model, max_len)
        self.encoder = Encoder(d_model, num_heads, num_layers, d_ff, dropout, backend=backend)
        self.head = nn.Linear(d_model, self.num_classes)

    def forward(
        self, tokens: Tensor, mask: Tensor | None = None, *, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Classify every position of ``tokens``.

        Args:
            tokens: ``(B, L)`` integer token ids in ``[0, vocab_size)``.
            mask: keep-mask broadcastable to ``(B, H, L, L)``, or ``None``.
            need_weights: also return the attention weights of every layer and head.

        Returns:
            ``logits`` ``(B, L, num_classes)``, or ``(logits, weights)`` with
            weights of shape ``(B, num_layers, H, L, L)``.

        Raises:
            TypeError: if ``tokens`` is not an integer tensor, or ``mask`` or
                ``need_weights`` has a bad type.
            ValueError: if ``tokens`` is not 2-D, is longer than ``max_len`` or
                holds ids outside ``[0, vocab_size)``, or ``mask`` does not
                broadcast to ``(B, H, L, L)``.
        """
        check_token_ids(tokens, self.vocab_size)
        if tokens.shape[1] > self.max_len:
            raise ValueError(f"tokens has length {tokens.shape[1]} > max_len={self.max_len}")
        x = self.embedding(tokens)  # (B, L, d)
        if isinstance(self.position, nn.Embedding):  # learned positions
            x = x + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        elif self.position is not None:
            x = self.position(x)  # + the sinusoidal encodings
        out = self.encoder(x, mask, need_weights=need_weights)
        if not need_weights:
            return self.head(out)  # (B, L, C)
        hidden, weights = out
        return self.head(hidden), weights  # (B, L, C), (B, layers, H, L, L)
