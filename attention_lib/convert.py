"""Converting attention layers of other libraries into :class:`~attention_lib.MultiHeadAttention`.

The one home of the conversion code: :class:`AttentionConverters` holds the
converters, which :class:`~attention_lib.MultiHeadAttention` inherits as its
classmethods ``from_torch``, ``from_hf_llama`` and ``from_hf`` (this module
does not import ``attention_lib.mha``: a converter builds ``cls``, so
there is no import cycle).

A converter copies a layer's weights and reads its options. It either builds a
module that computes the same function as the layer, or refuses the layer with
a ``ValueError`` that names what it cannot reproduce: it never converts a layer
silently wrong. What a layer computes is read from what it *has* (its
submodules, its config fields, its score scaling, the rotation its code
applies), never from its class name, so that a layer of a family not tested
here is either reproduced or refused for the right reason.

Explained in chapter 6, *Multi-head attention* (``nn.MultiheadAttention``) and
chapter 10, *Attention in today's LLMs* (🤗 transformers' ``LlamaAttention``);
scaled RoPE and the per-layer patterns of long-context models
(:func:`~attention_lib.layer_options_from_hf`) in chapter 16, *Long contexts*.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Self

import torch
from torch import nn

from .rope import ROPE_SCALING_FIELDS, apply_rope, rope_frequencies, rope_permutation
from .validation import check_instance

_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
_CONFIG_FIELDS = ("num_attention_heads", "num_key_value_heads", "hidden_size", "rope_parameters")
#: transformers' names of the per-layer attention types -> ``CausalLM(layer_types=...)``'s.
HF_LAYER_TYPES = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
}


def layer_options_from_hf(config: Any) -> dict[str, Any]:
    """The per-layer options of a 🤗 transformers model config, as
    :class:`~attention_lib.CausalLM` takes them.

    Reads ``config.layer_types`` (``"full_attention"``, ``"sliding_attention"``,
    ``"chunked_attention"``, one per layer: Gemma 2 and 3, Llama 4, ...),
    ``sliding_window``, ``attention_chunk_size`` and Llama 4's
    ``no_rope_layers`` (``0`` marks a layer without RoPE).

    Explained in chapter 16, *Long contexts*.

    Args:
        config: a transformers ``PretrainedConfig`` (or any object with those
            fields) that has ``layer_types``.

    Returns:
        A dict with the keys ``layer_types`` (a list of names), ``window``,
        ``chunk_size`` and ``nope_layers`` (a list of layer indices).

    Raises:
        ValueError: if ``config`` has no ``layer_types``, or a layer type this
            package does not compute (e.g. ``"linear_attention"``).
    """
    kinds = list(getattr(config, "layer_types", None) or [])
    unknown = sorted(set(kinds) - set(HF_LAYER_TYPES))
    if not kinds or unknown:
        raise ValueError(f"config must have layer_types among {list(HF_LAYER_TYPES)}, got {kinds}")
    no_rope = getattr(config, "no_rope_layers", None) or [1] * len(kinds)
    return {
        "layer_types": [HF_LAYER_TYPES[kind] for kind in kinds],
        "window": getattr(config, "sliding_window", None) if "sliding_attention" in kinds else None,
        "chunk_size": getattr(config, "attention_chunk_size", None)
        if "chunked_attention" in kinds
        else None,
        "nope_layers": [i for i, uses_rope in enumerate(no_rope) if not uses_rope],
    }


class AttentionConverters:
    """The converters of :class:`~attention_lib.MultiHeadAttention`, which it
    inherits: each builds ``cls`` from a layer of another library, or refuses
    the layer with a ``ValueError`` naming what it cannot reproduce.

    Chapters 6, 10 and 15 call them as ``MultiHeadAttention.from_torch``,
    ``.from_hf_llama`` and ``.from_hf``; each method names its chapter.
    """

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention, *, backend: str = "lib") -> Self:
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
            A new :class:`~attention_lib.MultiHeadAttention` with copied
            parameters, in the training/eval mode of ``module``.

        Raises:
            TypeError: if ``module`` is not an ``nn.MultiheadAttention``.
            ValueError: if ``module`` uses a feature this class does not have.
        """
        check_instance("module", module, nn.MultiheadAttention, "a torch.nn.MultiheadAttention")
        d_model = module.embed_dim
        refusals = (  # (convertible, what MultiHeadAttention needs, what the module has)
            (module.batch_first, "batch_first=True (inputs (B, L, d_model))", "batch_first=False"),
            (
                module.kdim == module.vdim == d_model,
                f"kdim == vdim == embed_dim={d_model}",
                f"kdim={module.kdim} and vdim={module.vdim}",
            ),
            (module.bias_k is None, "add_bias_kv=False", "add_bias_kv=True"),
            (not module.add_zero_attn, "add_zero_attn=False", "add_zero_attn=True"),
        )
        for convertible, needed, has in refusals:
            if not convertible:
                raise ValueError(f"module must be built with {needed}, got {has}")
        weight, bias = module.in_proj_weight, module.in_proj_bias
        ours = cls(
            d_model,
            module.num_heads,
            dropout=module.dropout,
            bias=bias is not None,
            backend=backend,
            device=weight.device,
            dtype=weight.dtype,
        )
        with torch.no_grad():
            for i, linear in enumerate((ours.W_q, ours.W_k, ours.W_v)):
                rows = slice(i * d_model, (i + 1) * d_model)
                linear.weight.copy_(weight[rows])  # (d_model, d_model)
                if bias is not None:
                    linear.bias.copy_(bias[rows])
            ours.W_o.load_state_dict(module.out_proj.state_dict())
        return ours.train(module.training)

    @classmethod
    def from_hf(cls, module: nn.Module, *, backend: str = "lib") -> Self:
        """``from_hf_llama`` under its general name: any transformers attention
        layer this package can reproduce (chapter 10's Llama, Mistral, Qwen2-style
        windows; Qwen3's QK-norm, Gemma 2's soft-capping and gpt-oss's sinks, the
        features of chapter 15), or a ``ValueError`` naming what it cannot.
        A BERT ``BertAttention`` (its ``self``, a ``BertSelfAttention``, and
        its ``output``, a ``BertSelfOutput``) is converted by
        :meth:`from_hf_bert`.

        Explained in chapter 15, *Where attention goes*."""
        if _is_bert_attention(module):
            return cls.from_hf_bert(module, backend=backend)
        return cls.from_hf_llama(module, backend=backend)

    @classmethod
    def from_hf_bert(cls, module: nn.Module, *, backend: str = "lib") -> Self:
        """Build the module that computes BERT's multi-head self-attention: a
        🤗 transformers ``BertAttention``'s ``self.query``, ``self.key``,
        ``self.value`` become ``W_q``, ``W_k``, ``W_v`` and ``output.dense``
        becomes ``W_o``. Bidirectional: call it without ``is_causal``, with the
        keep-mask of the real tokens, ``(B, 1, 1, L)``.
        ``output.LayerNorm`` (and the residual it normalises) is not attention:
        it is the post-LN norm of the layer (``EncoderLayer(norm_placement=
        "post")``), which :meth:`Encoder.from_hf <attention_lib.Encoder.from_hf>`
        copies.

        Explained in chapter 8, *Attention in a trained model*.

        Args:
            module: a ``BertAttention`` of a ``BertModel`` (all-MiniLM-L6-v2's).
            backend: attention backend of the new module.

        Returns:
            A new :class:`~attention_lib.MultiHeadAttention` with copied
            parameters, in the training/eval mode of ``module``.

        Raises:
            TypeError: if ``module`` is not a ``BertAttention``-like layer.
            ValueError: for a cross-attention, a causal (decoder) layer or
                relative position scores, which this class does not compute.
        """
        if not _is_bert_attention(module):
            raise TypeError(f"module must be a BertAttention, got {type(module).__name__}")
        inner, config = module.self, getattr(module.self, "config", None)
        heads = int(getattr(inner, "num_attention_heads", 0))
        d_model = inner.query.in_features
        positions = getattr(config, "position_embedding_type", "absolute")
        parts = (inner.query, inner.key, inner.value, module.output.dense)
        refused = {
            "cross-attention": getattr(module, "is_cross_attention", False),
            "causal attention (a decoder)": getattr(inner, "is_causal", False)
            or getattr(config, "is_decoder", False),
            "relative position scores": positions not in (None, "absolute"),
            "heads that do not split the width": heads < 1 or inner.query.out_features % heads,
            "a bias in some projections only": len({p.bias is None for p in parts}) > 1,
        }
        found = [feature for feature, has in refused.items() if has]
        if found:
            raise ValueError(f"cannot convert {type(module).__name__}: {', '.join(found)}")
        head_dim = inner.query.out_features // heads
        scaling = float(getattr(inner, "scaling", head_dim**-0.5))
        weight = inner.query.weight
        ours = cls(
            d_model,
            heads,
            dropout=float(getattr(config, "attention_probs_dropout_prob", 0.0)),
            bias=inner.query.bias is not None,
            backend=backend,
            scale=None if math.isclose(scaling, head_dim**-0.5, rel_tol=1e-9) else scaling,
            head_dim=None if head_dim * heads == d_model else head_dim,
            device=weight.device,
            dtype=weight.dtype,
        )
        with torch.no_grad():
            for linear, source in zip((ours.W_q, ours.W_k, ours.W_v, ours.W_o), parts):
                linear.load_state_dict(source.state_dict())
        return ours.train(module.training)

    @classmethod
    def from_hf_llama(cls, module: nn.Module, *, backend: str = "lib") -> Self:
        """Build the module that computes the same function as a 🤗 transformers
        ``LlamaAttention``, or as another layer with the same computation.

        Copies ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj`` into ``W_q``,
        ``W_k``, ``W_v`` and ``W_o``, and reads the rest from the layer and its
        config: ``num_key_value_heads``, the RoPE base
        (``rope_parameters["rope_theta"]``; no RoPE for a layer whose ``use_rope``
        is false, as SmolLM3's NoPE layers), a score scaling other than
        ``1/sqrt(head_dim)`` (``module.scaling``, e.g. Granite's
        ``attention_multiplier`` or Gemma 2's ``query_pre_attn_scalar``) as
        ``scale``, and the layer's sliding window (``module.sliding_window`` for
        the sliding layers of Qwen2 or Gemma 2, else ``config.sliding_window`` as
        in Mistral) as ``window``. A layer that rotates coordinate pairs
        ``(2i, 2i+1)`` (the interleaved RoPE of Cohere or Helium) is reproduced by permuting
        the rows of each head of ``W_q`` and ``W_k``
        (:func:`~attention_lib.rope_permutation`): the scores stay the same.

        transformers' layer takes the rotary ``position_embeddings`` and the mask
        from its model; the new module computes both itself. Call it with
        ``is_causal=True`` for the model's causal mask, sliding window included
        (``window`` is in the module); also with a ``kv_cache``, where the new
        queries are aligned after the cached keys (bottom-right), as the model
        aligns them. RoPE positions are ``0 .. L-1``, continued after a
        ``kv_cache``; pass ``positions`` for others, and a padding ``mask`` for
        padded batches. transformers itself is not imported.

        Refused, with a ``ValueError`` that names the feature, because
        :class:`~attention_lib.MultiHeadAttention` does not compute them:
        submodules or parameters besides the four projections (the ``q_norm`` /
        ``k_norm`` of Qwen3, OLMo 2 and Cohere's QK-norm, attention sinks),
        ``clip_qkv`` (OLMo), attention logit soft-capping (Gemma 2's
        ``attn_logit_softcapping``), a rotation other than rotate-half or
        interleaved RoPE with the default, ``"linear"``, ``"yarn"`` or ``"llama3"``
        frequencies (Llama 3.1's and YaRN's scalings are reproduced, chapter 16;
        ``"dynamic"``, whose speeds depend on the length of each call and on the
        lengths the model saw before, is refused, as is any other ``rope_type``),
        a bias in some projections only (Qwen2), and bidirectional attention
        (``is_causal=False``). A head width other than ``hidden_size //
        num_attention_heads`` (Qwen3, Gemma 3) is reproduced (``head_dim``), and
        so are Gemma 3's QK-norm, whose weight is ``1 + w``, and Qwen3-Next's
        full-attention layer (chapter 21): its partial RoPE
        (``partial_rotary_factor``, as ``rope_dim``) and its output gate, a
        ``q_proj`` twice as wide whose second half of each head's rows becomes
        ``W_g``.

        Explained in chapter 10, *Attention in today's LLMs*.

        Args:
            module: a ``transformers`` ``LlamaAttention``, or a layer with its
                projections, config and computation (e.g. ``MistralAttention``;
                tiny configurations with random weights are enough for tests).
            backend: attention backend of the new module.

        Returns:
            A new :class:`~attention_lib.MultiHeadAttention` with copied
            parameters, in the training/eval mode of ``module``.

        Raises:
            TypeError: if ``module`` does not have ``nn.Linear`` projections
                ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` and a config with
                ``num_attention_heads``, ``num_key_value_heads``, ``hidden_size``
                and ``rope_parameters``.
            ValueError: if it computes something this class does not (the
                message names every such feature).
        """
        config, name = getattr(module, "config", None), type(module).__name__
        layer = all(isinstance(getattr(module, n, None), nn.Linear) for n in _PROJECTIONS)
        if not layer or not all(hasattr(config, field) for field in _CONFIG_FIELDS):
            what = "a transformers attention layer like LlamaAttention (q/k/v/o_proj, a config)"
            raise TypeError(f"module must be {what}, got {name}")
        heads, d_model = config.num_attention_heads, config.hidden_size
        head_dim = getattr(module, "head_dim", None) or module.q_proj.out_features // heads
        gate = module.q_proj.out_features == 2 * heads * head_dim  # Qwen3-Next: query + gate
        rope = config.rope_parameters or {}
        rope = rope.get(getattr(module, "layer_type", None), rope)  # one per layer type (Gemma 3)
        uses_rope = bool(getattr(module, "use_rope", True))  # SmolLM3: 0 in its NoPE layers
        partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
        rope_dim = int(head_dim * (partial or 1.0))  # Qwen3-Next: a quarter of each head
        layout = _rope_layout(module, head_dim, rope_dim) if uses_rope else None
        biased = [n for n in _PROJECTIONS if getattr(module, n).bias is not None]
        offsets = {
            rms_norm_offset(getattr(module, n, None), head_dim) for n in ("q_norm", "k_norm")
        }
        qk_norm = len(offsets) == 1 and None not in offsets  # Qwen3's QK-norm, Gemma 3's (1 + w)
        # (OLMo 2 normalises all heads at once, Cohere with a LayerNorm: refused)
        sinks = getattr(module, "sinks", None)  # gpt-oss: one logit per head
        sink = isinstance(sinks, nn.Parameter) and tuple(sinks.shape) == (heads,)
        ours_too = {*_PROJECTIONS, *(("q_norm", "k_norm") if qk_norm else ()), *(("sinks",) * sink)}
        extras = [n for n, _ in module.named_children() if n not in ours_too]
        softcap = getattr(
            module, "attn_logit_softcapping", getattr(config, "attn_logit_softcapping", None)
        )
        rope_scaling, scaled = _rope_scaling(rope)  # linear, YaRN and Llama 3.1's (chapter 16)
        default_rope = scaled and "rope_theta" in rope and 2 <= rope_dim <= head_dim
        refused = {  # a feature MultiHeadAttention does not compute -> what the layer has, if it has it
            "submodules or parameters besides the projections, a per-head RMS QK-norm and sinks": (
                extras + [n for n, _ in module.named_parameters(recurse=False) if n not in ours_too]
            ),
            "clip_qkv (clamped projections)": getattr(config, "clip_qkv", None),
            "a RoPE other than the default, linear, yarn or llama3 (rope_parameters)": uses_rope
            and not default_rope
            and rope,
            "a rotation other than RoPE's (its apply_rotary_pos_emb)": uses_rope and layout is None,
            "a bias in some projections only (not all four or none)": 0 < len(biased) < 4
            and biased,
            "bidirectional attention (is_causal=False)": not (
                getattr(module, "is_causal", True) and getattr(config, "is_causal", True)
            ),
        }
        found = [
            f"{feature}: {has!r}"
            for feature, has in refused.items()
            if has not in (None, False, [])
        ]
        if found:
            raise ValueError(f"cannot convert {name}, which has {'; '.join(found)}")
        scaling = float(getattr(module, "scaling", head_dim**-0.5))
        weight = module.q_proj.weight
        ours = cls(
            d_model,
            heads,
            dropout=float(getattr(config, "attention_dropout", 0.0)),
            bias=bool(biased),
            backend=backend,
            num_kv_heads=config.num_key_value_heads,
            rope_base=float(rope["rope_theta"]) if uses_rope else None,
            rope_scaling=rope_scaling if uses_rope else None,
            scale=None if math.isclose(scaling, head_dim**-0.5, rel_tol=1e-9) else scaling,
            window=getattr(module, "sliding_window", getattr(config, "sliding_window", None)),
            qk_norm=qk_norm,
            softcap=None if softcap is None else float(softcap),
            sink=sink,
            head_dim=None if head_dim * heads == d_model else head_dim,
            rope_dim=rope_dim if uses_rope and rope_dim < head_dim else None,
            gate=gate,
            device=weight.device,
            dtype=weight.dtype,
        )
        interleaved = layout == "interleaved"
        rows = {  # interleaved RoPE: each head's rows of W_q, W_k in rotate-half order
            "q_proj": _head_rows(heads, head_dim, interleaved),
            "k_proj": _head_rows(config.num_key_value_heads, head_dim, interleaved),
        }
        with torch.no_grad():
            for linear, name in zip((ours.W_q, ours.W_k, ours.W_v, ours.W_o), _PROJECTIONS):
                theirs, order = getattr(module, name), rows.get(name, slice(None))
                for kind in ("weight", "bias"):
                    param = getattr(theirs, kind)
                    if param is not None and gate and name == "q_proj":  # per head: query, gate
                        param, gated = param.unflatten(0, (heads, 2, head_dim)).unbind(1)
                        getattr(ours.W_g, kind).copy_(gated.flatten(0, 1))
                        param = param.flatten(0, 1)  # (heads * head_dim, ...)
                    if param is not None:
                        getattr(linear, kind).copy_(param[order])
            if qk_norm:  # one head's coordinates, in the order of W_q's rows
                (offset,) = offsets
                coordinates = _head_rows(1, head_dim, interleaved)
                for norm, theirs in ((ours.q_norm, module.q_norm), (ours.k_norm, module.k_norm)):
                    norm.weight.copy_(theirs.weight[coordinates] + offset)  # Gemma's 1 + w
                    norm.eps = _norm_eps(theirs)
            if sink:
                ours.sink.copy_(sinks)
        return ours.train(module.training)


def _is_bert_attention(module: object) -> bool:
    """Whether ``module`` has a ``BertAttention``'s parts: ``self.query``,
    ``self.key``, ``self.value`` and ``output.dense``, all ``nn.Linear``."""
    inner, output = getattr(module, "self", None), getattr(module, "output", None)
    parts = [getattr(inner, n, None) for n in ("query", "key", "value")]
    parts.append(getattr(output, "dense", None))
    return isinstance(module, nn.Module) and all(isinstance(p, nn.Linear) for p in parts)


def _rope_scaling(rope: dict) -> tuple[dict | None, bool]:
    """The ``rope_scaling`` of transformers' ``rope_parameters`` (``None`` for the
    default RoPE), and whether it is reproduced: ``"dynamic"`` is not (its speeds
    change with the length of each call and with what the model saw before), nor
    a type or a field that :func:`~attention_lib.rope_frequencies` does not know."""
    kind = rope.get("rope_type", "default")
    if kind not in ROPE_SCALING_FIELDS or kind == "dynamic":
        return None, False
    required, optional = ROPE_SCALING_FIELDS[kind]
    given = {
        k: v for k, v in rope.items() if v is not None and k not in ("rope_type", "rope_theta")
    }
    known = set(given) <= {*required, *optional, "partial_rotary_factor"}
    given.pop("partial_rotary_factor", None)  # checked by the caller
    scaling = None if kind == "default" else {"rope_type": kind, **given}
    return scaling, known and set(required) <= set(given)


def _norm_eps(norm: nn.Module) -> float:
    """The epsilon of a transformers RMSNorm (``variance_epsilon`` or ``eps``)."""
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def rms_norm_offset(norm: nn.Module | None, dim: int) -> float | None:
    """How a transformers norm over ``dim`` computes, if it is an RMSNorm: ``0.0``
    for ``x / rms(x) * w`` (Llama's, Qwen3's), ``1.0`` for Gemma's ``x / rms(x) *
    (1 + w)``, ``None`` for anything else (a LayerNorm, a norm over all heads at
    once, ...). Probed on inputs with a non-zero mean, with the norm's own
    weight and epsilon. The QK-norm test of ``from_hf_llama`` (chapter 15)
    and the norm test of :func:`~attention_lib.hf_models.from_hf`.
    """
    weight = getattr(norm, "weight", None)
    if not isinstance(norm, nn.Module) or weight is None or tuple(weight.shape) != (dim,):
        return None
    x = torch.randn(2, 3, dim, generator=torch.Generator().manual_seed(0)) + 0.5
    x = x.to(weight.dtype)
    with torch.no_grad():
        try:
            out = norm(x)
        except (TypeError, ValueError, RuntimeError):
            return None
        for offset in (0.0, 1.0):
            expected = nn.functional.rms_norm(x, (dim,), weight + offset, _norm_eps(norm))
            if out.shape == x.shape and torch.allclose(out, expected, rtol=0, atol=1e-5):
                return offset
    return None


def _rope_layout(module: nn.Module, head_dim: int, rope_dim: int | None = None) -> str | None:
    """The RoPE layout of the rotation a transformers layer applies:
    ``"rotate-half"`` (🤗 transformers' Llama), ``"interleaved"`` (Cohere, Helium), or ``None``
    if it is neither or cannot be found.

    A layer rotates with the ``apply_rotary_pos_emb`` of its modeling file,
    which takes ``cos`` and ``sin`` from its model's rotary embedding, each
    angle once per pair of the layout (``cat``) or repeated (Cohere's
    ``repeat_interleave``). The probe feeds the function both and compares
    with :func:`~attention_lib.apply_rope`'s two layouts, on the first
    ``rope_dim`` coordinates of each head (partial RoPE; all by default).
    """
    rope_dim = head_dim if rope_dim is None else rope_dim
    forward = inspect.unwrap(type(module).forward)
    rotate = getattr(forward, "__globals__", {}).get("apply_rotary_pos_emb")
    names = getattr(getattr(forward, "__code__", None), "co_names", ())
    if rotate is None or "apply_rotary_pos_emb" not in names or rope_dim % 2 or rope_dim < 2:
        return None
    x = torch.randn(1, 1, 4, head_dim, generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([3, 50, 700, 9000])
    angles = positions[:, None] * rope_frequencies(rope_dim)[0]  # (4, rope_dim / 2), float64
    # cos/sin once per pair of the layout (cat), repeated (Cohere), or half-width (gpt-oss)
    for angle in (torch.cat([angles, angles], -1), angles.repeat_interleave(2, -1), angles):
        try:
            turned, _ = rotate(x, x, angle.cos().float()[None], angle.sin().float()[None])
        except (TypeError, ValueError, RuntimeError):  # not this width, or not Llama's arguments
            continue
        for layout in ("rotate-half", "interleaved")[: 1 + (rope_dim == head_dim)]:
            turned_part = apply_rope(  # the rest keeps its coordinates (partial RoPE)
                x[..., :rope_dim], positions, interleaved=layout == "interleaved"
            )
            expected = torch.cat([turned_part, x[..., rope_dim:]], dim=-1)
            if torch.allclose(turned, expected, rtol=0, atol=1e-5):
                return layout
    return None


def _head_rows(heads: int, head_dim: int, interleaved: bool) -> torch.Tensor | slice:
    """The rows of a ``(heads * head_dim, d_model)`` projection in the order of
    this package's rotate-half RoPE: for an interleaved layer, each head's
    coordinates are permuted by the inverse of :func:`rope_permutation`, which
    keeps every query-key dot product."""
    if not interleaved:
        return slice(None)
    order = torch.argsort(rope_permutation(head_dim))  # (head_dim,)
    return (torch.arange(heads)[:, None] * head_dim + order).flatten()  # (heads * head_dim,)
