"""Whole 🤗 transformers decoders as a :class:`~attention_lib.CausalLM`.

``CausalLM.from_hf(model)`` (:meth:`~attention_lib.CausalLM.from_hf`, which
``CausalLM`` inherits from ``DecoderConverters``) reads a transformers
``...ForCausalLM`` layer by layer and builds the book's model from the same
parts: each attention layer through ``MultiHeadAttention.from_hf`` (RoPE and
its scalings, grouped heads, QK-norm, windows, NoPE layers, ``head_dim``) or
``MultiHeadLatentAttention.from_hf`` (DeepSeek's MLA, with YaRN), the blocks
as a :class:`~attention_lib.BlockSpec` (RMSNorm or Gemma's ``1 + w``, SwiGLU
or GeGLU, pre-norm or sandwich norms), and the ends of the model (embedding
scale, tied embeddings, final soft-capping). Each layer becomes a
:class:`~attention_lib.layer_types.LayerSpec` (``"full"``, ``"sliding"`` with
its own RoPE base, as Gemma 3's 10k local and 1M global layers, or
``"mla"``), so ``model.layer_specs`` is the model's table of layers.

What is read is what the model *has* (its submodules, probed on inputs), not
its class name. Qwen3-Next's linear layers become
:class:`~attention_lib.gated_deltanet.GatedDeltaNet` s
(``GatedDeltaNet.from_hf``, ``"linear"`` layers), Kimi Linear's KDA layers
:class:`~attention_lib.kda.KimiDeltaAttention` s (``"kda"``) and the
Mamba-2 layers of Bamba (whose sublayers are named ``mamba``,
``feed_forward`` and ``pre_ff_layernorm``)
:class:`~attention_lib.mamba2.Mamba2` s (``"mamba2"``). Whatever this package does
not compute (a mixture-of-experts MLP other than gpt-oss's, which becomes a
:class:`~attention_lib.moe.MixtureOfExperts`, a norm or an activation of another kind, an
attention layer that ``MultiHeadAttention.from_hf`` refuses, a decoder layer
with other sublayers) is refused with a ``ValueError`` that names it; and the
finished model is run once against the original on a short probe
(``check=True``), so a computation that no submodule shows (a multiplier in
the model's own ``forward``) is refused too, never converted silently wrong.

Explained in chapter 21, *Assembling a 2026 model*, the closing chapter of
Part IV.
"""

from __future__ import annotations

from typing import Any, Self

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .blocks import BlockSpec
from .convert import rms_norm_offset
from .gated_deltanet import GatedDeltaNet, RecurrentMixer
from .kda import KimiDeltaAttention
from .layer_types import LayerSpec
from .mamba2 import Mamba2
from .mha import MultiHeadAttention
from .mla import MultiHeadLatentAttention
from .moe import MixtureOfExperts
from .validation import check_bool

#: The sublayers of a pre-norm decoder layer, and of a sandwich one (Gemma 2, 3).
_PRE_NORM = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
_SANDWICH = _PRE_NORM | {"pre_feedforward_layernorm", "post_feedforward_layernorm"}
#: The activations of the gated MLPs this package computes.
_GATED = {"swiglu": F.silu, "geglu": lambda x: F.gelu(x, approximate="tanh")}
#: Other names of those sublayers (Qwen3-Next's and Bamba's linear layers, Bamba's MLP).
_ALIASES = {
    "linear_attn": "self_attn",
    "mamba": "self_attn",
    "feed_forward": "mlp",
    "pre_ff_layernorm": "post_attention_layernorm",
    "final_layernorm": "norm",
}


def _part(module: nn.Module, name: str) -> nn.Module | None:
    """``module``'s sublayer ``name``, or the one that :data:`_ALIASES` names so."""
    if (part := getattr(module, name, None)) is not None:
        return part
    other = (alias for alias, canonical in _ALIASES.items() if canonical == name)
    return next((p for a in other if (p := getattr(module, a, None)) is not None), None)


class DecoderConverters:
    """The converter of :class:`~attention_lib.CausalLM`, which it inherits
    (``CausalLM.from_hf(model)``): it builds ``cls`` from a whole 🤗
    transformers decoder, or refuses the model by name.

    Explained in chapter 21, *Assembling a 2026 model*, the closing chapter
    of Part IV.
    """

    @classmethod
    def from_hf(
        cls,
        model: nn.Module,
        *,
        backend: str = "lib",
        max_len: int | None = None,
        check: bool = True,
    ) -> Self:
        """The :class:`~attention_lib.CausalLM` that computes what a 🤗
        transformers decoder-only model computes, or a ``ValueError`` naming
        what it cannot reproduce.

        Reproduced (tested on tiny random configs of transformers 5.24): Llama 3
        (``"llama3"`` RoPE scaling), Qwen3 (QK-norm, ``head_dim``), Gemma 3's
        text model (5 sliding : 1 full layers with their two RoPE bases,
        ``1 + w`` RMSNorms, sandwich norms, GeGLU, embedding scale, tied
        embeddings), Gemma 2 (attention and final logit soft-capping), SmolLM3
        (NoPE layers), DeepSeek-V3 with dense layers (MLA with YaRN) and
        Qwen3-Next with dense MLPs (3 Gated DeltaNet layers : 1 full layer with
        partial RoPE, an output gate and ``1 + w`` norms) and gpt-oss (attention
        sinks, sliding and full layers, YaRN, and its mixture of experts with
        clamped SwiGLU experts, :class:`~attention_lib.moe.MixtureOfExperts`),
        Kimi Linear with KDA layers only and dense MLPs
        (:class:`~attention_lib.kda.KimiDeltaAttention`) and Bamba (Mamba-2
        layers, :class:`~attention_lib.mamba2.Mamba2`, and attention layers
        with partial RoPE). In float32 the logits agree to about ``1e-6``; in float64 to about
        ``1e-7`` only, because transformers computes its RoPE tables (and
        Gemma its norms) in float32 whatever the model's dtype.

        Refused, by name: DeepSeek-V3.2's indexer, latent attention in a
        model without a rotary embedding (Kimi Linear's full layers), a decoder layer whose sublayers
        are not those of a pre-norm or a sandwich block; a mixture of experts
        other than gpt-oss's (DeepSeek's and Qwen3-Next's, with shared
        experts); an MLP that is not a gated MLP without biases with SiLU or
        tanh-GELU; norms that are not RMSNorms of one form and
        epsilon; a ``d_ff`` that differs between layers; an embedding that is not
        a (scaled) lookup; and every attention layer
        ``MultiHeadAttention.from_hf`` refuses (``"dynamic"`` RoPE,
        a bias in some projections only, ...).

        Explained in chapter 21, *Assembling a 2026 model*, the closing
        chapter of Part IV.

        Args:
            model: a transformers ``...ForCausalLM`` with ``model.model``
                (``embed_tokens``, ``layers``, ``norm``) and ``model.lm_head``.
            backend: the attention backend of every layer.
            max_len: the new model's ``max_len``; ``None`` for the config's
                ``max_position_embeddings``.
            check: run both models on a probe of a few tokens and refuse the
                conversion if their logits differ (a computation no submodule
                shows, such as Granite's multipliers).

        Returns:
            A new :class:`~attention_lib.CausalLM` with copied weights, in
            ``model``'s training mode, dtype and device.

        Raises:
            TypeError: if ``model`` does not have that structure.
            ValueError: naming the first part it cannot reproduce.
        """
        check_bool("check", check)
        decoder, head = getattr(model, "model", None), getattr(model, "lm_head", None)
        config = getattr(model, "config", None)
        parts = [_part(decoder, n) for n in ("embed_tokens", "layers", "norm")]
        kinds = (nn.Embedding, nn.ModuleList, nn.Module, nn.Linear)
        if config is None or not all(map(isinstance, (*parts, head), kinds)):
            what = "a transformers ...ForCausalLM (model.embed_tokens/layers/norm, lm_head, config)"
            raise TypeError(f"model must be {what}, got {type(model).__name__}")
        embedding, layers, final_norm = parts
        d_model = embedding.embedding_dim
        rope = getattr(decoder, "rotary_emb", None) is not None  # Kimi Linear's MLA: none
        mixers = [_attention(layer, i, backend, rope) for i, layer in enumerate(layers)]
        blocks = [_block(layer, i, d_model) for i, layer in enumerate(layers)]
        (block, d_ff), *others = blocks
        if any(other != (block, d_ff) for other in others):
            raise ValueError(f"cannot convert: the layers' blocks differ ({sorted(set(blocks))})")
        if _norm_kind(final_norm, d_model, "the final norm") != (block.norm, block.eps):
            raise ValueError("cannot convert: the final norm differs from the layers' norms")
        scale = _embedding_scale(embedding)
        ours = cls(
            embedding.num_embeddings,
            d_model,
            next((m for m in mixers if not isinstance(m, RecurrentMixer)), mixers[0]).num_heads,
            # each layer's own mixer replaces the one built here
            len(layers),
            max_len=max_len or int(getattr(config, "max_position_embeddings", 2048)),
            d_ff=d_ff,
            positional="rope",
            backend=backend,
            layer_types=[_spec(mixer) for mixer in mixers],
            block=block,
            tie_embeddings=head.weight is embedding.weight,
            embed_scale=scale,
            logit_softcap=getattr(config, "final_logit_softcapping", None),
            head_bias=head.bias is not None,
        ).to(dtype=embedding.weight.dtype, device=embedding.weight.device)
        with torch.no_grad():
            ours.embedding.weight.copy_(embedding.weight)
            if ours.head.weight is not ours.embedding.weight:
                ours.head.load_state_dict(head.state_dict())
            elif head.bias is not None:
                ours.head.bias.copy_(head.bias)
            ours.blocks.norm.weight.copy_(final_norm.weight)
            for theirs, layer, mixer in zip(layers, ours.blocks.layers, mixers):
                layer.self_attn = mixer  # what convert.from_hf built (norm epsilons too)
                _copy_block(theirs, layer, block)
        ours.train(model.training)
        if check:
            _check_probe(model, ours)
        return ours


def _attention(
    layer: nn.Module, index: int, backend: str, rope: bool = True
) -> MultiHeadAttention | MultiHeadLatentAttention | GatedDeltaNet:
    """Layer ``index``'s token mixer: ``MultiHeadAttention.from_hf``,
    ``MultiHeadLatentAttention.from_hf`` for DeepSeek's latent layers (those
    with a ``kv_b_proj``; without DeepSeek-V3.2's indexer), or
    ``GatedDeltaNet.from_hf`` for Qwen3-Next's linear layers (``linear_attn``),
    ``KimiDeltaAttention.from_hf`` for Kimi Linear's (a ``forget_gate``),
    ``Mamba2.from_hf`` for Bamba's Mamba-2 layers (``mamba``). ``rope``: the
    model has a rotary embedding (a latent layer of a model without one is
    refused)."""
    attention = getattr(layer, "self_attn", None)
    linear = getattr(layer, "linear_attn", None)
    if linear is not None and attention is None:  # Qwen3-Next's Gated DeltaNet (chapter 18)
        return GatedDeltaNet.from_hf(linear)  # or its ValueError, naming what it cannot compute
    if (mamba := getattr(layer, "mamba", None)) is not None and attention is None:
        return Mamba2.from_hf(mamba)  # Bamba's Mamba-2 layer (chapter 18)
    if attention is not None and hasattr(attention, "forget_gate"):  # Kimi Linear's KDA
        return KimiDeltaAttention.from_hf(attention)
    if attention is None:
        children = sorted(name for name, _ in layer.named_children())
        raise ValueError(f"cannot convert layer {index}: no self_attn (it has {children})")
    try:
        if hasattr(attention, "kv_b_proj"):  # MLA (chapter 17)
            if getattr(attention, "indexer", None) is not None:
                raise ValueError("DSA's lightning indexer (DeepSeek-V3.2) is not converted here")
            if not rope:  # the model has no rotary embedding to give it
                raise ValueError("latent attention without RoPE (Kimi Linear's) is not reproduced")
            return MultiHeadLatentAttention.from_hf(attention)
        return MultiHeadAttention.from_hf(attention, backend=backend)
    except (TypeError, ValueError) as error:
        raise ValueError(f"cannot convert layer {index}'s attention: {error}") from error


def _block(layer: nn.Module, index: int, d_model: int) -> tuple[BlockSpec, int]:
    """The :class:`BlockSpec` and ``d_ff`` of a decoder layer, or a ``ValueError``."""
    children = {_ALIASES.get(name, name) for name, _ in layer.named_children()}
    if children not in (_PRE_NORM, _SANDWICH):
        mlp = type(getattr(layer, "mlp", None)).__name__
        raise ValueError(
            f"cannot convert layer {index}, whose sublayers {sorted(children)} (mlp: {mlp}) are"
            f" not those of a pre-norm or sandwich block {sorted(_SANDWICH)}"
        )
    norms = {
        _norm_kind(_part(layer, name), d_model, f"layer {index}'s {name}")
        for name in sorted(children)
        if name.endswith("layernorm")
    }
    if len(norms) > 1:
        raise ValueError(f"cannot convert layer {index}: its norms differ ({sorted(norms)})")
    (norm, eps), mlp = norms.pop(), _part(layer, "mlp")
    experts = {}
    if hasattr(mlp, "router"):  # gpt-oss's mixture of experts (its router's rule, top-k)
        moe = MixtureOfExperts.from_hf(mlp)
        kind, d_ff, experts = "moe", moe.up.shape[-1], {"experts": moe.num_experts}
        experts["top_k"] = moe.top_k
    else:
        kind, d_ff = _gated_mlp(mlp, index)
    sandwich = children == _SANDWICH
    return BlockSpec(norm, mlp=kind, sandwich=sandwich, eps=eps, **experts), d_ff


def _norm_kind(norm: nn.Module, d_model: int, where: str) -> tuple[str, float]:
    """(``"rms"`` or ``"rms_1p"``, epsilon) of a transformers RMSNorm."""
    offset = rms_norm_offset(norm, d_model)
    if offset is None:
        raise ValueError(f"cannot convert {where}, a {type(norm).__name__}: not an RMSNorm")
    eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
    return ("rms_1p" if offset else "rms"), eps


def _gated_mlp(mlp: nn.Module, index: int) -> tuple[str, int]:
    """(``"swiglu"`` or ``"geglu"``, ``d_ff``) of a gated MLP, or a ``ValueError``
    naming what it is (a mixture of experts, biases, another activation)."""
    children = {name: child for name, child in mlp.named_children()}
    projections = [children.get(n) for n in ("gate_proj", "up_proj", "down_proj")]
    linear = all(isinstance(p, nn.Linear) for p in projections)
    if not linear or set(children) != {"gate_proj", "up_proj", "down_proj", "act_fn"}:
        what = f"{type(mlp).__name__} with {sorted(children)}"
        raise ValueError(
            f"cannot convert layer {index}'s MLP, a {what}: not a gated MLP"
            " (of the mixture-of-experts MLPs, only gpt-oss's is reproduced)"
        )
    if any(p.bias is not None for p in projections):
        raise ValueError(f"cannot convert layer {index}'s MLP: biases in its projections")
    x = torch.linspace(-6, 6, 97, dtype=projections[0].weight.dtype)
    with torch.no_grad():
        out = children["act_fn"](x)
    for kind, activation in _GATED.items():
        if torch.allclose(out, activation(x), rtol=0, atol=1e-6):
            return kind, projections[0].out_features
    name = type(children["act_fn"]).__name__
    raise ValueError(f"cannot convert layer {index}'s MLP: activation {name}, not SiLU/tanh-GELU")


def _embedding_scale(embedding: nn.Embedding) -> float | None:
    """``None`` for a plain lookup, the factor of a scaled one (Gemma's
    ``sqrt(d_model)``), or a ``ValueError``."""
    ids = torch.arange(min(embedding.num_embeddings, 16), device=embedding.weight.device)
    with torch.no_grad():
        looked_up, rows = embedding(ids), embedding.weight[ids]
    scale = getattr(embedding, "scalar_embed_scale", None)
    if type(embedding) is nn.Embedding or (scale is None and torch.equal(looked_up, rows)):
        return None
    if scale is not None and torch.allclose(looked_up, rows * scale, rtol=1e-6, atol=0):
        return float(scale)
    raise ValueError(f"cannot convert the embedding, a {type(embedding).__name__}: not a lookup")


def _spec(mixer: MultiHeadAttention | MultiHeadLatentAttention | GatedDeltaNet) -> LayerSpec:
    """The :class:`LayerSpec` that builds a module like ``mixer`` (an MLA
    layer's without its RoPE scaling, a linear layer's without its sizes,
    which the layer table does not pass: the converted module, which replaces
    the one built, has them)."""
    if isinstance(mixer, (KimiDeltaAttention, Mamba2)):  # its sizes: see above
        return LayerSpec("kda" if isinstance(mixer, KimiDeltaAttention) else "mamba2")
    if isinstance(mixer, GatedDeltaNet):
        return LayerSpec("linear")
    if isinstance(mixer, MultiHeadLatentAttention):
        sizes = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        sizes += ("q_lora_rank", "rope_base", "scale")
        return LayerSpec("mla", **{name: getattr(mixer, name) for name in sizes})
    options: dict[str, Any] = {
        "num_kv_heads": mixer.num_kv_heads,
        "rope_base": mixer.rope_base,
        "rope_scaling": mixer.rope_scaling,
        "scale": mixer.scale,
        "qk_norm": mixer.q_norm is not None,
        "softcap": mixer.softcap,
        "sink": mixer.sink is not None,
        "bias": mixer.W_q.bias is not None,
        "head_dim": mixer.d_k,
        "gate": mixer.W_g is not None,
        "rope_dim": None if mixer.rope_dim == mixer.d_k else mixer.rope_dim,
    }
    if mixer.window is not None:
        return LayerSpec("sliding", window=mixer.window, **options)
    return LayerSpec("full", **options)


def _copy_block(theirs: nn.Module, layer: nn.Module, block: BlockSpec) -> None:
    """Copy a transformers decoder layer's norms and MLP into ``layer``."""
    norms = {
        "norm1": "input_layernorm",
        "norm2": "pre_feedforward_layernorm" if block.sandwich else "post_attention_layernorm",
    }
    if block.sandwich:
        norms |= {
            "post_norm1": "post_attention_layernorm",
            "post_norm2": "post_feedforward_layernorm",
        }
    for ours, name in norms.items():
        getattr(layer, ours).weight.copy_(_part(theirs, name).weight)
    if block.mlp == "moe":  # gpt-oss: its router and experts (alpha, limit too)
        layer.ffn = MixtureOfExperts.from_hf(theirs.mlp)
        return
    for ours in ("gate", "up", "down"):
        getattr(layer.ffn, ours).weight.copy_(getattr(_part(theirs, "mlp"), f"{ours}_proj").weight)


def _check_probe(model: nn.Module, ours: nn.Module) -> None:
    """Refuse the conversion if the two models' logits differ on a probe."""
    weight = ours.embedding.weight
    length = min(8, ours.max_len)
    tokens = torch.arange(length, device=weight.device)[None] * 7 % ours.vocab_size  # (1, L)
    with torch.no_grad():
        expected: Tensor = model(tokens, use_cache=False).logits
        got = ours(tokens)
    scale = float(expected.abs().max()) + 1.0
    tolerance = 1e-4 if weight.dtype in (torch.float32, torch.float64) else 3e-2
    difference = float((got - expected).abs().max())
    if difference > tolerance * scale:
        raise ValueError(
            f"cannot convert {type(model).__name__}: the converted model's logits differ by"
            f" {difference:.3g} on a probe (it computes something no submodule shows)"
        )
