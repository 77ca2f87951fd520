"""A Gated DeltaNet layer (Qwen3-Next's linear attention) and its recurrent-state cache.

:class:`GatedDeltaNet` is a token-mixing sublayer with the interface of a
self-attention layer, ``(B, L, d_model) -> (B, L, d_model)``, built on
:func:`~attention_lib.gated_delta_rule`. It is the layer of Qwen3-Next's
``"linear_attention"`` layers (🤗 transformers' ``Qwen3NextGatedDeltaNet``):

.. code-block:: text

    q, k, v = SiLU(causal depthwise conv(W_q x, W_k x, W_v x))   (a short conv, 4 taps)
    q, k    = q / ||q||, k / ||k||                         (per head)
    beta    = sigmoid(W_b x),   g = -exp(A_log) * softplus(W_a x + dt_bias)
    o       = gated_delta_rule(q, k, v, g, beta)            (B, H, L, d_v)
    out     = W_o( RMSNorm(o) * SiLU(W_z x) )               (per head, then merged)

With a cache (:class:`LayerStateCache`) it keeps a fixed-size state instead of
keys and values: the ``(B, H, d_k, d_v)`` matrix ``S`` and the last
``conv_size - 1`` inputs of the short convolution. Its size does not grow with
the number of tokens.

Explained in chapter 18, *Attention without softmax*.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .kv_cache import Snapshots
from .linear_attention import gated_delta_core
from .protocols import Step
from .validation import check_int, check_same, check_tensor


def _nbytes(t: Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


class LayerStateCache(Snapshots):
    """The cache of one linear-attention layer: a state of fixed size.

    Where a :class:`~attention_lib.LayerKVCache` stores a key and a value per
    token, this keeps the layer's recurrent state ``S`` after the last token
    and, for the short convolution, the last ``conv_size - 1`` inputs it saw.
    :class:`GatedDeltaNet` reads and replaces both on every call.

    Explained in chapter 18, *Attention without softmax*.

    Attributes:
        state: ``(B, H, d_k, d_v)`` recurrent state, or ``None`` while empty.
        conv: ``(B, channels, conv_size - 1)`` last inputs of the short
            convolution, or ``None`` (empty, or a layer without it).
        position: the number of tokens seen: the position of the next token.
    """

    def __init__(self) -> None:
        self.state: Tensor | None = None
        self.conv: Tensor | None = None
        self.position = 0

    _FIELDS = ("state", "conv", "position")

    def __len__(self) -> int:
        """Tokens *stored*: none, whatever the number seen (see :attr:`position`)."""
        return 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the state and the convolution's inputs (constant in the tokens)."""
        return _nbytes(self.state) + _nbytes(self.conv)

    @property
    def numbers_per_token(self) -> int:
        """``0``: nothing is kept per token (the state has a fixed size)."""
        return 0

    def select(self, rows: Tensor) -> None:
        """Keep the batch rows ``rows`` (a 1-D integer tensor), in that order
        (the cache protocol of :mod:`attention_lib.protocols`). No checks."""
        self.state = None if self.state is None else self.state[rows]
        self.conv = None if self.conv is None else self.conv[rows]
        self._saved = None  # another batch

    def crop(self, n: int) -> None:
        """Forget the last ``n`` tokens: the state has mixed every token in, so
        only ``n = 0``, or going back to a :meth:`snapshot` taken ``n`` tokens
        ago (speculative decoding's rollback, chapter 13), is possible.

        Raises:
            ValueError: otherwise.
        """
        if not self._restore(check_int("n", n, minimum=0)) and n:
            raise ValueError(
                f"a recurrent state cannot forget tokens: cannot crop {n} "
                "(take a snapshot() where you may come back to)"
            )


class RecurrentMixer(nn.Module):
    """What the token mixers with a fixed-size state share (chapter 18).

    :class:`GatedDeltaNet`, Kimi Delta Attention
    (:class:`~attention_lib.kda.KimiDeltaAttention`) and Mamba-2
    (:class:`~attention_lib.mamba2.Mamba2`) mix the tokens causally with
    themselves, use no positions and keep a :class:`LayerStateCache`: the
    checked ``forward``, the protocol's ``mix``, ``make_cache`` and
    ``check_cache``, and the causal short convolution are written once here;
    a subclass computes ``_mix(x, cache, keep)``.

    The base of chapter 18's fixed-state mixers.
    """

    def forward(
        self,
        x: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        *,
        is_causal: bool = True,
        need_weights: bool = False,
        kv_cache: LayerStateCache | None = None,
        positions: Tensor | None = None,
        step: Step | None = None,
    ) -> Tensor:
        """Mix the tokens of ``x``; with a cache, continue after its tokens.

        Called as a self-attention sublayer is (``layer(x, x, x, kv_cache=...)``,
        the way :class:`~attention_lib.EncoderLayer` calls its token mixer) or
        simply ``layer(x)``. It mixes ``x`` with itself, causally, and uses no
        positions (the order of the tokens is in the recurrence), so
        ``positions`` is ignored.

        Args:
            x: ``(B, L, d_model)``.
            key, value: ``None`` or ``x`` itself.
            mask: must be ``None``: a padding mask is not supported.
            is_causal: must be ``True``: the recurrence only looks back.
            need_weights: must be ``False``: there are no attention weights.
            kv_cache: a :class:`LayerStateCache` holding the state after the
                tokens before ``x`` (empty for a new sequence); it is replaced
                by the state after ``x``.
            positions: ignored.
            step: a model's call (the mixer protocol of
                :mod:`attention_lib.protocols`): the
                :class:`~attention_lib.protocols.Step` it prepared and
                validated; only ``kv_cache`` and ``need_weights`` are read
                besides. ``None``: the checked call.

        Returns:
            ``(B, L, d_model)``.

        Raises:
            TypeError: if ``x`` is not a floating tensor or ``kv_cache`` not a
                :class:`LayerStateCache`.
            ValueError: if ``x`` is not ``(B, L, d_model)``, the cache holds
                another batch or dtype, or the call asks for what the layer
                cannot do (a mask, weights, non-causal mixing, another key).
        """
        if step is not None:  # a model's call (the mixer protocol): checked by the model
            return self.mix(x, step, kv_cache, need_weights=need_weights)
        check_tensor("x", x, min_dim=3)
        check_same("d_model (last dim)", x=x.shape[-1], layer=self.d_model)
        others = [t for t in (key, value) if t is not None and t is not x]
        if mask is not None or need_weights or not is_causal or others:
            raise ValueError(
                f"{type(self).__name__} mixes x causally with itself: no mask, no weights"
            )
        if kv_cache is not None:
            self.check_cache(kv_cache, len(x), x.dtype, x.device)
        return self._mix(x, kv_cache, None)

    def mix(
        self, x: Tensor, step: Step, cache: LayerStateCache | None, *, need_weights: bool = False
    ) -> Tensor:
        """Mix the new tokens ``x`` as a decoder's token mixer (the protocol of
        :mod:`attention_lib.protocols`); no checks. Always causal, no positions;
        ``need_weights`` raises ``ValueError``. A padding keep-mask zeroes the
        padded tokens' inputs, as transformers' models do: a zero input
        writes nothing into a zero state, so a left-padded sequence computes
        what it computes alone (chapter 21).

        Chapter 18's fixed-state mixers inherit it.
        """
        if need_weights or not step.causal:
            raise ValueError(f"{type(self).__name__} mixes x causally with itself: no weights")
        keep = step.keep_for(x.shape[1])  # (B, 1, 1, L) or None
        if keep is not None:
            keep = keep[:, 0, 0, :, None].to(x.dtype)  # (B, L, 1)
            x = x * keep  # (B, L, d_model), padding zeroed
        return self._mix(x, cache, keep)

    def check_cache(
        self, cache: object, batch: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        """Refuse a ``cache`` this layer cannot continue (what :meth:`forward`
        checks of its ``kv_cache``), for a model that checks every layer's once.

        Raises:
            TypeError: if ``cache`` is not a :class:`LayerStateCache`.
            ValueError: if it holds another batch, dtype or device.
        """
        if not isinstance(cache, LayerStateCache):
            raise TypeError(f"kv_cache must be a LayerStateCache, got {type(cache).__name__}")
        state = cache.state  # float32 for float16 / bfloat16 x (the cores' precision)
        dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        held = None if state is None else (len(state), state.dtype, state.device)
        if held not in (None, given := (batch, dtype, device)):
            raise ValueError(f"kv_cache holds (B, dtype, device) {held}, not {given}")

    def make_cache(self) -> LayerStateCache:
        """An empty :class:`LayerStateCache`.

        Chapter 18's fixed-state mixers inherit it.
        """
        return LayerStateCache()

    def _mix(self, x: Tensor, cache: LayerStateCache | None, keep: Tensor | None) -> Tensor:
        """The layer's computation on checked input (``keep``: ``(B, L, 1)``
        padding keep-mask or ``None``, already applied to ``x``)."""
        raise NotImplementedError

    def _short_conv(self, qkv: Tensor, cache: LayerStateCache | None) -> Tensor:
        """Causal depthwise convolution + SiLU over ``(B, L, C)``; the cache
        supplies (and keeps) the ``conv_size - 1`` inputs before ``qkv``."""
        taps = self.conv.kernel_size[0]
        x = qkv.transpose(1, 2)  # (B, C, L)
        past = None if cache is None else cache.conv
        if past is None:  # the start of a sequence: zeros before it
            past = x.new_zeros(*x.shape[:2], taps - 1)
        x = torch.cat([past, x], dim=-1)  # (B, C, taps - 1 + L)
        if cache is not None:
            cache.conv = x[..., x.shape[-1] - (taps - 1) :].clone()  # (B, C, taps - 1)
        out = F.conv1d(x, self.conv.weight, self.conv.bias, groups=x.shape[1])  # (B, C, L)
        return F.silu(out).transpose(1, 2)  # (B, L, C)


class GatedDeltaNet(RecurrentMixer):
    """Gated DeltaNet: a linear-attention token mixer with a fixed-size state.

    A drop-in for the self-attention of a decoder block (Qwen3-Next uses it in
    three layers out of four). Its projections, short convolution, gates and
    norm are those of 🤗 transformers' ``Qwen3NextGatedDeltaNet``, including
    its grouped heads (Qwen3-Next: 16 query/key heads shared by 32 value
    heads); :meth:`from_hf` copies one.

    Explained in chapter 18, *Attention without softmax*.

    Args:
        d_model: model width.
        num_heads: heads ``H``: value heads, gates (``beta``, ``g``), states.
        head_dim: width of a head's values (and, by default, queries and
            keys); defaults to ``d_model // num_heads``.
        num_key_heads: query/key heads ``H_k``, dividing ``num_heads``: each
            serves ``H // H_k`` consecutive value heads (Qwen3-Next: 16 for
            32). Defaults to ``num_heads`` (one query/key head per value head).
        key_head_dim: width of a head's queries and keys (the state is
            ``(key_head_dim, head_dim)``); defaults to ``head_dim``.
        conv_size: taps of the causal depthwise convolution over ``q, k, v``
            (Qwen3-Next: 4), followed by SiLU; ``None`` leaves out both.
        chunk_size: tokens per chunk of the delta rule's chunked form, used
            for more than one new token (one new token uses the recurrent
            step); not chunked attention: every token sees all before it.
        eps: epsilon of the output RMSNorm.

    Shapes:
        - x: ``(B, L, d_model)``
        - output: ``(B, L, d_model)``
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        head_dim: int | None = None,
        *,
        num_key_heads: int | None = None,
        key_head_dim: int | None = None,
        conv_size: int | None = 4,
        chunk_size: int = 64,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.d_model = d_model  # checked by nn.Linear
        self.chunk_size = check_int("chunk_size", chunk_size, minimum=1)
        self.head_dim = check_int("head_dim", head_dim or d_model // num_heads, minimum=1)
        key_heads = num_heads if num_key_heads is None else num_key_heads
        self.num_key_heads = check_int("num_key_heads", key_heads, minimum=1)
        if num_heads % self.num_key_heads:
            raise ValueError(
                f"num_key_heads must divide num_heads, got {self.num_key_heads} and {num_heads}"
            )
        key_dim = self.head_dim if key_head_dim is None else key_head_dim
        self.key_head_dim = check_int("key_head_dim", key_dim, minimum=1)
        width, key_width = num_heads * self.head_dim, self.num_key_heads * self.key_head_dim
        self.W_q, self.W_k = (nn.Linear(d_model, key_width, bias=False) for _ in range(2))
        self.W_v, self.W_z = (nn.Linear(d_model, width, bias=False) for _ in range(2))
        self.W_b, self.W_a = (nn.Linear(d_model, num_heads, bias=False) for _ in range(2))
        self.conv = None
        if conv_size is not None:  # depthwise: one filter per channel of (q, k, v)
            channels = 2 * key_width + width
            self.conv = nn.Conv1d(channels, channels, conv_size, groups=channels, bias=False)
        self.A_log = nn.Parameter(torch.empty(num_heads).uniform_(0.01, 16).log())
        self.dt_bias = nn.Parameter(torch.ones(num_heads))
        self.norm = nn.RMSNorm(self.head_dim, eps=eps)
        self.W_o = nn.Linear(width, d_model, bias=False)

    @classmethod
    def from_hf(cls, module: nn.Module) -> GatedDeltaNet:
        """Build the layer that computes what a 🤗 transformers (5.24)
        ``Qwen3NextGatedDeltaNet`` computes, with copied parameters.

        ``in_proj_qkvz`` holds, per query/key head, its query and key rows and
        the value and gate rows of the value heads it serves; they become
        ``W_q``, ``W_k``, ``W_v``, ``W_z``. ``in_proj_ba`` (per query/key
        head, the ``beta`` rows then the ``a`` rows of its value heads)
        becomes ``W_b`` and ``W_a``; ``conv1d`` (a causal depthwise
        convolution over ``q, k, v`` followed by the config's activation)
        becomes ``conv``; ``A_log``, ``dt_bias``, the gated RMSNorm's weight
        and ``out_proj`` are copied as they are. The new layer uses its own
        :class:`LayerStateCache` (the convolution's last inputs and the
        recurrent state) where transformers' model keeps them in its cache.

        Explained in chapter 18, *Attention without softmax*.

        Args:
            module: a ``Qwen3NextGatedDeltaNet`` (a ``linear_attention`` layer
                of a ``Qwen3NextModel``).

        Returns:
            A new :class:`GatedDeltaNet`, in the training/eval mode of ``module``.

        Raises:
            TypeError: if ``module`` is not a ``Qwen3NextGatedDeltaNet``-like layer.
            ValueError: for what this layer does not compute: a convolution
                activation other than SiLU, or a convolution bias.
        """
        parts = ("in_proj_qkvz", "in_proj_ba", "conv1d", "A_log", "dt_bias", "norm", "out_proj")
        if not all(hasattr(module, part) for part in parts):
            raise TypeError(f"module must be a Qwen3NextGatedDeltaNet, got {type(module).__name__}")
        if module.activation not in ("silu", "swish"):
            raise ValueError(f"a SiLU convolution only, got activation {module.activation!r}")
        if module.conv1d.bias is not None:
            raise ValueError("GatedDeltaNet's convolution has no bias, module.conv1d has one")
        H, H_k = module.num_v_heads, module.num_k_heads
        d, d_k, r = module.head_v_dim, module.head_k_dim, H // H_k
        layer = cls(
            module.hidden_size,
            H,
            d,
            num_key_heads=H_k,
            key_head_dim=d_k,
            conv_size=module.conv_kernel_size,
            eps=module.norm.variance_epsilon,
        ).to(module.out_proj.weight)
        qkvz = module.in_proj_qkvz.weight.detach().view(H_k, 2 * d_k + 2 * r * d, -1)
        q, k, v, z = qkvz.split([d_k, d_k, r * d, r * d], dim=1)  # per query/key head
        b, a = module.in_proj_ba.weight.detach().view(H_k, 2 * r, -1).split([r, r], dim=1)
        with torch.no_grad():
            for mine, theirs in zip(
                (layer.W_q, layer.W_k, layer.W_v, layer.W_z, layer.W_b, layer.W_a),
                (q, k, v, z, b, a),
            ):
                mine.weight.copy_(theirs.reshape(mine.weight.shape))  # heads in order
            layer.conv.weight.copy_(module.conv1d.weight)
            layer.A_log.copy_(module.A_log)
            layer.dt_bias.copy_(module.dt_bias)
            layer.norm.weight.copy_(module.norm.weight)
            layer.W_o.weight.copy_(module.out_proj.weight)
        return layer.train(module.training)

    def _mix(self, x: Tensor, cache: LayerStateCache | None, keep: Tensor | None) -> Tensor:
        """The computation of :meth:`forward` on checked input."""
        B, L, _ = x.shape
        H, d, H_k, d_k = self.num_heads, self.head_dim, self.num_key_heads, self.key_head_dim
        qkv = torch.cat([self.W_q(x), self.W_k(x), self.W_v(x)], dim=-1)  # (B, L, C)
        if self.conv is not None:
            qkv = self._short_conv(qkv, cache)  # (B, L, C), C = 2 H_k d_k + H d
        q, k, v = qkv.split([H_k * d_k, H_k * d_k, H * d], dim=-1)
        q, k = (t.view(B, L, H_k, d_k).transpose(1, 2) for t in (q, k))  # (B, H_k, L, d_k)
        v = v.view(B, L, H, d).transpose(1, 2)  # (B, H, L, d)
        q, k = (t * torch.rsqrt(t.pow(2).sum(-1, keepdim=True) + 1e-6) for t in (q, k))  # unit
        beta = self.W_b(x).sigmoid().transpose(1, 2)  # (B, H, L): write strength
        g = self._log_decay(x)  # (B, H, L), or (B, H, L, d_k) per channel: log-decay
        out, state = gated_delta_core(  # x was checked (by forward or the model): no checks
            q,
            k,
            v,
            g,
            beta,
            None if cache is None else cache.state,
            scale=None,
            chunk_size=None if L == 1 else self.chunk_size,
        )  # (B, H, L, d), (B, H, d_k, d): a query/key head serves H // H_k value heads
        if cache is not None:
            cache.state, cache.position = state, cache.position + L
        z = self.W_z(x).view(B, L, H, d)  # the output gate
        out = self.norm(out.transpose(1, 2)) * self._gate(z)  # (B, L, H, d)
        return self.W_o(out.reshape(B, L, H * d))  # (B, L, d_model)

    def _log_decay(self, x: Tensor) -> Tensor:
        """``g = -exp(A_log) softplus(W_a x + dt_bias)``: ``(B, H, L)``, one per head."""
        return (-self.A_log.exp() * F.softplus(self.W_a(x) + self.dt_bias)).transpose(1, 2)

    def _gate(self, z: Tensor) -> Tensor:
        """The output gate's activation: SiLU (Qwen3-Next)."""
        return F.silu(z)
