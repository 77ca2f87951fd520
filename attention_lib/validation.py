"""Input validation shared by every public attention function.

Each check raises ``TypeError`` or ``ValueError`` with a message that names the
argument, what was expected and what was given, so that bad input never reaches
an opaque matmul error (or, worse, a silent wrong answer).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
from collections.abc import Iterator

import torch
from torch import Tensor

# Set while an outer module of this package runs its submodules on inputs it has
# already checked (see trusted_inputs).
_TRUSTED: contextvars.ContextVar[bool] = contextvars.ContextVar("_TRUSTED", default=False)


@contextlib.contextmanager
def trusted_inputs() -> Iterator[None]:
    """Validate once: inside this block the package's modules skip their checks.

    A public door (e.g. ``Encoder.forward``) checks its arguments, then calls its
    submodules *as modules* inside this block, so that their forward hooks still
    run but their arguments are not checked a second time (a ``mask`` passed
    down is then already a bool keep-mask). Only the package's modules read the
    flag; its functions (e.g. ``scaled_dot_product_attention``) always check.
    A hook that calls one of the package's modules runs inside the block too.
    """
    token = _TRUSTED.set(True)
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def inputs_trusted() -> bool:
    """Whether an outer module has already checked the arguments (see :func:`trusted_inputs`)."""
    return _TRUSTED.get()


def _describe(t: Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


def check_tensor(name: str, t: object, *, min_dim: int = 2) -> Tensor:
    """Check that ``t`` is a floating tensor with at least ``min_dim`` dims."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor (float16, bfloat16, float32 or "
            f"float64), got dtype {t.dtype}"
        )
    if t.dim() < min_dim:
        raise ValueError(
            f"{name} must have at least {min_dim} dims (..., L, d), got {_describe(t)}"
        )
    return t


def check_qkv(query: Tensor, key: Tensor, value: Tensor) -> tuple[int, ...]:
    """Validate query ``(..., Lq, d_k)``, key ``(..., Lk, d_k)``, value ``(..., Lk, d_v)``.

    Checks type, dtype, device, the shared ``d_k``, the shared ``Lk`` and that
    the leading (batch/head) dimensions broadcast. Returns the broadcast leading
    dims ``...``.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_tensor(name, t)
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(
            "query, key and value must share one dtype, got "
            f"{query.dtype}, {key.dtype} and {value.dtype}"
        )
    if not (query.device == key.device == value.device):
        raise ValueError(
            "query, key and value must be on the same device, got "
            f"{query.device}, {key.device} and {value.device}"
        )
    if query.shape[-1] == 0:
        raise ValueError(
            f"query and key must have d_k >= 1 features (last dim), got query {tuple(query.shape)}"
        )
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            "query and key must have the same last dim d_k: expected key (..., Lk, "
            f"{query.shape[-1]}) to match query {tuple(query.shape)}, got key "
            f"{tuple(key.shape)}"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            "key and value must have the same length Lk (dim -2): got key "
            f"{tuple(key.shape)} and value {tuple(value.shape)}"
        )
    try:
        return tuple(torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2]))
    except RuntimeError:
        raise ValueError(
            "the leading (batch/head) dims of query, key and value must broadcast, "
            f"got query {tuple(query.shape)}, key {tuple(key.shape)}, value "
            f"{tuple(value.shape)}"
        ) from None


def check_attention_args(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    dropout_p: float,
    scale: float | None,
    is_causal: bool,
) -> tuple[int, ...]:
    """The checks every attention function starts with: :func:`check_qkv`, then
    ``dropout_p``, ``scale`` and ``is_causal``. Returns the broadcast leading
    dims ``...`` of query, key and value."""
    batch_shape = check_qkv(query, key, value)
    check_dropout_p(dropout_p)
    check_scale(scale)
    check_bool("is_causal", is_causal)
    return batch_shape


def check_integer_tensor(name: str, t: object, *, what: str = "") -> Tensor:
    """``t`` must be a tensor of an integer dtype (not bool); ``what`` is appended
    to the noun in the message, e.g. ``" of ids"``."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor{what}, got {type(t).__name__}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor{what}, got dtype {t.dtype}")
    return t


def check_int(name: str, value: object, *, minimum: int) -> int:
    """``value`` must be an integer (a Python or NumPy int, not a bool)
    ``>= minimum``; returns it as a Python int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_real(
    name: str,
    value: object,
    *,
    above: float | None = None,
    at_least: float | None = None,
    below: float | None = None,
    at_most: float | None = None,
) -> float:
    """``value`` must be a finite real number (a Python or NumPy int or float, not a
    bool) within the given bounds; returns it as a Python float.

    A non-number raises ``TypeError``; a number out of range (or NaN/inf) raises
    ``ValueError``. The message names the accepted range, e.g. "a finite float
    > 0" or "a float in [0, 1)" (an int is a float here, as in type hints).
    """
    bounds = [
        (op, bound)
        for op, bound in ((">", above), (">=", at_least), ("<", below), ("<=", at_most))
        if bound is not None
    ]
    if len(bounds) == 2:  # an interval, e.g. "a float in [0, 1)"
        (low_op, low), (high_op, high) = bounds
        left, right = "(" if low_op == ">" else "[", ")" if high_op == "<" else "]"
        expected = f"a float in {left}{low:g}, {high:g}{right}"
    else:  # e.g. "a finite float > 0"
        expected = " ".join(["a finite float", *(f"{op} {bound:g}" for op, bound in bounds)])
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")
    x = float(value)
    if not (
        math.isfinite(x)
        and (above is None or x > above)
        and (at_least is None or x >= at_least)
        and (below is None or x < below)
        and (at_most is None or x <= at_most)
    ):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return x


def check_dropout_p(dropout_p: object, *, name: str = "dropout_p") -> float:
    """``dropout_p`` must be a real number in [0, 1); returns it as a float."""
    return check_real(name, dropout_p, at_least=0, below=1)


def check_scale(scale: object) -> float | None:
    """``scale`` must be ``None`` or a finite real number > 0 (a Python or NumPy
    float or int, not a bool); returns it as a float."""
    return None if scale is None else check_real("scale", scale, above=0)


def check_mask(
    mask: object,
    target_shape: tuple[int, ...] | torch.Size,
    *,
    device: torch.device | None = None,
    name: str = "mask",
) -> Tensor:
    """Check a keep-mask: bool, or integer/float holding only 0 and 1.

    It must broadcast to ``target_shape`` (the ``(..., Lq, Lk)`` shape of the
    attention scores) without enlarging it, and live on ``device``.
    """
    target_shape = tuple(target_shape)
    if not isinstance(mask, Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor (bool keep-mask) or None, got {type(mask).__name__}"
        )
    if mask.is_complex():
        raise TypeError(
            f"{name} must be a bool keep-mask or a 0/1 integer/float mask, got dtype {mask.dtype}"
        )
    if mask.requires_grad:
        raise ValueError(
            f"{name} requires grad, but a 0/1 keep-mask only selects keys and never gets "
            f"a gradient; pass {name}.detach() (for a learnable additive bias, add it to "
            "the scores yourself)"
        )
    if device is not None and mask.device != device:
        raise ValueError(
            f"{name} must be on the same device as query/key/value ({device}), "
            f"got {name} on {mask.device}"
        )
    try:
        broadcast = torch.broadcast_shapes(mask.shape, target_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != target_shape:
        raise ValueError(
            f"{name} of shape {tuple(mask.shape)} does not broadcast to the attention "
            f"scores shape (..., Lq, Lk) = {target_shape}"
        )
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(
            f"{name} is a keep-mask: expected bool (True = may attend) or 0/1 values "
            f"(0 = masked), got dtype {mask.dtype} with values other than 0 and 1. "
            "Note that F.scaled_dot_product_attention reads a float mask as an additive "
            "bias (0 = keep, -inf = block); convert such a bias with `bias == 0`."
        )
    return mask


def check_bool(name: str, value: object) -> bool:
    """``value`` must be a Python bool (e.g. ``is_causal``, ``need_weights``)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value
