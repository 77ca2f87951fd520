"""The blocks of today's decoders: RMSNorm, gated MLPs, and a block as a value.

Chapter 7's block is ``x + attn(LayerNorm(x))`` then ``x + MLP(LayerNorm(x))``
with a ReLU MLP (GPT-2's shape, which :class:`~attention_lib.CausalLM` keeps
by default). The decoders of 2026 (Llama 3, Qwen3, Gemma 3, SmolLM3,
DeepSeek-V3, Qwen3-Next) change three things around the token mixer:

* :class:`RMSNorm` instead of ``LayerNorm``: no mean subtracted, no bias, only
  a learned scale, ``x / rms(x) * w``; Gemma writes the scale as ``1 + w``
  (its weights start at zero);
* a gated MLP (:class:`GatedMLP`): ``down(act(gate(x)) * up(x))``, SwiGLU with
  ``act = SiLU`` (Llama, Qwen, DeepSeek, SmolLM) or GeGLU with the tanh GELU
  (Gemma), without biases;
* *sandwich* norms (Gemma 2 and 3): besides the norm before each sublayer,
  one on the sublayer's output before it joins the residual stream.

A :class:`BlockSpec` names these choices as one frozen value, which
``CausalLM(block=...)`` (and :class:`~attention_lib.Encoder`) take: every
layer of the model is built from it. ``BlockSpec()`` is chapter 7's block.

Explained in chapter 21, *Assembling a 2026 model*, the closing chapter of
Part IV.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .moe import MixtureOfExperts
from .validation import check_bool, check_choice, check_int, check_real

#: Accepted values of ``BlockSpec(norm=...)``.
NORM_KINDS = ("layer", "rms", "rms_1p")
#: Accepted values of ``BlockSpec(mlp=...)``: chapter 7's ReLU MLP, the gated ones, and
#: gpt-oss's mixture of experts (:class:`~attention_lib.moe.MixtureOfExperts`).
MLP_KINDS = ("relu", "swiglu", "geglu", "moe")
#: The activation of each gated MLP.
_ACTIVATIONS = {"swiglu": F.silu, "geglu": lambda x: F.gelu(x, approximate="tanh")}


class RMSNorm(nn.Module):
    r"""Root-mean-square normalisation with a learned scale.

    .. math::

        \mathrm{RMSNorm}(x) = \frac{x}{\sqrt{\mathrm{mean}(x^2) + \epsilon}}
        \odot (\mathrm{offset} + w)

    ``offset=0`` is Llama's (and ``nn.RMSNorm``'s) form, ``w`` starting at
    ones; ``offset=1`` is Gemma's ``1 + w``, ``w`` starting at zeros. Either
    way a fresh norm scales by one.

    Explained in chapter 21, *Assembling a 2026 model*, the closing chapter
    of Part IV.

    Args:
        dim: width of the last dimension.
        eps: added to the mean square.
        offset: ``0.0`` or ``1.0`` (Gemma).

    Shapes:
        - x: ``(..., dim)``
        - output: ``(..., dim)``
    """

    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        *,
        offset: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.dim = check_int("dim", dim, minimum=1)
        self.eps = check_real("eps", eps, at_least=0)
        check_choice("offset", float(offset), (0.0, 1.0))
        self.offset = float(offset)
        start = torch.zeros if self.offset else torch.ones
        self.weight = nn.Parameter(start(dim, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        """Normalise the last dimension of ``x``. A building block: no checks."""
        weight = self.weight + self.offset if self.offset else self.weight
        return F.rms_norm(x, (self.dim,), weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}" + (", offset=1.0" if self.offset else "")


class GatedMLP(nn.Module):
    """A gated MLP: ``down(act(gate(x)) * up(x))``, without biases.

    ``activation="swiglu"`` (SiLU: Llama, Qwen, DeepSeek, SmolLM) or
    ``"geglu"`` (the tanh approximation of GELU: Gemma). Three matrices of
    ``d_model * d_ff`` where chapter 7's MLP has two: gated models pick a
    smaller ``d_ff`` for the same parameters.

    Explained in chapter 21, *Assembling a 2026 model*, the closing chapter
    of Part IV.

    Args:
        d_model: input and output width.
        d_ff: hidden width.
        activation: ``"swiglu"`` or ``"geglu"``.

    Attributes:
        gate, up: ``nn.Linear(d_model, d_ff, bias=False)``.
        down: ``nn.Linear(d_ff, d_model, bias=False)``.

    Shapes:
        - x: ``(..., d_model)``
        - output: ``(..., d_model)``
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "swiglu") -> None:
        super().__init__()
        check_int("d_model", d_model, minimum=1)
        check_int("d_ff", d_ff, minimum=1)
        check_choice("activation", activation, tuple(_ACTIVATIONS))
        self.activation = activation
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """Apply the MLP to every position of ``x``. A building block: no checks."""
        hidden = _ACTIVATIONS[self.activation](self.gate(x)) * self.up(x)  # (..., d_ff)
        return self.down(hidden)  # (..., d_model)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


@dataclass(frozen=True)
class BlockSpec:
    """What every block of a decoder is made of, as one frozen value.

    ``BlockSpec()`` is chapter 7's pre-LN block (``LayerNorm``, ReLU MLP);
    ``BlockSpec("rms", mlp="swiglu")`` is Llama's;
    ``BlockSpec("rms_1p", mlp="geglu", sandwich=True)`` is Gemma 3's.
    The final norm of the stack is of the same kind.

    Explained in chapter 21, *Assembling a 2026 model*, the closing chapter
    of Part IV.

    Attributes:
        norm: ``"layer"`` (``nn.LayerNorm``), ``"rms"`` (:class:`RMSNorm`)
            or ``"rms_1p"`` (Gemma's :class:`RMSNorm` with ``offset=1``).
        mlp: ``"relu"`` (chapter 7's :class:`~attention_lib.FeedForward`,
            with biases), ``"swiglu"`` or ``"geglu"`` (:class:`GatedMLP`), or
            ``"moe"`` (gpt-oss's :class:`~attention_lib.moe.MixtureOfExperts`,
            ``experts`` of width ``d_ff``, ``top_k`` per token).
        sandwich: also normalise each sublayer's output before it joins the
            residual stream (Gemma 2 and 3): ``x + norm(attn(norm(x)))``.
        eps: the norms' epsilon; ``None`` for the norm's default
            (``1e-5`` for ``LayerNorm``, ``1e-6`` for :class:`RMSNorm`).
        experts, top_k: with ``mlp="moe"`` only (and then required): the
            number of experts and of experts per token.

    Raises:
        TypeError, ValueError: if a field is not one of the values above.
    """

    norm: str = "layer"
    mlp: str = "relu"
    sandwich: bool = False
    eps: float | None = None
    experts: int | None = None
    top_k: int | None = None

    def __repr__(self) -> str:  # experts and top_k only for a mixture of experts
        shown = [f for f in fields(self) if f.name not in ("experts", "top_k") or self.experts]
        return f"BlockSpec({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"

    def __post_init__(self) -> None:
        check_choice("norm", self.norm, NORM_KINDS)
        check_choice("mlp", self.mlp, MLP_KINDS)
        if (self.mlp == "moe") != (self.experts is not None and self.top_k is not None):
            raise ValueError(f"experts and top_k go with mlp='moe': {self}")
        check_bool("sandwich", self.sandwich)
        if self.eps is not None:
            check_real("eps", self.eps, above=0)

    def make_norm(self, d_model: int) -> nn.Module:
        """A new norm of this kind over ``d_model``."""
        if self.norm == "layer":
            return nn.LayerNorm(d_model) if self.eps is None else nn.LayerNorm(d_model, self.eps)
        eps = 1e-6 if self.eps is None else self.eps
        return RMSNorm(d_model, eps, offset=float(self.norm == "rms_1p"))

    def make_mlp(self, d_model: int, d_ff: int) -> GatedMLP | MixtureOfExperts:
        """A new gated MLP (or mixture of experts) of this kind, ``d_model ->
        d_ff -> d_model`` (chapter 7's ``"relu"`` MLP is
        :class:`~attention_lib.FeedForward`, which the block builds itself).

        Raises:
            ValueError: for ``mlp="relu"``.
        """
        if self.mlp == "moe":
            return MixtureOfExperts(d_model, d_ff, self.experts, self.top_k)
        check_choice("mlp (gated)", self.mlp, tuple(_ACTIVATIONS))
        return GatedMLP(d_model, d_ff, self.mlp)
