"""Multi-head attention: project, split into heads, attend, merge, project.

Explained in chapter 6, *Multi-head attention*.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import (
    check_bool,
    check_dropout_p,
    check_int,
    check_mask,
    check_tensor,
    inputs_trusted,
)
from .backends import BACKENDS
from .kv_cache import LayerKVCache
from .masks import to_bool
from .rope import _check_base, _rope_cos_sin, _rotate_pairs
from .sdpa import _attention
from .tiled import _check_block_size


class MultiHeadAttention(nn.Module):
    r"""Multi-head attention with batch-first inputs and pluggable attention.

    .. math::

        \mathrm{head}_i = \mathrm{Attention}(Q W_q^{(i)}, K W_k^{(i)}, V W_v^{(i)}),
        \qquad
        \mathrm{MHA}(Q, K, V) = \mathrm{concat}(\mathrm{head}_1, \dots, \mathrm{head}_H)\, W_o

    Each ``nn.Linear(d_model, d_model)`` projection is cut into ``num_heads``
    slices of width ``d_k = d_model // num_heads`` (a ``view`` + ``transpose``,
    no copy), the heads attend independently and their outputs are concatenated
    and mixed by ``W_o``.

    Explained in chapter 6, *Multi-head attention*; backends also in chapter 8,
    *Efficient attention*.

    **Mask semantics.** ``mask`` is a *keep-mask*, as in
    :func:`~attention_lib.scaled_dot_product_attention`: bool ``True`` (or 1)
    = may attend, ``False`` (or 0) = blocked. This is the **opposite** of
    ``nn.MultiheadAttention``, whose bool ``attn_mask`` and ``key_padding_mask``
    mark *blocked* positions with ``True``; and unlike
    ``F.scaled_dot_product_attention`` a float mask is 0/1, never an additive
    bias. A query row with every key masked gives a zero attention output (so
    the module returns the output bias ``W_o.bias`` for it), never ``NaN``.

    **Backends.** ``backend`` names the function that computes attention for
    all heads at once (the table :mod:`attention_lib.backends`): ``"lib"``
    (this package's :func:`~attention_lib.scaled_dot_product_attention`, the
    default), ``"torch"`` (PyTorch's fused ``F.scaled_dot_product_attention``:
    use it where you need speed, not weights) or ``"tiled"``
    (:func:`~attention_lib.tiled.tiled_attention`, chapter 8, with ``block_size``).
    A fused kernel cannot return the attention weights, so
    ``need_weights=True`` always uses the lib computation, whatever the backend.

    **Grouped-query attention and RoPE** (chapter 10). With ``num_kv_heads``
    below ``num_heads``, ``W_k`` and ``W_v`` have only ``num_kv_heads * d_k``
    outputs, and query head ``h`` reads key/value head
    ``h // (num_heads // num_kv_heads)`` (grouped-query attention; ``1`` is
    multi-query attention). The query heads of a group are attended as one
    extra dim against their shared head, which is never copied, and a
    ``kv_cache`` stores only the ``num_kv_heads`` heads. With ``rope_base``, the
    queries and keys are rotated by :func:`~attention_lib.apply_rope` after the
    split into heads, at positions ``0, 1, ...`` (continued after the cached
    positions with a ``kv_cache``). :meth:`from_hf_llama` builds the module of a
    🤗 transformers ``LlamaAttention``.

    Args:
        d_model: model width; divisible by ``num_heads``.
        num_heads: number of heads ``H``.
        dropout: dropout probability on the attention weights, applied only in
            ``train()`` mode.
        bias: whether the four projections have a bias.
        backend: attention backend name, one of
            :func:`~attention_lib.available_backends`.
        block_size: for ``backend="tiled"`` only: the ``block_size`` of
            :func:`~attention_lib.tiled.tiled_attention` (an int or a pair
            ``(block_q, block_k)``); ``None`` keeps its default.
        num_kv_heads: number of key/value heads; divides ``num_heads``.
            ``None`` (default) means ``num_heads`` (plain multi-head attention).
        rope_base: apply rotary position embeddings with this base (10000 in
            Llama 2) to queries and keys; ``None`` (default) for none.
        device: device of the parameters.
        dtype: dtype of the parameters.

    Attributes:
        W_q: query projection, ``nn.Linear(d_model, d_model)``.
        W_k: key projection, ``nn.Linear(d_model, num_kv_heads * d_k)``.
        W_v: value projection, ``nn.Linear(d_model, num_kv_heads * d_k)``.
        W_o: output projection, ``nn.Linear(d_model, d_model)``.
        d_model: model width.
        num_heads: number of heads ``H``.
        num_kv_heads: number of key/value heads ``H_kv``.
        d_k: width of one head, ``d_model // num_heads``.
        rope_base: the RoPE base, or ``None``.
        dropout: dropout probability on the attention weights.
        backend: name of the attention backend (assigning another name switches
            backend; an unknown name raises ``ValueError``).
        block_size: the tiled backend's block size, or ``None``.

    Raises:
        TypeError: if ``d_model``/``num_heads``/``block_size`` are not ints,
            ``dropout`` is not a number, ``bias`` not a bool or ``backend`` not
            a str.
        ValueError: if ``d_model % num_heads != 0``, ``dropout`` is outside
            ``[0, 1)``, ``backend`` is unknown, ``block_size`` is below 1 or
            given for a backend other than ``"tiled"``, ``num_kv_heads`` does
            not divide ``num_heads``, or ``rope_base`` is given with an odd
            ``d_k`` or is not a number ``> 1``.

    Shapes:
        - query: ``(B, Lq, d_model)``
        - key, value: ``(B, Lk, d_model)``
        - mask: ``(Lq, Lk)``, ``(B, 1, Lq, Lk)``, ``(B, H, Lq, Lk)`` or a
          :func:`~attention_lib.padding_mask` ``(B, 1, 1, Lk)``
        - output: ``(B, Lq, d_model)``
        - weights: ``(B, H, Lq, Lk)``
        - kv_cache keys and values: ``(B, H_kv, T, d_k)``
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        *,
        backend: str = "lib",
        block_size: int | tuple[int, int] | None = None,
        num_kv_heads: int | None = None,
        rope_base: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_int("d_model", d_model, minimum=1)
        check_int("num_heads", num_heads, minimum=1)
        if d_model % num_heads != 0:
            raise ValueError(
                f"d_model must be divisible by num_heads, got d_model={d_model} and "
                f"num_heads={num_heads} (d_model % num_heads = {d_model % num_heads})"
            )
        check_bool("bias", bias)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_int("num_kv_heads", num_kv_heads, minimum=1)
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_kv_heads must divide num_heads (each key/value head serves a group "
                f"of query heads), got num_heads={num_heads} and num_kv_heads={num_kv_heads}"
            )
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.d_k = d_model // num_heads
        if rope_base is not None:
            _check_base(rope_base)
            if self.d_k % 2:
                raise ValueError(
                    f"rope_base needs an even head width d_k (RoPE turns coordinate "
                    f"pairs), got d_k = d_model // num_heads = {self.d_k}"
                )
            rope_base = float(rope_base)
        self.rope_base = rope_base
        self.dropout = check_dropout_p(dropout, name="dropout")
        self.backend = backend  # checked by the property's setter
        if block_size is not None:
            if backend != "tiled":
                raise ValueError(
                    f"block_size is an option of backend='tiled', got backend={backend!r}"
                )
            block_size = _check_block_size(block_size)
        self.block_size = block_size
        factory = {"device": device, "dtype": dtype}
        self.W_q = nn.Linear(d_model, d_model, bias=bias, **factory)
        kv_width = num_kv_heads * self.d_k
        self.W_k = nn.Linear(d_model, kv_width, bias=bias, **factory)
        self.W_v = nn.Linear(d_model, kv_width, bias=bias, **factory)
        self.W_o = nn.Linear(d_model, d_model, bias=bias, **factory)

    @property
    def backend(self) -> str:
        """The name of the attention backend (see :mod:`attention_lib.backends`)."""
        return self._backend

    @backend.setter
    def backend(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"backend must be a str, got {type(name).__name__} {name!r}")
        if name not in BACKENDS:
            valid = ", ".join(repr(n) for n in BACKENDS)
            raise ValueError(f"backend must be one of {valid}, got {name!r}")
        self._backend = name

    def extra_repr(self) -> str:
        block = "" if self.block_size is None else f", block_size={self.block_size}"
        kv = "" if self.num_kv_heads == self.num_heads else f", num_kv_heads={self.num_kv_heads}"
        rope = "" if self.rope_base is None else f", rope_base={self.rope_base}"
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}{kv}, "
            f"dropout={self.dropout}, backend={self.backend!r}{block}{rope}"
        )

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        *,
        is_causal: bool = False,
        need_weights: bool = False,
        kv_cache: LayerKVCache | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value`` with every head.

        Explained in chapter 6, *Multi-head attention*.

        Args:
            query: ``(B, Lq, d_model)``.
            key: ``(B, Lk, d_model)``.
            value: ``(B, Lk, d_model)``.
            mask: keep-mask (bool ``True`` / 1 = may attend) of shape
                ``(Lq, Lk)``, ``(B, 1, Lq, Lk)``, ``(B, H, Lq, Lk)`` or
                ``(B, 1, 1, Lk)`` (:func:`~attention_lib.padding_mask`); ``None``
                for no mask.
            is_causal: query ``i`` attends only to keys ``0 .. i`` (combined
                with ``mask``), aligned as ``F.scaled_dot_product_attention``.
            need_weights: also return the per-head attention weights (computed
                with the lib backend, whatever ``backend`` is).
            kv_cache: a :class:`~attention_lib.LayerKVCache`: the projected keys
                and values are appended to it, and the queries attend to every
                key it holds (``Lk`` then counts the cached positions too; chapter 9).

        Returns:
            ``output (B, Lq, d_model)``, or ``(output, weights)`` with
            ``weights (B, H, Lq, Lk)`` if ``need_weights`` (per head; average
            over dim 1 to compare with ``nn.MultiheadAttention``'s default).

        Raises:
            TypeError: on non-floating inputs, a dtype that differs from the
                parameters', a mask of unsupported type or dtype, a
                ``kv_cache`` that is not a ``LayerKVCache``, or flags that are
                not bools.
            ValueError: on inputs that are not ``(B, L, d_model)``, mismatched
                batch sizes, key/value lengths or devices, a mask that does not
                broadcast to ``(B, H, Lq, Lk)`` or is not 0/1, or a cache that
                holds another batch.
        """
        if inputs_trusted():  # an outer module has checked them: mask is a bool keep-mask
            keep = mask
        else:
            keep = self._check_inputs(query, key, value, mask, kv_cache)
            check_bool("is_causal", is_causal)
            check_bool("need_weights", need_weights)
        return self._forward(
            query,
            key,
            value,
            keep,
            is_causal=is_causal,
            need_weights=need_weights,
            kv_cache=kv_cache,
        )

    def _forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        keep: Tensor | None,
        *,
        is_causal: bool = False,
        need_weights: bool = False,
        kv_cache: LayerKVCache | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """:meth:`forward` without the checks: ``keep`` is ``None`` or a bool
        keep-mask (see :meth:`_check_inputs`)."""
        batch, q_len, _ = query.shape
        q, k, v = self._project(query, key, value)  # (B, H, Lq, d_k), 2 x (B, H_kv, Lk, d_k)
        if self.rope_base is not None:
            past = 0 if kv_cache is None else kv_cache.position  # positions already cached
            q, k = self._rotate(q, k, past)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)  # (B, H_kv, T + Lk, d_k): cached keys first
        dropout_p = self.dropout if self.training else 0.0
        group = self.num_heads // self.num_kv_heads
        if group > 1:  # each K/V head serves `group` query heads: a broadcast dim, no copy
            q = q.unflatten(1, (self.num_kv_heads, group))  # (B, H_kv, G, Lq, d_k)
            k, v = k.unsqueeze(2), v.unsqueeze(2)  # (B, H_kv, 1, Lk, d_k)
            keep = _group_heads(keep, self.num_kv_heads, group)

        weights = None
        if need_weights:  # a fused kernel cannot return the weights: the lib computation
            attended, weights = _attention(
                q, k, v, keep, dropout_p=dropout_p, is_causal=is_causal, scale=None
            )  # (B, H, Lq, d_k), (B, H, Lq, Lk); grouped: (B, H_kv, G, ...)
            weights = weights.flatten(1, 2) if group > 1 else weights  # (B, H, Lq, Lk)
        else:
            options = {} if self.block_size is None else {"block_size": self.block_size}
            attended = BACKENDS[self.backend](
                q, k, v, keep, dropout_p=dropout_p, is_causal=is_causal, scale=None, **options
            )  # (B, H, Lq, d_k)
        if group > 1:
            attended = attended.flatten(1, 2)  # (B, H_kv, G, Lq, d_k) -> (B, H, Lq, d_k)
        merged = attended.transpose(1, 2).reshape(batch, q_len, self.d_model)  # (B, Lq, d_model)
        output = self.W_o(merged)  # (B, Lq, d_model)
        return (output, weights) if need_weights else output

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``W_q``, ``W_k``, ``W_v``, then split into heads: ``(B, L, d_model) -> (B, H, L, d_k)``."""
        if query is key and key is value:
            # Self-attention: one matmul with the three weight matrices stacked does
            # the work of three (chapter 6; nn.MultiheadAttention does the same).
            weight = torch.cat([self.W_q.weight, self.W_k.weight, self.W_v.weight])  # (3 d, d)
            bias = None
            if self.W_q.bias is not None:
                bias = torch.cat([self.W_q.bias, self.W_k.bias, self.W_v.bias])  # (3 d,)
            widths = [self.d_model, self.W_k.out_features, self.W_v.out_features]
            q, k, v = F.linear(query, weight, bias).split(widths, dim=-1)  # (B, L, width)
        else:
            q, k, v = self.W_q(query), self.W_k(key), self.W_v(value)  # (B, L, width)
        kv_heads = self.num_kv_heads
        q = self._split_heads(q, self.num_heads)  # (B, H, Lq, d_k)
        return (
            q,
            self._split_heads(k, kv_heads),
            self._split_heads(v, kv_heads),
        )  # (B, H_kv, Lk, d_k)

    def _split_heads(self, x: Tensor, heads: int) -> Tensor:
        """``(B, L, heads * d_k) -> (B, heads, L, d_k)`` without copying."""
        batch, length, _ = x.shape
        x = x.view(batch, length, heads, self.d_k)  # (B, L, heads, d_k)
        return x.transpose(1, 2)  # (B, heads, L, d_k)

    def _rotate(self, q: Tensor, k: Tensor, past: int) -> tuple[Tensor, Tensor]:
        """RoPE on queries ``(B, H, Lq, d_k)`` and keys ``(B, H_kv, Lk, d_k)`` at
        positions ``past, past + 1, ...``."""
        q_len, k_len = q.shape[-2], k.shape[-2]
        positions = torch.arange(past, past + max(q_len, k_len), device=q.device)
        cos, sin = _rope_cos_sin(positions, self.d_k, base=self.rope_base, dtype=q.dtype)
        q = _rotate_pairs(q, cos[:q_len], sin[:q_len])  # (B, H, Lq, d_k)
        return q, _rotate_pairs(k, cos[:k_len], sin[:k_len])  # (B, H_kv, Lk, d_k)

    def _check_inputs(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None,
        kv_cache: LayerKVCache | None = None,
    ) -> Tensor | None:
        """Validate the inputs of :meth:`forward`; return the mask as a bool
        keep-mask, or ``None``."""
        for name, t in (("query", query), ("key", key), ("value", value)):
            self._check_input(name, t)
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(
                "query, key and value must have the same batch size B (dim 0), got "
                f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
            )
        if key.shape[1] != value.shape[1]:
            raise ValueError(
                "key and value must have the same length Lk (dim 1), got "
                f"key {tuple(key.shape)} and value {tuple(value.shape)}"
            )
        return self._check_mask(mask, query.shape[0], query.shape[1], key.shape[1], kv_cache)

    def _check_input(self, name: str, t: object) -> None:
        """``t`` must be a ``(B, L, d_model)`` tensor of the module's dtype and device."""
        weight = self.W_q.weight
        check_tensor(name, t, min_dim=3)
        if t.dim() != 3 or t.shape[-1] != self.d_model:
            raise ValueError(
                f"{name} must have shape (B, L, d_model) = (B, L, {self.d_model}), "
                f"got {tuple(t.shape)}"
            )
        if t.device != weight.device:
            raise ValueError(
                f"{name} must be on the module's device {weight.device}, got {t.device}"
            )
        if t.dtype != weight.dtype:
            raise TypeError(
                f"{name} must have the module's dtype {weight.dtype}, got {t.dtype} "
                f"(convert the module with .to({t.dtype}) or the input with .to({weight.dtype}))"
            )

    def _check_mask(
        self,
        mask: object,
        batch: int,
        q_len: int,
        k_len: int,
        kv_cache: LayerKVCache | None = None,
    ) -> Tensor | None:
        """Check ``kv_cache`` and ``mask`` against the scores ``(B, H, Lq, T + Lk)``
        (``T`` cached keys come first); return the mask as bool, or ``None``."""
        past = self._check_cache(kv_cache, batch)
        if mask is None:
            return None
        if isinstance(mask, Tensor) and mask.dim() not in (2, 4):
            # A 3-D mask would broadcast (B, Lq, Lk) against (H, Lq, Lk): refuse it.
            raise ValueError(
                "mask must have shape (Lq, Lk), (B, 1, Lq, Lk), (B, H, Lq, Lk) or "
                f"(B, 1, 1, Lk), got {tuple(mask.shape)} (for a (B, Lq, Lk) mask "
                "pass mask[:, None])"
            )
        scores_shape = (batch, self.num_heads, q_len, past + k_len)
        return to_bool(check_mask(mask, scores_shape, device=self.W_q.weight.device))

    def _check_cache(self, kv_cache: object, batch: int) -> int:
        """``kv_cache`` is ``None`` or a :class:`LayerKVCache` of this batch and
        heads; return the number of cached positions."""
        if kv_cache is None:
            return 0
        if not isinstance(kv_cache, LayerKVCache):
            raise TypeError(
                f"kv_cache must be a LayerKVCache or None, got {type(kv_cache).__name__}"
            )
        cached = kv_cache.key
        if cached is not None and cached.shape[:2] != (batch, self.num_kv_heads):
            raise ValueError(
                f"kv_cache holds keys of shape {tuple(cached.shape)} (B, H_kv, T, d_k), "
                f"which do not fit B={batch} and H_kv={self.num_kv_heads}"
            )
        return len(kv_cache)

    @classmethod
    def from_torch(
        cls, module: nn.MultiheadAttention, *, backend: str = "lib"
    ) -> MultiHeadAttention:
        """Build a module that computes the same function as a batch-first
        ``nn.MultiheadAttention``.

        Copies ``in_proj_weight``/``in_proj_bias`` (rows ``[0, d)``, ``[d, 2d)``,
        ``[2d, 3d)`` are the query, key and value projections) into ``W_q``,
        ``W_k``, ``W_v`` and ``out_proj`` into ``W_o``; dropout, device and dtype
        are kept. Remember to convert masks: torch's bool ``True`` = blocked, ours
        ``True`` = may attend (``mask = ~attn_mask``; a ``key_padding_mask (B, Lk)``
        becomes ``~key_padding_mask[:, None, None, :]``).

        Explained in chapter 6, *Multi-head attention*.

        Args:
            module: an ``nn.MultiheadAttention`` built with ``batch_first=True``
                and without ``kdim``/``vdim``, ``add_bias_kv`` or ``add_zero_attn``.
            backend: attention backend of the new module.

        Returns:
            A new :class:`~attention_lib.MultiHeadAttention` with copied parameters (in the same
            training/eval mode as ``module``).

        Raises:
            TypeError: if ``module`` is not an ``nn.MultiheadAttention``.
            ValueError: if ``module`` uses a feature this class does not have.
        """
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(
                f"module must be a torch.nn.MultiheadAttention, got {type(module).__name__}"
            )
        if not module.batch_first:
            raise ValueError(
                "module must be built with batch_first=True (inputs (B, L, d_model)), "
                "got batch_first=False"
            )
        if not module.kdim == module.vdim == module.embed_dim:
            raise ValueError(
                f"module must have kdim == vdim == embed_dim={module.embed_dim}, got "
                f"kdim={module.kdim} and vdim={module.vdim}"
            )
        if module.bias_k is not None or module.bias_v is not None:
            raise ValueError("module must be built with add_bias_kv=False, got add_bias_kv=True")
        if module.add_zero_attn:
            raise ValueError(
                "module must be built with add_zero_attn=False, got add_zero_attn=True"
            )
        d_model = module.embed_dim
        weight = module.in_proj_weight
        ours = cls(
            d_model,
            module.num_heads,
            dropout=module.dropout,
            bias=module.in_proj_bias is not None,
            backend=backend,
            device=weight.device,
            dtype=weight.dtype,
        )
        with torch.no_grad():
            for i, linear in enumerate((ours.W_q, ours.W_k, ours.W_v)):
                linear.weight.copy_(weight[i * d_model : (i + 1) * d_model])  # (d_model, d_model)
                if linear.bias is not None:
                    linear.bias.copy_(module.in_proj_bias[i * d_model : (i + 1) * d_model])
            ours.W_o.weight.copy_(module.out_proj.weight)
            if ours.W_o.bias is not None:
                ours.W_o.bias.copy_(module.out_proj.bias)
        return ours.train(module.training)

    @classmethod
    def from_hf_llama(cls, module: nn.Module, *, backend: str = "lib") -> MultiHeadAttention:
        """Build the module that computes the same function as a 🤗 transformers
        ``LlamaAttention`` (tiny configurations with random weights are enough).

        Copies ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj`` into ``W_q``,
        ``W_k``, ``W_v`` and ``W_o``, and reads ``num_key_value_heads`` and the
        RoPE base (``rope_parameters["rope_theta"]``) from the module's config.
        transformers' layer takes the rotary ``position_embeddings`` and the mask
        from its caller; this module computes the rotations itself, for positions
        ``0 .. L-1`` (continued after a ``kv_cache``), and takes a keep-mask (pass
        ``is_causal=True`` for the decoder's causal mask, or
        :func:`~attention_lib.causal_mask` with ``window`` for a Mistral-style
        sliding window). Other layers with Llama's layout (``MistralAttention``)
        are read the same way; transformers itself is not imported.

        Explained in chapter 10, *Attention in today's LLMs*.

        Args:
            module: a ``transformers.models.llama.modeling_llama.LlamaAttention``
                with the default RoPE, ``head_dim * num_attention_heads ==
                hidden_size``, and a bias in all four projections or in none.
            backend: attention backend of the new module.

        Returns:
            A new :class:`~attention_lib.MultiHeadAttention` with copied
            parameters, in the training/eval mode of ``module``.

        Raises:
            TypeError: if ``module`` does not have LlamaAttention's projections
                and config.
            ValueError: if it uses a feature this class does not have (a scaled
                RoPE type, a head width other than ``hidden_size // heads``, or
                biases in some projections only).
        """
        names = ("q_proj", "k_proj", "v_proj", "o_proj")
        config = getattr(module, "config", None)
        if not all(isinstance(getattr(module, n, None), nn.Linear) for n in names) or not all(
            hasattr(config, a)
            for a in (
                "num_attention_heads",
                "num_key_value_heads",
                "hidden_size",
                "rope_parameters",
            )
        ):
            raise TypeError(
                "module must be a transformers LlamaAttention (nn.Linear q_proj, k_proj, "
                f"v_proj, o_proj and a LlamaConfig), got {type(module).__name__}"
            )
        heads, d_model = config.num_attention_heads, config.hidden_size
        if module.head_dim * heads != d_model:
            raise ValueError(
                f"module must have head_dim * num_attention_heads == hidden_size, got "
                f"head_dim={module.head_dim}, num_attention_heads={heads}, "
                f"hidden_size={d_model}"
            )
        rope = config.rope_parameters
        if rope.get("rope_type", "default") != "default":
            raise ValueError(
                f"module must use the default RoPE, got rope_type={rope['rope_type']!r}"
            )
        projections = [getattr(module, n) for n in names]
        has_bias = {p.bias is not None for p in projections}
        if len(has_bias) != 1:
            raise ValueError(
                "module must have a bias in all four projections or in none, got "
                + ", ".join(f"{n}: {p.bias is not None}" for n, p in zip(names, projections))
            )
        weight = module.q_proj.weight
        ours = cls(
            d_model,
            heads,
            dropout=float(config.attention_dropout),
            bias=has_bias.pop(),
            backend=backend,
            num_kv_heads=config.num_key_value_heads,
            rope_base=float(rope["rope_theta"]),
            device=weight.device,
            dtype=weight.dtype,
        )
        with torch.no_grad():
            for linear, theirs in zip((ours.W_q, ours.W_k, ours.W_v, ours.W_o), projections):
                linear.weight.copy_(theirs.weight)
                if linear.bias is not None:
                    linear.bias.copy_(theirs.bias)
        return ours.train(module.training)


def _group_heads(keep: Tensor | None, kv_heads: int, group: int) -> Tensor | None:
    """A keep-mask for the scores ``(B, H, Lq, Lk)`` reshaped for grouped heads
    ``(B, H_kv, G, Lq, Lk)``: a per-head mask is split, the others broadcast."""
    if keep is None or keep.dim() < 4:
        return keep  # (Lq, Lk) broadcasts as it is
    if keep.shape[1] == 1:
        return keep.unsqueeze(2)  # (B, 1, 1, Lq, Lk)
    return keep.unflatten(1, (kv_heads, group))  # (B, H_kv, G, Lq, Lk)
