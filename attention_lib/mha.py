"""Multi-head attention: project, split into heads, attend, merge, project.

Explained in chapter 6, *Multi-head attention*.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .backends import BACKENDS, lib_attention
from .convert import AttentionConverters
from .kv_cache import ChunkKVCache, LayerKVCache
from .masks import Causal
from .protocols import Step
from .rope import check_d_head, check_rope_scaling, rope_cos_sin, rotate_pairs
from .tiled import check_block_size
from .validation import (
    check_base,
    check_bool,
    check_choice,
    check_dropout_p,
    check_hidden,
    check_int,
    check_mask,
    check_positions,
    check_real,
    check_same,
)


class MultiHeadAttention(nn.Module, AttentionConverters):
    r"""Multi-head attention with batch-first inputs and pluggable attention.

    .. math::

        \mathrm{head}_i &= \mathrm{Attention}(Q W_q^{(i)}, K W_k^{(i)},

        &\qquad V W_v^{(i)}),

        \mathrm{MHA}(Q, K, V) &= \mathrm{concat}(\mathrm{head}_1, \dots, \mathrm{head}_H)

        &\qquad W_o

    Each ``nn.Linear(d_model, d_model)`` projection is cut into ``num_heads``
    slices of width ``d_k = d_model // num_heads`` (a ``view`` + ``transpose``,
    no copy), the heads attend independently and their outputs are concatenated
    and mixed by ``W_o``.

    Explained in chapter 6, *Multi-head attention*; backends also in chapter 11,
    *Efficient attention*; QK-norm, soft-capping, sinks and gates in chapter 15,
    *Where attention goes*.

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
    (:func:`~attention_lib.tiled.tiled_attention`, chapter 11, with ``block_size``).
    A fused kernel cannot return the attention weights, so
    ``need_weights=True`` always uses the lib computation, whatever the backend.

    **Grouped-query attention and RoPE** (chapter 10). With ``num_kv_heads``
    below ``num_heads``, ``W_k`` and ``W_v`` have only ``num_kv_heads * d_k``
    outputs, and query head ``h`` reads key/value head
    ``h // (num_heads // num_kv_heads)`` (grouped-query attention; ``1`` is
    multi-query attention). No backend copies the shared heads (see
    :mod:`attention_lib.backends`), and a ``kv_cache`` stores only the
    ``num_kv_heads`` heads. With ``rope_base``, the queries and keys are rotated
    by :func:`~attention_lib.apply_rope` after the split into heads, at
    ``positions`` (by default ``0, 1, ...``, continued after the cached
    positions with a ``kv_cache``). :meth:`from_hf_llama` builds the module of a
    🤗 transformers ``LlamaAttention``, or refuses a layer it cannot reproduce.

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
        rope_scaling: with ``rope_base``, a RoPE ``scaling`` dict in 🤗
            transformers' format (``"linear"``, ``"dynamic"``, ``"yarn"``,
            ``"llama3"``; see :func:`~attention_lib.rope_frequencies`; chapter
            16). ``"dynamic"`` takes its length from each call's
            positions and is refused with a ``kv_cache`` (cached keys were
            turned at other speeds). ``None`` (default) for plain RoPE.
        scale: multiplier of the scores, as ``F.scaled_dot_product_attention``'s
            ``scale``; ``None`` (default) means ``1 / sqrt(d_k)``.
        window: a causal sliding window (Mistral, Gemma 2's local layers): with
            ``is_causal=True`` a query sees only itself and the ``window - 1``
            keys before it (chapter 10); the module then refuses calls without
            ``is_causal``. ``None`` (default) for no window.
        chunk_size: chunked attention (Llama 4's local layers): with
            ``is_causal=True`` a query sees only the keys of its own chunk of
            ``chunk_size`` positions (chapter 16); refuses
            calls without ``is_causal`` and a cache that does not start a chunk
            (use a :class:`~attention_lib.ChunkKVCache`). ``None`` for none.
        qk_norm: QK-norm (Qwen3, OLMo 2): an ``nn.RMSNorm`` over each head's
            width, with a learned weight, on the queries and on the keys,
            before RoPE (chapter 15).
        softcap: soft-capping (Gemma 2): scores become ``softcap *
            tanh(scores / softcap)`` (chapter 15); ``backend="lib"`` only.
        sink: one learned attention-sink logit per head (gpt-oss), a virtual
            key with a zero value that takes a share of every row's softmax
            (chapter 15); ``backend="lib"`` only.
        gate: an output gate (Qwen3-Next): ``sigmoid(W_g x)``, from the
            layer's input ``query``, multiplies the heads' concatenated output
            before ``W_o`` (chapter 15).
        head_dim: the width ``d_k`` of each head when it is not ``d_model //
            num_heads`` (Qwen3, Gemma 3): ``W_q`` then has ``num_heads *
            head_dim`` outputs and ``W_o`` as many inputs. ``None`` (default)
            for ``d_model // num_heads``.
        rope_dim: partial RoPE (Qwen3-Next, a quarter of each head): with
            ``rope_base``, only the first ``rope_dim`` coordinates of each
            query and key head turn, at the speeds of a head of width
            ``rope_dim``; the others carry no position (chapter 21). ``None``
            (default) for all ``d_k``.
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
        rope_dim: the coordinates of each head that RoPE turns (``d_k`` unless
            partial).
        rope_scaling: the RoPE scaling dict, or ``None``.
        scale: the scores' multiplier, or ``None`` for ``1 / sqrt(d_k)``.
        window: the sliding window, or ``None``.
        chunk_size: the attention chunk, or ``None``.
        dropout: dropout probability on the attention weights.
        backend: name of the attention backend (assigning another name switches
            backend; an unknown name raises ``ValueError``).
        block_size: the tiled backend's block size, or ``None``.
        q_norm, k_norm: the QK-norm ``nn.RMSNorm(d_k)`` modules, or ``None``.
        softcap: the soft-cap, or ``None``.
        sink: ``nn.Parameter`` of shape ``(H,)``, the sink logits, or ``None``.
        W_g: the gate projection ``nn.Linear(d_model, d_model)``, or ``None``.

    Raises:
        TypeError: if ``d_model``/``num_heads``/``block_size`` are not ints,
            ``dropout`` is not a number, ``bias`` not a bool or ``backend`` not
            a str.
        ValueError: if ``d_model % num_heads != 0``, ``dropout`` is outside
            ``[0, 1)``, ``backend`` is unknown, ``block_size`` is below 1 or
            given for a backend other than ``"tiled"``, ``num_kv_heads`` does
            not divide ``num_heads``, ``rope_base`` is given with an odd
            ``d_k`` or is not a number ``> 1``, ``scale`` is not ``> 0`` or
            ``window`` is below 1.

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
        rope_scaling: dict | None = None,
        scale: float | None = None,
        window: int | None = None,
        chunk_size: int | None = None,
        qk_norm: bool = False,
        softcap: float | None = None,
        sink: bool = False,
        gate: bool = False,
        head_dim: int | None = None,
        rope_dim: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model, minimum=1)
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.num_kv_heads = check_int("num_kv_heads", num_kv_heads, minimum=1)
        if (head_dim is None and d_model % num_heads) or num_heads % self.num_kv_heads:
            sizes = f"d_model={d_model}, num_heads={num_heads}, num_kv_heads={self.num_kv_heads}"
            raise ValueError(f"num_heads must divide d_model, num_kv_heads num_heads: {sizes}")
        self.d_k = d_model // num_heads
        if head_dim is not None:
            self.d_k = check_int("head_dim", head_dim, minimum=1)
        width = num_heads * self.d_k  # the heads' concatenated width (d_model by default)
        if rope_base is not None:
            rope_base = check_base(rope_base)
            check_d_head(rope_dim or self.d_k, name="d_k = d_model // num_heads or rope_dim")
        self.rope_dim = self.d_k if rope_dim is None else rope_dim
        if not 0 < self.rope_dim <= self.d_k or (rope_dim and rope_base is None):
            raise ValueError(f"rope_dim must be in (0, {self.d_k}] with rope_base, got {rope_dim}")
        self.rope_base = rope_base
        if rope_scaling is not None and rope_base is None:
            raise ValueError(f"rope_scaling={rope_scaling} needs a rope_base")
        self._scaling = None if rope_base is None else check_rope_scaling(rope_scaling, rope_base)
        self.rope_scaling = None if rope_scaling is None else dict(rope_scaling)
        self.scale = None if scale is None else check_real("scale", scale, above=0)
        self.window = None if window is None else check_int("window", window, minimum=1)
        self.chunk_size = (
            None if chunk_size is None else check_int("chunk_size", chunk_size, minimum=1)
        )
        self.softcap = None if softcap is None else check_real("softcap", softcap, above=0)
        factory = {"device": device, "dtype": dtype}
        # Where attention goes (chapter 15): one learned sink logit per head (gpt-oss).
        self.sink = (
            nn.Parameter(torch.zeros(num_heads, **factory)) if check_bool("sink", sink) else None
        )
        self.dropout = check_dropout_p(dropout, name="dropout")
        self.backend = backend  # checked by the property's setter
        if block_size is not None:
            check_choice("backend (with block_size)", backend, ["tiled"])
            block_size = check_block_size(block_size)
        self.block_size = block_size
        linear = {"bias": check_bool("bias", bias), **factory}
        kv_width = self.num_kv_heads * self.d_k
        self.W_q = nn.Linear(d_model, width, **linear)
        self.W_k = nn.Linear(d_model, kv_width, **linear)
        self.W_v = nn.Linear(d_model, kv_width, **linear)
        self.W_o = nn.Linear(width, d_model, **linear)
        # QK-norm (Qwen3, OLMo 2): RMSNorm over each head's width, before RoPE.
        self.q_norm = self.k_norm = None
        if check_bool("qk_norm", qk_norm):
            self.q_norm, self.k_norm = (nn.RMSNorm(self.d_k, eps=1e-6, **factory) for _ in "qk")
        # Output gate (Qwen3-Next): sigmoid(W_g x) scales the heads' output before W_o.
        self.W_g = nn.Linear(d_model, width, **linear) if check_bool("gate", gate) else None

    @property
    def backend(self) -> str:
        """The name of the attention backend (see :mod:`attention_lib.backends`)."""
        return self._backend

    @backend.setter
    def backend(self, name: str) -> None:
        check_choice("backend", name, tuple(BACKENDS))
        if name != "lib" and (self.softcap is not None or self.sink is not None):
            raise ValueError(f"softcap and sink are computed by backend='lib' only, not {name!r}")
        self._backend = name

    def extra_repr(self) -> str:
        options = {
            "num_kv_heads": None if self.num_kv_heads == self.num_heads else self.num_kv_heads,
            "dropout": self.dropout,
            "backend": self.backend,
            "block_size": self.block_size,
            "rope_base": self.rope_base,
            "rope_scaling": self.rope_scaling,
            "scale": self.scale,
            "window": self.window,
            "chunk_size": self.chunk_size,
            "qk_norm": self.q_norm is not None or None,
            "softcap": self.softcap,
            "sink": self.sink is not None or None,
            "gate": self.W_g is not None or None,
            "head_dim": None if self.d_k * self.num_heads == self.d_model else self.d_k,
            "rope_dim": None if self.rope_dim == self.d_k else self.rope_dim,
        }
        shown = [f"{k}={v!r}" for k, v in options.items() if v is not None]
        return ", ".join([f"d_model={self.d_model}, num_heads={self.num_heads}", *shown])

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        *,
        is_causal: bool = False,
        need_weights: bool = False,
        kv_cache: LayerKVCache | None = None,
        positions: Tensor | None = None,
        step: Step | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value`` with every head.

        The public entry point: it validates its arguments, turns them into
        what the computation needs (a bool keep-mask, a
        :class:`~attention_lib.masks.Causal` alignment, the RoPE positions) and
        passes them down to :meth:`attend`, which checks nothing.

        Explained in chapter 6, *Multi-head attention*; the cache in chapter 9,
        *Attention that writes*; RoPE, grouped heads and windows in chapter 10,
        *Attention in today's LLMs*.

        Args:
            query: ``(B, Lq, d_model)``.
            key: ``(B, Lk, d_model)``.
            value: ``(B, Lk, d_model)``.
            mask: keep-mask (bool ``True`` / 1 = may attend) of shape
                ``(Lq, Lk)``, ``(B, 1, Lq, Lk)``, ``(B, H, Lq, Lk)`` or
                ``(B, 1, 1, Lk)`` (:func:`~attention_lib.padding_mask`), where
                ``Lk`` counts the cached keys too; ``None`` for no mask.
            is_causal: each query attends only to the keys at or before its
                own position (combined with ``mask``). Without a cache the
                alignment is ``F.scaled_dot_product_attention``'s (top-left:
                query ``i`` sees keys ``0 .. i``); with a ``kv_cache`` of ``T``
                keys the new queries are the *last* positions (bottom-right:
                query ``i`` sees keys ``0 .. T + i``). With the module's
                ``window``, only the last ``window`` of those.
            need_weights: also return the per-head attention weights (computed
                with the lib backend, whatever ``backend`` is).
            kv_cache: a :class:`~attention_lib.LayerKVCache`: the projected keys
                and values are appended to it, and the queries attend to every
                key it holds (chapter 9).
            positions: with ``rope_base``, the integer positions of the new
                tokens, ``(Lq,)`` or ``(B, Lq)`` (self-attention, ``Lq == Lk``);
                ``None`` means ``p, p + 1, ...`` after the ``p`` positions the
                cache has seen. Ignored without RoPE.
            step: the unchecked path of a model's self-attention sublayer (the
                mixer protocol of :mod:`attention_lib.protocols`): a
                :class:`~attention_lib.protocols.Step` the model prepared and
                validated; ``query`` is the layer's input and only
                ``kv_cache`` and ``need_weights`` are read besides. ``None``
                (default): the checked call described above.

        Returns:
            ``output (B, Lq, d_model)``, or ``(output, weights)`` with
            ``weights (B, H, Lq, Lk)`` if ``need_weights`` (per head; average
            over dim 1 to compare with ``nn.MultiheadAttention``'s default).

        Raises:
            TypeError: on non-tensor or non-floating inputs, a dtype that
                differs from the parameters', a mask of unsupported type or
                dtype, a ``kv_cache`` that is not a ``LayerKVCache``, or flags
                that are not bools.
            ValueError: on inputs that are not ``(B, L, d_model)``, mismatched
                batch sizes, lengths or devices, a mask that does not broadcast
                to ``(B, H, Lq, Lk)`` or is not 0/1, a cache that holds another
                batch, heads, head width or dtype, ``positions`` that do not fit,
                or a ``window`` without ``is_causal``.
        """
        if step is not None:  # a model's call (the mixer protocol): checked by the model
            return self.mix(query, step, kv_cache, need_weights=need_weights)
        weight = self.W_q.weight
        check_hidden(self.d_model, weight, query=query, key=key, value=value)
        batch, q_len, k_len = query.shape[0], query.shape[1], key.shape[1]
        check_same("batch size B", query=batch, key=key.shape[0], value=value.shape[0])
        check_same("length Lk", key=k_len, value=value.shape[1])
        check_bool("is_causal", is_causal)
        check_bool("need_weights", need_weights)
        past = 0
        if kv_cache is not None:
            self.check_cache(kv_cache, batch, weight.dtype, weight.device)
            past = len(kv_cache)
        if mask is not None:
            if isinstance(mask, Tensor) and mask.dim() == 3:  # would broadcast against (H, Lq, Lk)
                raise ValueError("mask must be (Lq, Lk) or (B, 1 or H, Lq, Lk): pass mask[:, None]")
            mask = check_mask(
                mask, (batch, self.num_heads, q_len, past + k_len), device=weight.device
            )
        if (self.window or self.chunk_size) and not is_causal:
            raise ValueError(f"window={self.window}, chunk_size={self.chunk_size}: pass is_causal")
        if self.rope_base is not None:
            start = 0 if kv_cache is None else kv_cache.position
            if positions is None:
                positions = torch.arange(start, start + max(q_len, k_len), device=weight.device)
            else:  # the queries' positions are the keys' too: self-attention
                check_same("length (with positions)", query=q_len, key=k_len)
                check_positions(positions, (batch, q_len), weight.device)
        causal = Causal(past, self.window, self.chunk_size) if is_causal else None
        return self.attend(
            query,
            key,
            value,
            mask,
            causal=causal,
            need_weights=need_weights,
            kv_cache=kv_cache,
            positions=positions,
        )

    def attend(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        keep: Tensor | None,
        *,
        causal: Causal | None,
        need_weights: bool = False,
        kv_cache: LayerKVCache | None = None,
        positions: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The computation of :meth:`forward`, without checks: project, split into
        heads, rotate (RoPE, at ``positions``), append to ``kv_cache``, attend
        with the backend, merge and project. ``keep`` is ``None`` or a bool
        keep-mask and ``causal`` ``None`` or a :class:`~attention_lib.masks.Causal`,
        as :meth:`forward` prepares them."""
        angles = None
        if self.rope_base is not None:
            angles = rope_cos_sin(
                positions,
                self.rope_dim,
                base=self.rope_base,
                dtype=query.dtype,
                scaling=self._scaling,
            )  # (.., L, rope_dim / 2) each
        return self._attend(query, key, value, keep, causal, need_weights, kv_cache, angles)

    def mix(
        self,
        x: Tensor,
        step: Step,
        cache: LayerKVCache | None,
        *,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Self-attention of the new tokens ``x`` as a decoder's token mixer (the
        protocol of :mod:`attention_lib.protocols`): the ``step`` the model
        prepared once (positions, RoPE tables, padding, causality), no checks.

        Explained in chapter 9, *Attention that writes*.
        """
        past = 0 if cache is None else len(cache)
        keep = None if step.keep is None else step.keep_for(past + x.shape[1])  # (B, 1, 1, T + L)
        causal = Causal(past, self.window, self.chunk_size) if step.causal else None
        angles = None
        if self.rope_base is not None:
            angles = step.rope(self.rope_dim, self.rope_base, x.dtype, self._scaling)
        return self._attend(x, x, x, keep, causal, need_weights, cache, angles)

    def check_cache(
        self, cache: object, batch: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        """Refuse a ``cache`` this layer cannot continue for a batch of ``batch``
        rows of ``dtype`` on ``device``: what :meth:`forward` checks of its
        ``kv_cache``, for a model that validates every layer's cache once.

        Raises:
            TypeError: if ``cache`` is not a :class:`~attention_lib.LayerKVCache`.
            ValueError: naming what does not fit.
        """
        if not isinstance(cache, LayerKVCache):  # per layer and call: no check_instance call
            raise TypeError(f"kv_cache must be a LayerKVCache, got {type(cache).__name__}")
        cache.check_fits(batch, self.num_kv_heads, self.d_k, dtype, device)
        if self.chunk_size and (cache.dropped % self.chunk_size or cache.sink_tokens is not None):
            raise ValueError(f"kv_cache does not start a chunk of {self.chunk_size}: ChunkKVCache")
        if dict(self._scaling or ()).get("rope_type") == "dynamic":
            raise ValueError("dynamic RoPE scaling changes with the length: no kv_cache")

    def make_cache(self) -> LayerKVCache:
        """An empty cache of what this layer can see: a
        :class:`~attention_lib.ChunkKVCache` with ``chunk_size``, a rolling
        :class:`~attention_lib.LayerKVCache` with ``window``, else a full one.

        Explained in chapter 16, *Long contexts*.
        """
        if self.chunk_size is not None:
            return ChunkKVCache(self.chunk_size)
        return LayerKVCache(keep_last=self.window)

    def _attend(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        keep: Tensor | None,
        causal: Causal | None,
        need_weights: bool,
        kv_cache: LayerKVCache | None,
        angles: tuple[Tensor, Tensor] | None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """:meth:`attend` with the RoPE ``(cos, sin)`` tables already computed."""
        batch, q_len, _ = query.shape
        q, k, v = self._project(query, key, value)  # (B, H, Lq, d_k), 2 x (B, H_kv, Lk, d_k)
        if self.q_norm is not None:  # QK-norm: unit RMS per head, then a learned weight
            q, k = self.q_norm(q), self.k_norm(k)
        if angles is not None:
            q, k = self._rotate(q, k, *angles)
        in_place = getattr(kv_cache, "attend_in_place", None)  # paged, read in place (ch. 12)
        if kv_cache is not None and in_place is None:
            k, v = kv_cache.update(k, v)  # (B, H_kv, T + Lk, d_k): cached keys first
        options = {
            "causal": causal,
            "dropout_p": self.dropout if self.training else 0.0,
            "scale": self.scale,
        }
        if self.softcap is not None or self.sink is not None:  # the lib backend's options
            options.update(softcap=self.softcap, sink=self.sink)
        weights = None
        if in_place is not None:  # writes k, v into the pool's blocks, walks them
            attended = in_place(q, k, v, self, need_weights)  # (B, H, Lq, d_k)
        elif need_weights:  # a fused kernel cannot return the weights: the lib computation
            attended, weights = lib_attention(q, k, v, keep, **options)  # (B, H, Lq, ...)
        else:
            if self.block_size is not None:
                options["block_size"] = self.block_size
            attended = BACKENDS[self._backend](q, k, v, keep, **options)  # (B, H, Lq, d_k)
        merged = attended.transpose(1, 2).reshape(batch, q_len, self.num_heads * self.d_k)
        if self.W_g is not None:  # output gate, from the layer's input
            merged = merged * torch.sigmoid(self.W_g(query))  # (B, Lq, d_model)
        output = self.W_o(merged)  # (B, Lq, d_model)
        return (output, weights) if need_weights else output

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``W_q``, ``W_k``, ``W_v``, then split into heads: ``(B, L, d_model) -> (B, H, L, d_k)``."""
        if query is key and key is value and query.shape[0] * query.shape[1] >= 16:
            # Self-attention: one matmul with the three weight matrices stacked does
            # the work of three (chapter 6; nn.MultiheadAttention does the same). For a
            # few rows (a decode step) stacking costs as much as the matmul: three it is.
            weight = torch.cat([self.W_q.weight, self.W_k.weight, self.W_v.weight])  # (3 d, d)
            bias = None
            if self.W_q.bias is not None:
                bias = torch.cat([self.W_q.bias, self.W_k.bias, self.W_v.bias])  # (3 d,)
            widths = [self.W_q.out_features, self.W_k.out_features, self.W_v.out_features]
            q, k, v = F.linear(query, weight, bias).split(widths, dim=-1)  # (B, L, width)
        else:
            q, k, v = self.W_q(query), self.W_k(key), self.W_v(value)  # (B, L, width)
        # split into heads without copying: (B, L, heads * d_k) -> (B, heads, L, d_k)
        batch, d_k = query.shape[0], self.d_k
        q = q.view(batch, q.shape[1], self.num_heads, d_k).transpose(1, 2)  # (B, H, Lq, d_k)
        k = k.view(batch, k.shape[1], self.num_kv_heads, d_k).transpose(1, 2)  # (B, H_kv, Lk, d_k)
        return q, k, v.view(batch, v.shape[1], self.num_kv_heads, d_k).transpose(1, 2)

    def _rotate(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """RoPE on queries ``(B, H, Lq, d_k)`` and keys ``(B, H_kv, Lk, d_k)`` with the
        ``cos``/``sin`` ``(L, r / 2)`` or ``(B, L, r / 2)`` of their positions
        (the first ``Lq``/``Lk`` of them), ``r = rope_dim``: partial RoPE turns
        the first ``r`` coordinates of each head and keeps the others."""
        q_len, k_len, r = q.shape[-2], k.shape[-2], self.rope_dim
        if cos.dim() == 3:  # per-sequence positions: broadcast over the heads
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, L, r / 2)
        turned = [
            rotate_pairs(t[..., :r], cos[..., :n, :], sin[..., :n, :])  # (B, H or H_kv, n, r)
            for t, n in ((q, q_len), (k, k_len))
        ]
        if r == self.d_k:
            return turned[0], turned[1]
        # partial RoPE (Qwen3-Next): the other d_k - r coordinates carry no position
        return torch.cat([turned[0], q[..., r:]], -1), torch.cat([turned[1], k[..., r:]], -1)
