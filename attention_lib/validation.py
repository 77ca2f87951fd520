"""Input validation shared by the public entry points of the package.

The rule of the package: **public entry points validate, inner building blocks
trust their inputs.** A public function or ``forward`` checks its arguments with
the helpers below, turns them into what the computation needs (e.g. one bool
keep-mask) and passes that down explicitly; the cores it calls check nothing.

Each check raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right
kind, wrong value) with a message that names the argument, what was expected
and what was given, so that bad input never reaches an opaque matmul error (or,
worse, a silent wrong answer).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

_OPS = {">": float.__gt__, ">=": float.__ge__, "<": float.__lt__, "<=": float.__le__}


def _got(value: object) -> str:
    return f"{type(value).__name__} {value!r}"


def check_instance(name: str, value: object, kind: type | tuple[type, ...], what: str) -> None:
    """``value`` must be an instance of ``kind`` (``what`` names it in the message)."""
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")


def check_tensor(name: str, t: object, *, min_dim: int = 2) -> Tensor:
    """``t`` must be a floating tensor with at least ``min_dim`` dims."""
    check_instance(name, t, Tensor, "a torch.Tensor")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if t.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dims, got shape {tuple(t.shape)}")
    return t


def check_same(what: str, **values: object) -> None:
    """Every value must be equal (a ``TypeError`` for dtypes, else a ``ValueError``)."""
    if len(set(values.values())) > 1:
        names, given = " and ".join(values), ", ".join(f"{n} {v}" for n, v in values.items())
        kind = TypeError if what == "dtype" else ValueError
        raise kind(f"{names} must have the same {what}, got {given}")


def check_hidden(width: int, like: Tensor, **tensors: object) -> None:
    """Each tensor must be a floating ``(B, L, width)`` tensor of ``like``'s dtype and
    device (``like``: the module's weight), e.g. a layer's ``query``, ``key``, ``value``."""
    for name, t in tensors.items():
        if check_tensor(name, t, min_dim=3).dim() != 3 or t.shape[-1] != width:
            raise ValueError(f"{name} must be (B, L, {width}), got {tuple(t.shape)}")
    check_same("dtype", **{name: t.dtype for name, t in tensors.items()}, module=like.dtype)
    check_same("device", **{name: t.device for name, t in tensors.items()}, module=like.device)


def check_broadcast(name: str, *shapes: Sequence[int], target: Sequence[int] | None = None):
    """The shapes must broadcast together (to ``target`` exactly, if given); returns the result.
    (Plain Python: ``torch.broadcast_shapes`` costs tens of microseconds per call.)"""
    shapes_all = list(map(tuple, shapes)) + ([] if target is None else [tuple(target)])
    ndim = max(map(len, shapes_all))
    padded, result = [], []  # loops, not comprehensions: no inner frame per call
    for shape in shapes_all:
        padded.append((1,) * (ndim - len(shape)) + shape)
    for sizes in zip(*padded):
        kept = set(sizes) - {1}
        result.append(kept.pop() if len(kept) == 1 else (1 if not kept else None))
    result = None if None in result else tuple(result)
    if result is None or (target is not None and result != tuple(target)):
        into = "together" if target is None else f"to {tuple(target)}"
        raise ValueError(f"{name} must broadcast {into}, got {[tuple(s) for s in shapes]}")
    return result


def check_attention_args(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    dropout_p: float,
    scale: float | None,
    is_causal: bool,
) -> tuple[int, ...]:
    """Query ``(..., Lq, d_k)``, key ``(..., Lk, d_k)``, value ``(..., Lk, d_v)`` of one
    dtype and device, ``d_k >= 1``, leading dims that broadcast, then ``dropout_p``,
    ``scale`` and ``is_causal``. Returns the broadcast leading dims ``...``."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_tensor(name, t)
    check_same("dtype", query=query.dtype, key=key.dtype, value=value.dtype)
    check_same("device", query=query.device, key=key.device, value=value.device)
    check_int("d_k (query.shape[-1])", query.shape[-1], minimum=1)
    check_same("d_k (last dim)", query=query.shape[-1], key=key.shape[-1])
    check_same("length Lk (dim -2)", key=key.shape[-2], value=value.shape[-2])
    check_real("dropout_p", dropout_p, at_least=0, below=1)
    check_bool("is_causal", is_causal)
    if scale is not None:
        check_real("scale", scale, above=0)
    shapes = (query.shape[:-2], key.shape[:-2], value.shape[:-2])
    return check_broadcast("the leading dims of query, key and value", *shapes)


def check_integer_tensor(name: str, t: object, *, what: str = "") -> Tensor:
    """``t`` must be a tensor of an integer dtype (not bool); ``what`` is appended
    to the noun in the message, e.g. ``" of ids"``."""
    check_instance(name, t, Tensor, f"a torch.Tensor{what}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor{what}, got dtype {t.dtype}")
    return t


def check_sequences(**tensors: object) -> None:
    """Every tensor must be an integer ``(N, L)`` tensor of token or class ids."""
    for name, t in tensors.items():
        if check_integer_tensor(name, t).dim() != 2:
            raise ValueError(f"{name} must have shape (N, L), got shape {tuple(t.shape)}")


def check_int(name: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    """``value`` must be an int (Python or NumPy, not bool) ``>= minimum`` (and
    ``<= maximum``, if given); returns it."""
    expected = f"an int >= {minimum}" + ("" if maximum is None else f", <= {maximum}")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {expected}, got {_got(value)}")
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return int(value)


def check_real(name: str, value: object, **bounds: float) -> float:
    """``value`` must be a finite real number (Python or NumPy, not bool) within the
    ``bounds`` (``above``, ``at_least``, ``below``, ``at_most``); returns it as a
    float. The message names the range, e.g. "a finite float > 0, < 1"."""
    ops = dict(zip(("above", "at_least", "below", "at_most"), _OPS))
    expected = "a finite float " + ", ".join(f"{ops[k]} {b:g}" for k, b in bounds.items())
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {expected}, got {_got(value)}")
    x = float(value)
    if not (math.isfinite(x) and all(_OPS[ops[k]](x, float(b)) for k, b in bounds.items())):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return x


def check_bool(name: str, value: object) -> bool:
    """``value`` must be a Python bool (e.g. ``is_causal``, ``need_weights``)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {_got(value)}")
    return value


def check_choice(name: str, value: object, choices: Sequence[object]) -> None:
    """``value`` must be one of ``choices``: a ``TypeError`` if it has none of their
    types, else a ``ValueError`` if it is none of them."""
    if not any(value == c and type(value) is type(c) for c in choices):
        kind = ValueError if type(value) in {type(c) for c in choices} else TypeError
        raise kind(f"{name} must be one of {tuple(choices)}, got {_got(value)}")


def check_mask(
    mask: object, target_shape: Sequence[int], *, device: torch.device | None = None
) -> Tensor:
    """Check a keep-mask and return it as bool (``True`` = may attend).

    ``mask`` is bool, or integer/float holding only 0 and 1 (``0`` = masked); it
    must broadcast to ``target_shape`` (the ``(..., Lq, Lk)`` scores) without
    enlarging it, live on ``device`` and not require grad.
    """
    check_instance("mask", mask, Tensor, "a torch.Tensor (bool keep-mask) or None")
    if mask.is_complex():
        raise TypeError(f"mask must be a bool or 0/1 keep-mask, got dtype {mask.dtype}")
    if mask.requires_grad:
        raise ValueError("mask requires grad, but a keep-mask never gets a gradient: detach it")
    check_same("device", mask=mask.device, query=device or mask.device)
    check_broadcast("mask (..., Lq, Lk)", mask.shape, target=target_shape)
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(
            f"mask is a keep-mask: bool or 0/1 values (0 = masked), got dtype {mask.dtype} with "
            "other values (F.scaled_dot_product_attention reads a float mask as an additive "
            "bias; convert such a bias with `bias == 0`)"
        )
    return mask if mask.dtype == torch.bool else mask != 0


def check_token_ids(tokens: object, vocab_size: int, *, name: str = "tokens") -> Tensor:
    """``tokens`` must be an integer ``(B, L)`` tensor of ids in ``[0, vocab_size)``."""
    tokens = check_integer_tensor(name, tokens, what=" of token ids")
    if tokens.dim() != 2:
        raise ValueError(f"{name} must have shape (B, L), got shape {tuple(tokens.shape)}")
    if tokens.numel() and not 0 <= int(tokens.min()) <= int(tokens.max()) < vocab_size:
        raise ValueError(f"{name} must hold ids in [0, vocab_size={vocab_size}), got {tokens}")
    return tokens


def check_prompt(name: str, prompt: object, vocab_size: int) -> Tensor:
    """``prompt`` must be a non-empty 1-D tensor of token ids in ``[0, vocab_size)``."""
    check_instance(name, prompt, Tensor, "a 1-D torch.Tensor of token ids")
    if prompt.dim() != 1 or len(prompt) == 0:
        raise ValueError(f"{name} must be 1-D and not empty, got shape {tuple(prompt.shape)}")
    return check_token_ids(prompt[None], vocab_size, name=f"{name}[None]")[0]


def check_dropout_p(dropout_p: object, *, name: str = "dropout_p") -> float:
    """A dropout probability: a real number in ``[0, 1)``."""
    return check_real(name, dropout_p, at_least=0, below=1)


def check_base(base: object) -> float:
    """A RoPE or sinusoid ``base``: a finite real number ``> 1``."""
    return check_real("base", base, above=1)


def check_generator(generator: object, *, optional: bool = False) -> None:
    """``generator`` must be a ``torch.Generator`` (or ``None`` if ``optional``)."""
    if not (optional and generator is None):
        check_instance("generator", generator, torch.Generator, "a torch.Generator")


def check_positions(positions: object, shape: Sequence[int], device: torch.device) -> Tensor:
    """Integer ``positions`` on ``device`` that broadcast to ``shape`` (e.g. ``(..., L)``)."""
    check_same("device", positions=check_integer_tensor("positions", positions).device, x=device)
    check_broadcast("positions", positions.shape, target=shape)
    return positions
