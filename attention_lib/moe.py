"""A small mixture-of-experts MLP: a top-k router and experts, as gpt-oss routes.

A dense MLP sends every token through the same weights. A mixture of experts
keeps ``E`` MLPs (the *experts*) and a *router*, a linear map from the token
to ``E`` logits; each token goes through only the ``k`` experts with the
largest logits, and their outputs are summed, weighted by a softmax over those
``k`` logits (gpt-oss's routing rule, transformers' ``GptOssTopKRouter``).
The parameters grow with ``E``, the work per token only with ``k``.

gpt-oss's experts are SwiGLU MLPs with biases and two changes: the gate and
the up projection are clamped (``gate <= limit``, ``|up| <= limit``), and the
gate's activation is ``gate * sigmoid(alpha * gate)`` multiplied by
``up + 1``.

Explained in chapter 21, *Assembling a 2026 model*, the closing chapter of
Part IV.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .validation import check_int, check_real


class MixtureOfExperts(nn.Module):
    """gpt-oss's mixture-of-experts MLP: route each token to its ``top_k``
    experts, weight their outputs by a softmax over the chosen logits.

    Each expert is ``down(clamped_swiglu(gate(x), up(x)))`` with biases, where
    ``clamped_swiglu(g, u) = (clamp(u, -limit, limit) + 1) * g' *
    sigmoid(alpha * g')`` and ``g' = clamp(g, max=limit)``.

    Explained in chapter 21, *Assembling a 2026 model*, the closing chapter
    of Part IV.

    Args:
        d_model: input and output width.
        d_ff: hidden width of each expert.
        num_experts: the number of experts ``E``.
        top_k: experts per token, ``1 <= top_k <= E``.
        alpha: the gate's sigmoid slope (gpt-oss: 1.702).
        limit: the clamp of the gate and the up projection (gpt-oss: 7).

    Attributes:
        router: ``nn.Linear(d_model, E)``, with a bias.
        gate, up: ``(E, d_model, d_ff)`` weights; ``gate_bias``, ``up_bias``
            ``(E, d_ff)``.
        down: ``(E, d_ff, d_model)``; ``down_bias`` ``(E, d_model)``.

    Shapes:
        - x: ``(..., d_model)``
        - output: ``(..., d_model)``
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        num_experts: int,
        top_k: int,
        *,
        alpha: float = 1.702,
        limit: float = 7.0,
    ) -> None:
        super().__init__()
        self.num_experts = check_int("num_experts", num_experts, minimum=1)
        self.top_k = check_int("top_k", top_k, minimum=1, maximum=num_experts)
        self.alpha, self.limit = check_real("alpha", alpha), check_real("limit", limit, above=0)
        self.router = nn.Linear(d_model, num_experts)
        shapes = {"gate": (d_model, d_ff), "up": (d_model, d_ff), "down": (d_ff, d_model)}
        for name, (n_in, n_out) in shapes.items():
            weight = torch.empty(num_experts, n_in, n_out)
            setattr(self, name, nn.Parameter(nn.init.normal_(weight, std=n_in**-0.5)))
            setattr(self, f"{name}_bias", nn.Parameter(torch.zeros(num_experts, n_out)))

    def forward(self, x: Tensor) -> Tensor:
        """Route every position of ``x`` through its experts. A building block: no checks."""
        tokens = x.reshape(-1, x.shape[-1])  # (N, d_model)
        chosen, experts = self.router(tokens).topk(self.top_k, dim=-1)  # (N, k) each
        weights = F.softmax(chosen, dim=-1)  # (N, k): over the chosen experts only
        out = torch.zeros_like(tokens)
        for e in experts.unique().tolist():  # only the experts some token chose
            rows, slot = torch.where(experts == e)  # tokens routed to e, and in which slot
            h = tokens[rows]  # (n, d_model)
            gate = (h @ self.gate[e] + self.gate_bias[e]).clamp(max=self.limit)  # (n, d_ff)
            up = (h @ self.up[e] + self.up_bias[e]).clamp(-self.limit, self.limit)
            hidden = (up + 1) * (gate * torch.sigmoid(gate * self.alpha))  # (n, d_ff)
            expert = hidden @ self.down[e] + self.down_bias[e]  # (n, d_model)
            out.index_add_(0, rows, expert * weights[rows, slot, None])
        return out.view_as(x)

    @classmethod
    def from_hf(cls, mlp: nn.Module) -> MixtureOfExperts:
        """The module that computes what a 🤗 transformers (5.24) ``GptOssMLP``
        computes: its router's weight and bias, and its experts' interleaved
        ``gate_up_proj`` (even columns: gate, odd: up), ``down_proj`` and
        their biases, copied.

        Explained in chapter 21, *Assembling a 2026 model*.

        Raises:
            TypeError: if ``mlp`` does not have a ``GptOssMLP``'s parts.
        """
        router, experts = getattr(mlp, "router", None), getattr(mlp, "experts", None)
        parts = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias", "limit")
        if not (hasattr(router, "top_k") and all(hasattr(experts, p) for p in parts)):
            raise TypeError(f"mlp must be a GptOssMLP (router, experts), got {type(mlp).__name__}")
        gate_up = experts.gate_up_proj.detach()  # (E, d_model, 2 d_ff), gate and up interleaved
        ours = cls(
            gate_up.shape[1],
            gate_up.shape[2] // 2,
            gate_up.shape[0],
            router.top_k,
            alpha=float(experts.alpha),
            limit=float(experts.limit),
        ).to(gate_up)
        with torch.no_grad():
            ours.router.weight.copy_(router.weight)
            ours.router.bias.copy_(router.bias)
            bias = experts.gate_up_proj_bias
            ours.gate.copy_(gate_up[..., ::2])
            ours.up.copy_(gate_up[..., 1::2])
            ours.gate_bias.copy_(bias[..., ::2])
            ours.up_bias.copy_(bias[..., 1::2])
            ours.down.copy_(experts.down_proj)
            ours.down_bias.copy_(experts.down_proj_bias)
        return ours.train(mlp.training)

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, top_k={self.top_k}, limit={self.limit}"
