"""DeepSeek-V4's compressed attention: keys pooled by windows, then selected.

DeepSeek-V3's MLA shrinks what a token stores (chapter 17); V3.2's lightning
indexer reads only ``k`` of the stored tokens. DeepSeek-V4 (April 2026)
stores *fewer entries*: every ``m`` consecutive tokens are pooled into one
compressed key-value entry, and a query attends to its last ``n_win`` tokens
uncompressed plus the compressed entries of the windows already closed.

.. code-block:: text

    C_j = W_kv x_j,   Z_j = W_z x_j + B[j mod m]           (one value, one gate per channel)
    entry_w = RMSNorm( sum_{j in window w} softmax_j(Z_j) * C_j )   (per channel)

Two layer kinds pool differently:

* **HCA** (heavily compressed attention): windows of ``m' = 128`` tokens,
  not overlapping; a query reads *every* closed entry;
* **CSA** (compressed sparse attention): ``m = 4``, and each entry pools
  ``2m`` tokens, the ``m`` of its window (series ``Cb``) and the ``m`` of the
  window before (series ``Ca``), so windows overlap by half; a lightning
  indexer (chapter 17's, on its own compressed keys) picks the ``k`` best
  entries for each query.

Entry ``w`` holds tokens up to ``(w + 1) m - 1``: a query at position ``t``
may read it once it is closed, ``w < (t + 1) // m``
(:func:`compressed_keep`). RoPE turns the trailing ``rope_dim`` channels of
an entry at the position of its window's first token, ``w m``.

:class:`Compressor` computes the entries (recomputed whole, or streamed
through a :class:`CompressorCache` that keeps the unfinished window), and
:class:`CompressedIndexer` the indexer's scores over them; both copy
🤗 transformers' ``DeepseekV4HCACompressor``, ``DeepseekV4CSACompressor``
and ``DeepseekV4Indexer`` (:meth:`Compressor.from_hf`,
:meth:`CompressedIndexer.from_hf`). The selection is chapter 17's
:func:`~attention_lib.dsa.top_k_keys` (a tie goes to the earlier entry).

Explained in chapter 18, *Attention without softmax* (the last of the
sections on what replaces a growing KV cache).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .dsa import index_scores
from .rope import rope_cos_sin, rotate_pairs
from .validation import check_int


def compressed_keep(positions: Tensor, entries: int, rate: int) -> Tensor:
    """Which compressed entries each query may read: ``(..., L, entries)`` bool.

    Entry ``w`` pools the tokens ``w m .. (w + 1) m - 1`` (``m = rate``; a
    CSA entry also the window before): it is closed, and readable, at
    position ``t`` when ``w < (t + 1) // m``.

    Explained in chapter 18, *Attention without softmax*.

    Args:
        positions: ``(..., L)`` integer positions of the queries.
        entries: number of compressed entries ``T``.
        rate: tokens per window ``m``.
    """
    closed = torch.div(positions + 1, rate, rounding_mode="floor")  # (..., L)
    return torch.arange(entries, device=positions.device) < closed[..., None]


class CompressorCache:
    """What a :class:`Compressor` keeps between calls: its entries so far,
    the tokens of the window not yet closed, and (CSA) the ``Ca`` half of the
    last closed window, which the next entry also pools.

    Explained in chapter 18, *Attention without softmax*.

    Attributes:
        entries: ``(B, T, head_dim)`` compressed entries, or ``None``.
        pending: ``(kv, gate)`` of the ``< m`` tokens of the open window, or ``None``.
        prior: ``(kv, gate)`` ``(B, m, head_dim)`` of the last closed window's
            ``Ca`` series (CSA only), or ``None``.
        position: tokens seen.
    """

    def __init__(self) -> None:
        self.entries: Tensor | None = None
        self.pending: tuple[Tensor, Tensor] | None = None
        self.prior: tuple[Tensor, Tensor] | None = None
        self.position = 0

    def __len__(self) -> int:
        """Entries held: one per ``m`` tokens."""
        return 0 if self.entries is None else self.entries.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes held: the entries, the open window and the ``Ca`` half."""
        held = [self.entries, *(self.pending or ()), *(self.prior or ())]
        return sum(t.numel() * t.element_size() for t in held if t is not None)


class Compressor(nn.Module):
    """DeepSeek-V4's compressor: one key-value entry per window of ``rate`` tokens.

    Explained in chapter 18, *Attention without softmax*.

    Args:
        d_model: model width.
        head_dim: width of an entry.
        rate: tokens per window ``m`` (V4: 4 in CSA layers, 128 in HCA layers).
        overlap: CSA's overlapping windows (each entry pools ``2 m`` tokens).
        rope_dim: trailing channels RoPE turns (even).
        rope_base: RoPE base (V4's ``compress_rope_theta``, 160000).
        eps: epsilon of the entries' RMSNorm.

    Shapes:
        - x: ``(B, L, d_model)``
        - output: ``(B, T, head_dim)``: every entry closed so far
    """

    def __init__(
        self,
        d_model: int,
        head_dim: int,
        rate: int,
        *,
        overlap: bool = False,
        rope_dim: int = 0,
        rope_base: float = 160000.0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim, minimum=1)
        self.rate, self.overlap = check_int("rate", rate, minimum=1), overlap
        self.rope_dim, self.rope_base = rope_dim, rope_base
        width = (2 if overlap else 1) * head_dim  # CSA: the Ca and Cb series
        self.W_kv, self.W_gate = (nn.Linear(d_model, width, bias=False) for _ in range(2))
        self.position_bias = nn.Parameter(torch.zeros(rate, width))  # B in the gate
        self.norm = nn.RMSNorm(head_dim, eps=eps)

    @classmethod
    def from_hf(cls, module: nn.Module) -> Compressor:
        """The compressor of a 🤗 transformers (5.24) ``DeepseekV4HCACompressor``,
        ``DeepseekV4CSACompressor`` or ``DeepseekV4Indexer`` (its own
        compressor), with copied parameters.

        Explained in chapter 18, *Attention without softmax*.

        Raises:
            TypeError: if ``module`` has no ``kv_proj``/``gate_proj``/``position_bias``.
            ValueError: a compressed RoPE other than the default one (YaRN).
        """
        if not all(hasattr(module, p) for p in ("kv_proj", "gate_proj", "position_bias")):
            raise TypeError(f"module must be a DeepSeek-V4 compressor, got {type(module).__name__}")
        rope = module.rotary_emb.config.rope_parameters["compress"]
        if rope["rope_type"] != "default":
            raise ValueError(f"only the default compressed RoPE is reproduced, got {rope}")
        head_dim = module.kv_norm.weight.shape[0]
        layer = cls(
            module.kv_proj.in_features,
            head_dim,
            module.compress_rate,
            overlap=module.kv_proj.out_features == 2 * head_dim,
            rope_dim=2 * module.rotary_emb.compress_inv_freq.shape[0],
            rope_base=rope["rope_theta"],
            eps=module.kv_norm.variance_epsilon,
        ).to(module.kv_proj.weight)
        with torch.no_grad():
            layer.W_kv.weight.copy_(module.kv_proj.weight)
            layer.W_gate.weight.copy_(module.gate_proj.weight)
            layer.position_bias.copy_(module.position_bias)
            layer.norm.weight.copy_(module.kv_norm.weight)
        return layer.train(module.training)

    def forward(self, x: Tensor, cache: CompressorCache | None = None) -> Tensor:
        """The entries of every window closed after ``x`` (``(B, T, head_dim)``);
        with a cache, ``x`` continues the tokens it has seen."""
        m = self.rate
        kv, gate = self.W_kv(x), self.W_gate(x)  # (B, L, width)
        start = 0 if cache is None else len(cache) * m  # the first new window's first token
        if cache is not None:
            if cache.pending is not None:  # the open window's earlier tokens
                kv, gate = (torch.cat(pair, dim=1) for pair in zip(cache.pending, (kv, gate)))
            cache.position += x.shape[1]
        usable = kv.shape[1] // m * m
        if cache is not None:
            cache.pending = kv[:, usable:], gate[:, usable:]
        entries = self._pool(kv[:, :usable], gate[:, :usable], cache, start)  # (B, n, d)
        if cache is None:
            return entries
        held = cache.entries
        cache.entries = entries if held is None else torch.cat([held, entries], dim=1)
        return cache.entries

    def _pool(self, kv: Tensor, gate: Tensor, cache: CompressorCache | None, start: int) -> Tensor:
        """The entries of the closed windows of ``kv``, ``gate`` ``(B, n m, width)``."""
        B, m, d = kv.shape[0], self.rate, self.head_dim
        n, width = kv.shape[1] // m, kv.shape[-1]
        if n == 0:
            return kv.new_zeros(B, 0, d)
        kv = kv.view(B, n, m, width)  # (B, n, m, width)
        gate = gate.view(B, n, m, width) + self.position_bias
        if self.overlap:  # slots: Ca of the window before, then Cb of this one
            prior = None if cache is None else cache.prior
            if prior is None:  # no window before: weight 0
                prior = kv.new_zeros(B, m, d), gate.new_full((B, m, d), -torch.inf)
            before_kv = torch.cat([prior[0][:, None], kv[:, :-1, :, :d]], dim=1)  # (B, n, m, d)
            before_gate = torch.cat([prior[1][:, None], gate[:, :-1, :, :d]], dim=1)
            if cache is not None:
                cache.prior = kv[:, -1, :, :d], gate[:, -1, :, :d]
            kv = torch.cat([before_kv, kv[..., d:]], dim=2)  # (B, n, 2m, d)
            gate = torch.cat([before_gate, gate[..., d:]], dim=2)
        pooled = (kv * gate.float().softmax(dim=2).to(kv.dtype)).sum(dim=2)  # (B, n, d)
        entries = self.norm(pooled)
        if self.rope_dim:  # at each window's first position
            positions = start + torch.arange(n, device=kv.device) * m  # (n,)
            cos, sin = rope_cos_sin(positions, self.rope_dim, base=self.rope_base, dtype=kv.dtype)
            turned = rotate_pairs(entries[..., d - self.rope_dim :], cos, sin, interleaved=True)
            entries = torch.cat([entries[..., : d - self.rope_dim], turned], dim=-1)
        return entries


class CompressedIndexer(nn.Module):
    """The lightning indexer of a CSA layer, over its own compressed keys.

    ``I[t, w] = sum_h w_{t,h} ReLU(q_{t,h} . K_w) / sqrt(d_I)`` with
    ``w_{t,h} = (W_w x_t)_h / sqrt(H_I)`` (chapter 17's
    :func:`~attention_lib.lightning_indexer`), the keys ``K`` an overlapping
    :class:`Compressor` of width ``d_I``, queries and keys turned by RoPE
    (queries at their positions, keys at their windows'); entries a query
    may not read yet score ``-inf``.

    Explained in chapter 18, *Attention without softmax*.

    Args:
        d_model: model width.
        q_rank: width of the query's low-rank latent (V4's ``q_lora_rank``).
        heads: indexer heads ``H_I``.
        head_dim: ``d_I``.
        rate: tokens per window ``m``.
        rope_dim, rope_base, eps: as :class:`Compressor`.
    """

    def __init__(
        self,
        d_model: int,
        q_rank: int,
        heads: int,
        head_dim: int,
        rate: int,
        *,
        rope_dim: int = 0,
        rope_base: float = 160000.0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        options = {"rope_dim": rope_dim, "rope_base": rope_base, "eps": eps}
        self.compressor = Compressor(d_model, head_dim, rate, overlap=True, **options)
        self.W_q = nn.Linear(q_rank, heads * head_dim, bias=False)
        self.W_w = nn.Linear(d_model, heads, bias=False)

    @classmethod
    def from_hf(cls, module: nn.Module) -> CompressedIndexer:
        """The indexer of a 🤗 transformers (5.24) ``DeepseekV4Indexer``, with
        copied parameters (Explained in chapter 18, *Attention without softmax*)."""
        compressor = Compressor.from_hf(module)  # its TypeError / ValueError
        layer = cls(
            compressor.W_kv.in_features,
            module.q_b_proj.in_features,
            module.num_heads,
            module.head_dim,
            module.compress_rate,
        ).to(module.kv_proj.weight)
        layer.compressor = compressor
        with torch.no_grad():
            layer.W_q.weight.copy_(module.q_b_proj.weight)
            layer.W_w.weight.copy_(module.scorer.weights_proj.weight)
        return layer.train(module.training)

    def forward(
        self, x: Tensor, q_latent: Tensor, positions: Tensor, cache: CompressorCache | None = None
    ) -> Tensor:
        """Scores ``(B, L, T)`` of the new tokens' queries over every closed entry.

        Args:
            x: ``(B, L, d_model)``; q_latent: ``(B, L, q_rank)``, the query's
                normed latent; positions: ``(L,)`` the tokens' positions.
            cache: the compressor's cache (continues its tokens), or ``None``.
        """
        B, L, _ = x.shape
        keys = self.compressor(x, cache)  # (B, T, d_I)
        q = self.W_q(q_latent).view(B, L, self.heads, self.head_dim)  # (B, L, H_I, d_I)
        r, d = self.compressor.rope_dim, self.head_dim
        if r:
            cos, sin = rope_cos_sin(positions, r, base=self.compressor.rope_base, dtype=q.dtype)
            turned = rotate_pairs(q[..., d - r :].transpose(1, 2), cos, sin, interleaved=True)
            q = torch.cat([q[..., : d - r], turned.transpose(1, 2)], dim=-1)
        weights = self.W_w(x) * self.heads**-0.5  # (B, L, H_I)
        keep = compressed_keep(positions, keys.shape[1], self.compressor.rate)  # (L, T)
        return index_scores(q, keys, weights, keep.expand(B, L, -1), d**-0.5)  # (B, L, T)


def compressed_attention(
    query: Tensor,
    keys: Tensor,
    entries: Tensor,
    keep: Tensor,
    entry_keep: Tensor,
    *,
    scale: float | None = None,
) -> Tensor:
    """Attention over recent keys and compressed entries at once (V4's K = V).

    The keys are their own values (V4 shares one key-value head across all
    query heads), the entries too: ``softmax(q [K; E]^T * scale) [K; E]``,
    with ``keep`` the recent keys' mask (a sliding window) and
    ``entry_keep`` the entries' (closed ones, and for CSA the chosen ones).
    Chapter 18 builds the entries it reads; tests/lib/test_compressed.py
    checks it against a loop over the queries.

    Args:
        query: ``(B, H, L, d)``.
        keys: ``(B, S, d)`` the uncompressed key-values.
        entries: ``(B, T, d)`` compressed key-values.
        keep: ``(B or 1, L, S)`` bool; entry_keep: ``(B or 1, L, T)`` bool.
        scale: defaults to ``1 / sqrt(d)``.

    Returns:
        ``(B, H, L, d)``.
    """
    kv = torch.cat([keys, entries], dim=1)[:, None]  # (B, 1, S + T, d)
    B, L = query.shape[0], query.shape[2]
    both = (keep.expand(B, L, -1), entry_keep.expand(B, L, -1))
    mask = torch.cat(both, dim=-1)[:, None]  # (B, 1, L, S + T)
    return F.scaled_dot_product_attention(query, kv, kv, attn_mask=mask, scale=scale)
