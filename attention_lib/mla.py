"""Multi-head latent attention (MLA, DeepSeek-V2/V3) and its latent cache.

The keys and values of all heads come from one small latent per token,
``c = RMSNorm(x W_DKV)`` of width ``kv_lora_rank``, plus one narrow key
``k_rope`` of width ``qk_rope_head_dim`` shared by the heads and turned by
RoPE. A decoder caches only ``c`` and ``k_rope`` (512 + 64 = 576 numbers per
token and layer in DeepSeek-V3), and rebuilds the heads' keys and values from
them with the up-projection ``W_UKV``, or never rebuilds them: ``W_UK`` can be
folded into the query and ``W_UV`` into the output (``absorb=True``), so that
attention runs in the latent space, one shared key and value per token.

With ``index_topk`` the module is DeepSeek-V3.2's sparse attention (DSA,
:mod:`attention_lib.dsa`): a lightning indexer picks the ``k`` keys each
query reads.

Explained in chapter 17, *Latent and sparse attention*.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .dsa import LightningIndexer, select_top_k, top_k_mask
from .masks import Causal, with_causal
from .protocols import Step
from .rope import check_d_head, check_rope_scaling, rope_cos_sin, rotate_pairs
from .sdpa import attend
from .validation import (
    check_base,
    check_bool,
    check_hidden,
    check_int,
    check_mask,
    check_positions,
    check_real,
)


class LatentKVCache:
    """The cache of one :class:`MultiHeadLatentAttention` layer: per token, the
    latent ``c`` and the shared RoPE key, nothing else (with DSA, also the
    indexer's key).

    Explained in chapter 17, *Latent and sparse attention*.

    Attributes:
        latent: ``(B, T, kv_lora_rank)``, or ``None`` while empty.
        rope_key: ``(B, T, qk_rope_head_dim)`` (RoPE applied), or ``None``.
        index_key: ``(B, T, d_I)`` keys of the lightning indexer, or ``None``
            (a layer without ``index_topk``).
    """

    def __init__(self) -> None:
        self.latent: Tensor | None = None
        self.rope_key: Tensor | None = None
        self.index_key: Tensor | None = None

    def __len__(self) -> int:
        """The number of positions ``T`` stored."""
        return 0 if self.latent is None else self.latent.shape[1]

    @property
    def position(self) -> int:
        """The position of the next token (the cache never drops one)."""
        return len(self)

    @property
    def numbers_per_token(self) -> int:
        """The count of numbers the cache holds per token, ``kv_lora_rank +
        qk_rope_head_dim`` (plus ``d_I`` with DSA)."""
        held = [t for t in (self.latent, self.rope_key, self.index_key) if t is not None]
        return sum(t.shape[-1] for t in held)

    @property
    def nbytes(self) -> int:
        """Bytes held by the cache."""
        held = [t for t in (self.latent, self.rope_key, self.index_key) if t is not None]
        return sum(t.numel() * t.element_size() for t in held)

    def select(self, rows: Tensor) -> None:
        """Keep the batch rows ``rows`` (a 1-D integer tensor), in that order
        (the cache protocol of :mod:`attention_lib.protocols`). No checks."""
        if self.latent is not None:
            self.latent, self.rope_key = self.latent[rows], self.rope_key[rows]
            self.index_key = None if self.index_key is None else self.index_key[rows]

    def crop(self, n: int) -> None:
        """Forget the last ``n`` tokens.

        Raises:
            ValueError: if ``n`` is not in ``[0, len(self)]``.
        """
        n = check_int("n", n, minimum=0)
        if n > len(self):
            raise ValueError(f"cannot crop {n} tokens: the cache holds {len(self)}")
        if n:
            held = (self.latent, self.rope_key, self.index_key)
            self.latent, self.rope_key, self.index_key = (
                None if t is None else t[:, : t.shape[1] - n] for t in held
            )

    def layout(self) -> tuple | None:
        """``(B, kv_lora_rank, qk_rope_head_dim, d_I or 0, dtype, device)`` of what
        the cache holds, or ``None`` while it is empty."""
        if self.latent is None:
            return None
        widths = [
            0 if t is None else t.shape[-1] for t in (self.latent, self.rope_key, self.index_key)
        ]
        return (self.latent.shape[0], *widths, self.latent.dtype, self.latent.device)

    def update(
        self, latent: Tensor, rope_key: Tensor, index_key: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Append the new positions (each ``(B, L_new, width)``) and return all of
        them so far, cached first. No checks: :meth:`MultiHeadLatentAttention.forward`
        compares the new tensors with ``layout()`` first."""
        new = (latent, rope_key, index_key)
        if self.latent is not None:
            old = (self.latent, self.rope_key, self.index_key)
            new = tuple(None if n is None else torch.cat([o, n], dim=1) for o, n in zip(old, new))
        self.latent, self.rope_key, self.index_key = new  # (B, T + L_new, width)
        return new


class MultiHeadLatentAttention(nn.Module):
    r"""Multi-head latent attention (DeepSeek-V2/V3), optionally sparse (DSA, V3.2).

    For a token ``x`` (batch-first ``(B, L, d_model)``, self-attention):

    .. math::

        c &= \mathrm{RMSNorm}(x W_{DKV}^{c}),

        k^R &= \mathrm{RoPE}(x W_{DKV}^{R}),

        \bigl[k^C_h; v_h\bigr] &= c\, W_{UKV}^{(h)},

        k_h &= [k^C_h; k^R],

    queries ``q_h = [q^C_h; \mathrm{RoPE}(q^R_h)]`` from ``x W_Q`` (or, with
    ``q_lora_rank``, from ``\mathrm{RMSNorm}(x W_{DQ}) W_{UQ}``), and
    ``\mathrm{softmax}(q_h k_h^\top \cdot \mathrm{scale})\, v_h`` per head,
    concatenated and mixed by ``W_o``. The scale is
    ``1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)``.

    RoPE turns **interleaved** pairs ``(2i, 2i+1)`` of the rope parts, as
    DeepSeek's checkpoints do (``rope_interleave=True`` in 🤗 transformers).

    **Absorption** (``absorb=True``): ``q^C_h \cdot k^C_h = (q^C_h W_{UK}^{(h)\top})
    \cdot c``, so the query is moved into the latent space once and attends
    to ``[c; k^R]`` directly, with ``c`` as the value; the head's output
    ``o_h W_{UV}^{(h)}`` then goes through ``W_o`` (``W_UV`` folded into the
    output projection, applied per query). The same function, other costs.

    **Mask semantics** as :class:`~attention_lib.MultiHeadAttention`'s: a bool
    keep-mask (``True`` = may attend); ``is_causal`` is top-left without a
    cache and bottom-right after ``T`` cached positions.

    **Sparse attention** (``index_topk=k``): a
    :class:`~attention_lib.dsa.LightningIndexer` scores the keys each query
    may see (after the mask), and the query attends only to the ``k`` of
    highest score, ties going to the earlier key
    (:func:`~attention_lib.top_k_keys`). With ``absorb=True`` the chosen latents
    are gathered (the attention reads ``k`` keys per query); otherwise the
    choice is applied as a keep-mask over all keys (the same numbers).

    Explained in chapter 17, *Latent and sparse attention*.

    Args:
        d_model: model width.
        num_heads: number of heads ``H``.
        kv_lora_rank: width ``d_c`` of the latent ``c`` (512 in DeepSeek-V3).
        qk_nope_head_dim: width of each head's position-free key part (128).
        qk_rope_head_dim: width of the shared RoPE key and of each head's
            RoPE query part (64); even.
        v_head_dim: width of each head's value (128).
        q_lora_rank: width of the query latent (1536), or ``None`` for a
            full ``W_q`` (DeepSeek-V2-Lite).
        rope_base: RoPE base (10000 in DeepSeek-V3).
        rope_scaling: a RoPE ``scaling`` dict in 🤗 transformers' format, as
            :class:`~attention_lib.MultiHeadAttention`'s (DeepSeek-V3's
            published config uses ``"yarn"``; chapter 16), or ``None``.
        absorb: attend in the latent space (see above).
        index_topk: with an int ``k``, DSA: attend to ``k`` keys per query.
        index_heads: the indexer's heads ``H_I`` (64 in DeepSeek-V3.2).
        index_head_dim: the indexer's head width ``d_I`` (128); at least
            ``qk_rope_head_dim``.
        scale: the scores' multiplier; ``None`` for the default above.
        bias: bias of ``W_dq``, ``W_dkv`` and ``W_o`` (``attention_bias``).
        device: device of the parameters.
        dtype: dtype of the parameters.

    Attributes:
        W_q: ``nn.Linear(d_model, H (d_nope + d_rope))`` without ``q_lora_rank``,
            else ``None``; ``W_dq``, ``q_norm`` and ``W_uq`` the compressed
            query path (``None`` without ``q_lora_rank``).
        W_dkv: ``nn.Linear(d_model, d_c + d_rope)``: the latent and the RoPE key.
        kv_norm: ``nn.RMSNorm(d_c)`` on the latent.
        W_ukv: ``nn.Linear(d_c, H (d_nope + d_v), bias=False)``: ``W_UK`` and
            ``W_UV`` of every head.
        W_o: ``nn.Linear(H d_v, d_model)``.
        indexer: the :class:`~attention_lib.dsa.LightningIndexer`, or ``None``.
        absorb: whether :meth:`forward` attends in the latent space (may be
            switched).

    Raises:
        TypeError: if a size is not an int, ``rope_base``/``scale`` not a
            number or ``absorb``/``bias`` not a bool.
        ValueError: if a size is below 1, ``qk_rope_head_dim`` is odd,
            ``rope_base <= 1``, ``scale <= 0`` or ``index_head_dim <
            qk_rope_head_dim``.

    Shapes:
        - x: ``(B, L, d_model)``; output ``(B, L, d_model)``
        - weights (with ``need_weights=True``): ``(B, H, L, T)``, the softmax
          weights over all ``T`` keys (0 where a sparse query did not read)
        - mask: ``(L, T)``, ``(B, 1, L, T)`` or ``(B, H, L, T)``, ``T`` counting
          the cached positions (per-head masks not with ``index_topk``)
        - kv_cache: a :class:`LatentKVCache`, ``d_c + d_rope`` numbers per token
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int | None = None,
        rope_base: float = 10000.0,
        rope_scaling: dict | None = None,
        absorb: bool = False,
        index_topk: int | None = None,
        index_heads: int = 4,
        index_head_dim: int = 32,
        scale: float | None = None,
        bias: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        sizes = {"d_model": d_model, "num_heads": num_heads, "kv_lora_rank": kv_lora_rank}
        sizes |= {"qk_nope_head_dim": qk_nope_head_dim, "v_head_dim": v_head_dim}
        sizes |= {"index_heads": index_heads, "index_head_dim": index_head_dim}
        optional = {"q_lora_rank": q_lora_rank, "index_topk": index_topk}
        sizes |= {name: 1 if size is None else size for name, size in optional.items()}
        for name, size in sizes.items():
            check_int(name, size, minimum=1)
        check_d_head(qk_rope_head_dim, name="qk_rope_head_dim")
        if index_topk is not None:  # the indexer's heads hold the RoPE part
            check_int("index_head_dim", index_head_dim, minimum=qk_rope_head_dim)
        self.d_model, self.num_heads, self.kv_lora_rank = d_model, num_heads, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim = qk_nope_head_dim, qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.rope_base = check_base(rope_base)
        self._scaling = check_rope_scaling(rope_scaling, self.rope_base)
        if dict(self._scaling or ()).get("rope_type") == "dynamic":  # turned per call length
            raise ValueError("dynamic RoPE scaling is not reproduced by latent attention")
        self.rope_scaling = None if rope_scaling is None else dict(rope_scaling)
        self.absorb = check_bool("absorb", absorb)
        qk_dim = qk_nope_head_dim + qk_rope_head_dim
        self.scale = qk_dim**-0.5 if scale is None else check_real("scale", scale, above=0)
        self.index_topk = index_topk
        factory = {"device": device, "dtype": dtype}
        linear = {"bias": check_bool("bias", bias), **factory}
        self.q_lora_rank = q_lora_rank
        self.W_q = self.W_dq = self.q_norm = self.W_uq = None
        if q_lora_rank is None:
            self.W_q = nn.Linear(d_model, num_heads * qk_dim, bias=False, **factory)
        else:
            self.W_dq = nn.Linear(d_model, q_lora_rank, **linear)
            self.q_norm = nn.RMSNorm(q_lora_rank, eps=1e-6, **factory)
            self.W_uq = nn.Linear(q_lora_rank, num_heads * qk_dim, bias=False, **factory)
        self.W_dkv = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, **linear)
        self.kv_norm = nn.RMSNorm(kv_lora_rank, eps=1e-6, **factory)
        self.W_ukv = nn.Linear(
            kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), bias=False, **factory
        )
        self.W_o = nn.Linear(num_heads * v_head_dim, d_model, **linear)
        self.indexer = None
        if index_topk is not None:
            q_dim = d_model if q_lora_rank is None else q_lora_rank
            self.indexer = LightningIndexer(
                d_model, q_dim, index_heads, index_head_dim, qk_rope_head_dim, **factory
            )

    def extra_repr(self) -> str:
        sizes = [
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "q_lora_rank",
        ]
        shown = [f"{n}={getattr(self, n)}" for n in sizes]
        shown += [f"absorb={self.absorb}"] + (
            [f"index_topk={self.index_topk}"] if self.indexer else []
        )
        return ", ".join([f"d_model={self.d_model}, num_heads={self.num_heads}", *shown])

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        kv_cache: LatentKVCache | None = None,
        positions: Tensor | None = None,
        step: Step | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Self-attention of the tokens ``x (B, L, d_model)``, after the cached ones.

        Validates, prepares the keep-mask, the causal alignment and the RoPE
        positions, and passes them down to ``attend`` (which checks
        nothing).

        Explained in chapter 17, *Latent and sparse attention*.

        Args:
            x: ``(B, L, d_model)``.
            mask: keep-mask (``True`` / 1 = may attend) of shape ``(L, T)``,
                ``(B, 1, L, T)`` or ``(B, H, L, T)`` (``T`` = cached + ``L``;
                not per head with ``index_topk``), or ``None``.
            is_causal: query ``i`` sees keys up to its own position: top-left
                without a cache, bottom-right after the cached positions.
            kv_cache: a :class:`LatentKVCache`; the new latents are appended
                and the queries attend to everything it holds.
            positions: integer positions of the new tokens, ``(L,)`` or
                ``(B, L)``; ``None`` means ``T_cached, T_cached + 1, ...``.
            step: a model's call (the mixer protocol of
                :mod:`attention_lib.protocols`): the
                :class:`~attention_lib.protocols.Step` it prepared and
                validated; only ``kv_cache`` is read besides. ``None``: the
                checked call.
            need_weights: also return the attention weights ``(B, H, L, T)``
                (the target a lightning indexer learns, chapter 17).

        Returns:
            ``(B, L, d_model)``, or ``(output, weights)`` with ``need_weights``.

        Raises:
            TypeError: on a non-floating ``x`` or one of another dtype than the
                parameters, a bad mask dtype, a ``kv_cache`` that is not a
                :class:`LatentKVCache` or a non-bool ``is_causal``.
            ValueError: on ``x`` not ``(B, L, d_model)``, a mask or positions
                that do not fit, a per-head mask with ``index_topk``, or a
                cache filled by another layer shape, batch or dtype.
        """
        if step is not None:  # a model's call (the mixer protocol): checked by the model
            return self.mix(x, step, kv_cache, need_weights=need_weights)
        check_bool("need_weights", need_weights)
        weight = self.W_o.weight
        check_hidden(self.d_model, weight, x=x)
        check_bool("is_causal", is_causal)
        batch, length, _ = x.shape
        past = 0
        if kv_cache is not None:
            self.check_cache(kv_cache, batch, weight.dtype, weight.device)
            past = len(kv_cache)
        if mask is not None:
            mask = check_mask(mask, (batch, self.num_heads, length, past + length), device=x.device)
            heads = mask.shape[1] if mask.dim() == 4 and self.indexer is not None else 1
            if mask.dim() == 3 or heads > 1:  # the indexer selects keys for every head alike
                raise ValueError(
                    f"mask must be (L, T) or (B, 1, L, T) here, got {tuple(mask.shape)}"
                )
        if positions is None:
            positions = torch.arange(past, past + length, device=x.device)  # (L,)
        check_positions(positions, (batch, length), x.device)
        return self.attend(
            x,
            mask,
            causal=Causal(past) if is_causal else None,
            kv_cache=kv_cache,
            positions=positions,
            need_weights=need_weights,
        )

    def attend(
        self,
        x: Tensor,
        keep: Tensor | None,
        *,
        causal: Causal | None,
        kv_cache: LatentKVCache | None,
        positions: Tensor,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The computation of :meth:`forward`, without checks: ``keep`` is a bool
        keep-mask or ``None``, ``causal`` a :class:`~attention_lib.masks.Causal`
        or ``None``, ``positions`` integer ``(L,)`` or ``(B, L)``."""
        angles = rope_cos_sin(
            positions,
            self.qk_rope_head_dim,
            base=self.rope_base,
            dtype=x.dtype,
            scaling=self._scaling,
        )
        return self._attend(x, keep, causal, kv_cache, angles, need_weights)

    def mix(
        self,
        x: Tensor,
        step: Step,
        cache: LatentKVCache | None,
        *,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Self-attention of the new tokens ``x`` as a decoder's token mixer (the
        protocol of :mod:`attention_lib.protocols`), with the ``step`` the model
        prepared once; no checks.

        Explained in chapter 17, *Latent and sparse attention*.
        """
        past = 0 if cache is None else len(cache)
        keep = step.keep_for(past + x.shape[1])  # (B, 1, 1, T + L) or None
        angles = step.rope(self.qk_rope_head_dim, self.rope_base, x.dtype, self._scaling)
        causal = Causal(past) if step.causal else None
        return self._attend(x, keep, causal, cache, angles, need_weights)

    def check_cache(
        self, cache: object, batch: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        """Refuse a ``cache`` this layer cannot continue (what :meth:`forward`
        checks of its ``kv_cache``), for a model that checks every layer's once.

        Raises:
            TypeError: if ``cache`` is not a :class:`LatentKVCache`.
            ValueError: if it was filled by another layer shape, batch or dtype.
        """
        if not isinstance(cache, LatentKVCache):  # per layer and call: no check_instance call
            raise TypeError(f"kv_cache must be a LatentKVCache, got {type(cache).__name__}")
        index_width = 0 if self.indexer is None else self.indexer.head_dim
        ours = (batch, self.kv_lora_rank, self.qk_rope_head_dim, index_width)
        if cache.layout() not in (None, (*ours, dtype, device)):
            raise ValueError(f"kv_cache holds {cache.layout()}, not {ours}, {dtype}")

    def make_cache(self) -> LatentKVCache:
        """An empty :class:`LatentKVCache` for this layer.

        Explained in chapter 17, *Latent and sparse attention*.
        """
        return LatentKVCache()

    def _attend(
        self,
        x: Tensor,
        keep: Tensor | None,
        causal: Causal | None,
        kv_cache: LatentKVCache | None,
        angles: tuple[Tensor, Tensor],
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """:meth:`attend` with the RoPE ``(cos, sin)`` tables (``(.., L, d_r/2)``
        each) already computed."""
        batch, length, _ = x.shape
        heads, d_nope, d_rope = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim
        q_source = x if self.W_q is not None else self.q_norm(self.W_dq(x))  # (B, L, d_q)
        q = (self.W_q or self.W_uq)(q_source).view(batch, length, heads, d_nope + d_rope)
        q_nope, q_rope = q.transpose(1, 2).split([d_nope, d_rope], dim=-1)  # (B, H, L, d_*)
        latent, k_rope = self.W_dkv(x).split([self.kv_lora_rank, d_rope], dim=-1)  # (B, L, d_*)
        latent = self.kv_norm(latent)  # (B, L, d_c)
        cos, sin = angles  # (.., L, d_r/2)
        head_angles = (
            (cos[:, None], sin[:, None]) if cos.dim() == 3 else (cos, sin)
        )  # .., 1, L, d_r/2
        q_rope = rotate_pairs(q_rope, *head_angles, interleaved=True)  # (B, H, L, d_rope)
        k_rope = rotate_pairs(k_rope, cos, sin, interleaved=True)  # (B, L, d_rope)
        index_key = None if self.indexer is None else self.indexer.keys(x, cos, sin)  # (B, L, d_I)
        if kv_cache is not None:
            latent, k_rope, index_key = kv_cache.update(latent, k_rope, index_key)  # (B, T, d_*)
        k_len = latent.shape[1]
        keep = with_causal(keep, length, k_len, causal, x.device)  # (.., L, T) or None
        chosen = None
        if self.indexer is not None:
            row_keep = (
                None if keep is None else keep.expand(batch, 1, length, k_len)[:, 0]
            )  # (B, L, T)
            scores = self.indexer(x, q_source, index_key, row_keep, cos, sin)  # (B, L, T)
            chosen = select_top_k(scores, self.index_topk)  # 2 x (B, L, k)
        if not self.absorb:
            if chosen is not None:  # the choice as a keep-mask over all keys
                picked = top_k_mask(*chosen, k_len)[:, None]  # (B, 1, L, T)
                keep = picked if keep is None else keep & picked
            out, weights = self._naive(q_nope, q_rope, latent, k_rope, keep)  # (B, H, L, d_v)
        else:
            out, weights = self._absorbed(q_nope, q_rope, latent, k_rope, keep, chosen)
        out = self.W_o(out.transpose(1, 2).reshape(batch, length, heads * self.v_head_dim))
        return (out, weights) if need_weights else out  # weights (B, H, L, T)

    def _naive(self, q_nope, q_rope, latent, k_rope, keep) -> tuple[Tensor, Tensor]:
        """Rebuild every head's keys and values from the latents, then attend:
        ``(output (B, H, L, d_v), weights (B, H, L, T))``."""
        batch, k_len, _ = latent.shape
        heads, d_nope = self.num_heads, self.qk_nope_head_dim
        kv = self.W_ukv(latent).view(batch, k_len, heads, d_nope + self.v_head_dim)
        k_nope, value = kv.transpose(1, 2).split(
            [d_nope, self.v_head_dim], dim=-1
        )  # (B, H, T, d_*)
        shared = k_rope[:, None].expand(
            batch, heads, k_len, self.qk_rope_head_dim
        )  # (B, H, T, d_r)
        key = torch.cat([k_nope, shared], dim=-1)  # (B, H, T, d_nope + d_rope)
        query = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, L, d_nope + d_rope)
        return attend(query, key, value, keep, causal=None, dropout_p=0.0, scale=self.scale)

    def _absorbed(self, q_nope, q_rope, latent, k_rope, keep, chosen) -> tuple[Tensor, Tensor]:
        """Attend in the latent space: W_UK folded into the query, W_UV applied
        to each head's latent output (before W_o). Returns ``(output (B, H, L,
        d_v), weights (B, H, L, T))``."""
        w_uk, w_uv = self.up_projections()  # (H, d_nope, d_c), (H, d_v, d_c)
        query = torch.cat([q_nope @ w_uk, q_rope], dim=-1)  # (B, H, L, d_c + d_rope)
        key = torch.cat([latent, k_rope], dim=-1)  # (B, T, d_c + d_rope): one key for all heads
        if chosen is None:
            out, weights = attend(
                query,
                key[:, None],
                latent[:, None],
                keep,
                causal=None,
                dropout_p=0.0,
                scale=self.scale,
            )  # (B, H, L, d_c), (B, H, L, T)
        else:  # gather the k chosen latents of every query: (B, L, k, width)
            indices, valid = chosen
            rows = torch.arange(key.shape[0], device=key.device)[:, None, None]  # (B, 1, 1)
            out, picked = attend(
                query.transpose(1, 2),
                key[rows, indices],
                latent[rows, indices],
                valid[:, :, None, :],
                causal=None,
                dropout_p=0.0,
                scale=self.scale,
            )  # (B, L, H, d_c), (B, L, H, k)
            out = out.transpose(1, 2)  # (B, H, L, d_c)
            weights = picked.new_zeros(*picked.shape[:-1], key.shape[1])  # (B, L, H, T)
            weights = weights.scatter(-1, indices[:, :, None].expand_as(picked), picked)
            weights = weights.transpose(1, 2)  # (B, H, L, T): 0 where not read
        return out @ w_uv.transpose(1, 2), weights  # (B, H, L, d_v)

    def up_projections(self) -> tuple[Tensor, Tensor]:
        """``W_UK`` ``(H, d_nope, d_c)`` and ``W_UV`` ``(H, d_v, d_c)``: views of ``W_ukv``.

        Explained in chapter 17, *Latent and sparse attention*.
        """
        per_head = self.W_ukv.weight.view(self.num_heads, -1, self.kv_lora_rank)
        return per_head.split([self.qk_nope_head_dim, self.v_head_dim], dim=1)

    @classmethod
    def from_hf(cls, layer: nn.Module, *, absorb: bool = False) -> MultiHeadLatentAttention:
        """The module that computes the same function as a 🤗 transformers
        ``DeepseekV3Attention`` (or ``DeepseekV32Attention``, with its indexer),
        weights copied; a ``ValueError`` for what it cannot reproduce (a RoPE
        other than the default or YaRN, or RoPE that is not interleaved).
        YaRN (DeepSeek-V3's published config) is reproduced: its frequencies
        and attention factor in the rotation, its ``mscale_all_dim`` in the
        layer's score scale.

        Explained in chapter 17, *Latent and sparse attention*.

        Raises:
            TypeError: if ``layer`` is not such a layer (it has no ``kv_b_proj``).
        """
        if not isinstance(layer, nn.Module) or not hasattr(layer, "kv_b_proj"):
            raise TypeError(f"layer must be a DeepseekV3(2)Attention, got {type(layer).__name__}")
        config = layer.config
        rope = dict(getattr(config, "rope_parameters", None) or {})
        kind = rope.get("rope_type", "default")
        if kind not in ("default", "yarn") or not getattr(config, "rope_interleave", True):
            raise ValueError(f"only default or yarn, interleaved RoPE is reproduced, got {rope}")
        scaling = None
        if kind == "yarn":  # the fields rope_frequencies knows; any other is refused there
            scaling = {k: v for k, v in rope.items() if k != "rope_theta" and v is not None}
        indexer = getattr(layer, "indexer", None)
        weight = layer.o_proj.weight
        index = (
            {}
            if indexer is None
            else {
                "index_topk": indexer.index_topk,
                "index_heads": indexer.n_heads,
                "index_head_dim": indexer.head_dim,
            }
        )
        new = cls(
            config.hidden_size,
            config.num_attention_heads,
            kv_lora_rank=config.kv_lora_rank,
            qk_nope_head_dim=config.qk_nope_head_dim,
            qk_rope_head_dim=config.qk_rope_head_dim,
            v_head_dim=config.v_head_dim,
            q_lora_rank=config.q_lora_rank,
            rope_base=rope.get("rope_theta", 10000.0),
            rope_scaling=scaling,
            absorb=absorb,
            scale=layer.scaling,
            bias=layer.o_proj.bias is not None,
            device=weight.device,
            dtype=weight.dtype,
            **index,
        )
        names = {
            "W_q": "q_proj",
            "W_dq": "q_a_proj",
            "W_uq": "q_b_proj",
            "W_dkv": "kv_a_proj_with_mqa",
            "W_ukv": "kv_b_proj",
            "W_o": "o_proj",
        }
        with torch.no_grad():
            for mine, theirs in names.items():
                if getattr(new, mine) is not None:
                    getattr(new, mine).load_state_dict(getattr(layer, theirs).state_dict())
            for mine, theirs in (("q_norm", "q_a_layernorm"), ("kv_norm", "kv_a_layernorm")):
                if getattr(new, mine) is not None:
                    getattr(new, mine).weight.copy_(getattr(layer, theirs).weight)
                    getattr(new, mine).eps = getattr(layer, theirs).variance_epsilon
        if indexer is not None:
            new.indexer = LightningIndexer.from_hf(indexer)
        return new
