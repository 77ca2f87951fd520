"""Masks as programs: the book's masks as FlexAttention ``mask_mod``/``score_mod`` functions.

PyTorch's FlexAttention (``torch.nn.attention.flex_attention``) describes a mask
by a function of four indices, ``mask_mod(b, h, q_idx, kv_idx) -> bool``, and a
change of the scores by ``score_mod(score, b, h, q_idx, kv_idx) -> score``. The
indices are 0-d integer tensors (FlexAttention ``vmap``\\ s the function over
every batch, head, query and key). A ``mask_mod`` returns ``True`` where query
``q_idx`` *may* attend to key ``kv_idx``: the library's keep-mask convention
(chapter 5). The builders below return the mask of each chapter as such a
function; :func:`dense_mask` turns one back into the library's keep-mask, and
:func:`tile_kinds` reads which tiles a ``BlockMask`` computes, masks or skips.

Every builder validates its arguments; the functions it returns check nothing
(FlexAttention calls them once per score, or traces them).

Explained in chapter 20, *Masks as programs*.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_mask

from .validation import check_instance, check_int, check_integer_tensor, check_real

#: ``mask_mod(b, h, q_idx, kv_idx) -> bool tensor`` (``True`` = may attend).
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
#: ``score_mod(score, b, h, q_idx, kv_idx) -> score``.
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def causal(offset: int = 0) -> MaskMod:
    """Causal ``mask_mod``: query ``i`` may attend to keys ``j <= i + offset``.

    ``offset = Lk - Lq`` puts the queries after ``Lk - Lq`` cached keys (the
    bottom-right alignment of a KV cache): :func:`~attention_lib.causal_mask`
    with the same ``offset`` (the causal mask and its offset: chapter 5).
    Explained in chapter 20, *Masks as programs*.

    Raises:
        TypeError: if ``offset`` is not an int.
    """
    offset = check_int("offset", offset, minimum=-(2**62))

    def causal_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return kv_idx <= q_idx + offset

    return causal_mod


def sliding_window(window: int, offset: int = 0) -> MaskMod:
    """Sliding-window ``mask_mod``: ``i + offset - window < j <= i + offset``.

    Equals :func:`~attention_lib.causal_mask` with ``window`` (and 🤗
    transformers' ``sliding_window_causal_mask_function``; sliding windows:
    chapter 10). Explained in chapter 20, *Masks as programs*.

    Raises:
        TypeError: if ``window`` or ``offset`` is not an int.
        ValueError: if ``window < 1``.
    """
    window = check_int("window", window, minimum=1)
    before = causal(offset)  # j <= i + offset

    def sliding_window_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return before(b, h, q_idx, kv_idx) & (kv_idx > q_idx + offset - window)

    return sliding_window_mod


def chunked(chunk_size: int, offset: int = 0) -> MaskMod:
    """Chunked ``mask_mod`` (Llama 4's local layers): causal, and key ``j`` in the
    chunk of query ``i``, ``j // chunk_size == (i + offset) // chunk_size``.

    Equals :func:`~attention_lib.causal_mask` with ``chunk`` (and 🤗
    transformers' ``chunked_causal_mask_function``; chunked layers: chapter
    16). Explained in chapter 20, *Masks as programs*.

    Raises:
        TypeError: if ``chunk_size`` or ``offset`` is not an int.
        ValueError: if ``chunk_size < 1``.
    """
    size = check_int("chunk_size", chunk_size, minimum=1)
    before = causal(offset)  # j <= i + offset

    def chunked_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        same_chunk = kv_idx // size == (q_idx + offset) // size
        return before(b, h, q_idx, kv_idx) & same_chunk

    return chunked_mod


def _integers(name: str, values: Tensor | Sequence[int], dims: tuple[int, ...], low: int) -> Tensor:
    """``values`` (a tensor or a sequence of ints) as a long tensor of ``dims``
    dimensions and entries ``>= low``; a clear error otherwise."""
    if isinstance(values, Sequence) and all(type(n) is int for n in values):
        values = torch.tensor(list(values), dtype=torch.long)
    check_integer_tensor(name, values, what=f" with {' or '.join(map(str, dims))} dims")
    if values.dim() not in dims or (values.numel() and int(values.min()) < low):
        raise ValueError(f"{name} must have {dims} dims and entries >= {low}, got {values}")
    return values.long()


def padding(lengths: Tensor | Sequence[int]) -> MaskMod:
    """Padding ``mask_mod``: key ``j`` of sequence ``b`` is kept iff ``j < lengths[b]``.

    The ``mask_mod`` of :func:`~attention_lib.padding_mask`; combine it with
    :func:`causal` by ``torch.nn.attention.flex_attention.and_masks``. Explained
    in chapter 20, *Masks as programs* (padding: chapter 5).

    Args:
        lengths: ``(B,)`` integer tensor or sequence of ints ``>= 0``.

    Raises:
        TypeError: if ``lengths`` is not integer.
        ValueError: if ``lengths`` is not 1-D or has a negative length.
    """
    lengths = _integers("lengths", lengths, (1,), 0)

    def padding_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return kv_idx < lengths[b]

    return padding_mod


def document_ids(lengths: Tensor | Sequence[int], total: int | None = None) -> Tensor:
    """The document of every token of a packed row: documents of ``lengths``
    one after the other, ``[0] * lengths[0] + [1] * lengths[1] + ...``.

    With ``total`` larger than ``sum(lengths)``, the rest of the row is padding,
    marked ``-1`` (a document of its own for :func:`~attention_lib.flex.document`). Explained in
    chapter 20, *Masks as programs*.

    Returns:
        Long tensor ``(total,)``.

    Raises:
        TypeError: if ``lengths`` is not integer or ``total`` not an int.
        ValueError: if a length is negative or ``total < sum(lengths)``.
    """
    lengths = _integers("lengths", lengths, (1,), 0)
    used = int(lengths.sum())
    total = used if total is None else check_int("total", total, minimum=used)
    ids = torch.repeat_interleave(torch.arange(len(lengths)), lengths)  # (sum,)
    return torch.cat([ids, ids.new_full((total - used,), -1)])  # (total,)


def document_positions(doc_ids: Tensor) -> Tensor:
    """Positions that restart at 0 at every new document of a packed row
    (``doc_ids[..., t] != doc_ids[..., t - 1]``): the RoPE positions of each
    document as if it were alone. Explained in chapter 20, *Masks as programs*.

    Args:
        doc_ids: ``(L,)`` or ``(B, L)`` integer document ids (:func:`~attention_lib.document_ids`).

    Returns:
        Long tensor of the shape of ``doc_ids``.

    Raises:
        TypeError: if ``doc_ids`` is not an integer tensor.
        ValueError: if ``doc_ids`` is not 1-D or 2-D.
    """
    doc_ids = _integers("doc_ids", doc_ids, (1, 2), -1)
    index = torch.arange(doc_ids.shape[-1], device=doc_ids.device).expand_as(doc_ids)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[..., 1:] = doc_ids[..., 1:] != doc_ids[..., :-1]  # a document begins here
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(-1).values
    return index - first  # (..., L): distance to the start of the document


def document(doc_ids: Tensor) -> MaskMod:
    """Intra-document causal ``mask_mod`` for packed rows: causal, and query and
    key in the same document, ``doc_ids[b, i] == doc_ids[b, j]``.

    Several documents packed in one row then attend as if each were alone
    (Llama 3's pre-training; 🤗 transformers builds the same mask when the
    ``position_ids`` restart). Explained in chapter 20, *Masks as programs*.

    Args:
        doc_ids: ``(L,)`` (one layout for every row) or ``(B, L)`` integer
            document ids (:func:`~attention_lib.document_ids`); ``Lq = Lk = L``.

    Raises:
        TypeError: if ``doc_ids`` is not an integer tensor.
        ValueError: if ``doc_ids`` is not 1-D or 2-D.
    """
    doc_ids = _integers("doc_ids", doc_ids, (1, 2), -1)
    ids = doc_ids if doc_ids.dim() == 2 else doc_ids[None]  # (B or 1, L)
    one_layout = ids.shape[0] == 1

    def document_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        row = ids[0] if one_layout else ids[b]
        return (kv_idx <= q_idx) & (row[q_idx] == row[kv_idx])

    return document_mod


def prefix_lm(prefix_len: int) -> MaskMod:
    """Prefix-LM ``mask_mod``: the first ``prefix_len`` tokens see each other in
    both directions, the rest is causal: ``j <= i or j < prefix_len``.

    T5's prefix LM and PaliGemma's image-and-prompt prefix; 🤗 transformers
    builds it with ``block_sequence_ids``. Explained in chapter 20, *Masks as
    programs*.

    Raises:
        TypeError: if ``prefix_len`` is not an int.
        ValueError: if ``prefix_len < 0``.
    """
    prefix = check_int("prefix_len", prefix_len, minimum=0)

    def prefix_lm_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (kv_idx <= q_idx) | (kv_idx < prefix)

    return prefix_lm_mod


def tree(parents: Tensor | Sequence[int]) -> MaskMod:
    """Tree ``mask_mod`` (speculative decoding's token trees): token ``i`` sees
    token ``j`` iff ``j`` is ``i`` or one of its ancestors.

    ``parents[i]`` is the index of token ``i``'s parent, ``-1`` for a root;
    parents come before their children (``parents[i] < i``). The ancestors are
    computed once, here, as an ``(N, N)`` table that the ``mask_mod`` reads.
    Token trees are chapter 13's. Explained in chapter 20, *Masks as programs*.

    Raises:
        TypeError: if ``parents`` is not integer.
        ValueError: if ``parents`` is not 1-D or a parent is not in ``[-1, i)``.
    """
    parents = _integers("parents", parents, (1,), -1)
    n = parents.shape[0]
    if not bool((parents < torch.arange(n)).all()):
        raise ValueError(f"parents must come before their children, parents[i] < i: {parents}")
    sees = torch.eye(n, dtype=torch.bool)  # (N, N): i sees itself ...
    for i, parent in enumerate(parents.tolist()):
        if parent >= 0:  # ... and what its parent sees
            sees[i] |= sees[parent]

    def tree_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return sees[q_idx, kv_idx]

    return tree_mod


def from_keep(keep: Tensor) -> MaskMod:
    """The ``mask_mod`` that reads a dense keep-mask: ``keep[b, h, i, j]``.

    For masks that depend on data, not on positions, such as the top-k keys
    of DeepSeek's sparse attention (:func:`~attention_lib.dsa.top_k_mask`,
    chapter 17). Explained in chapter 20, *Masks as programs*.

    Args:
        keep: bool keep-mask ``(Lq, Lk)``, ``(B or 1, H or 1, Lq, Lk)``.

    Raises:
        TypeError: if ``keep`` is not a bool tensor of 2 or 4 dims.
    """
    if not isinstance(keep, Tensor) or keep.dtype != torch.bool or keep.dim() not in (2, 4):
        raise TypeError(f"keep must be a bool tensor (Lq, Lk) or (B, H, Lq, Lk), got {keep!r}")
    table = keep[None, None] if keep.dim() == 2 else keep  # (B or 1, H or 1, Lq, Lk)
    one_b, one_h = table.shape[0] == 1, table.shape[1] == 1

    def from_keep_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return table[0 if one_b else b, 0 if one_h else h, q_idx, kv_idx]

    return from_keep_mod


def softcap(cap: float) -> ScoreMod:
    """Soft-capping ``score_mod`` (Gemma 2): ``cap * tanh(score / cap)``.

    The ``softcap`` of :func:`~attention_lib.scaled_dot_product_attention`
    (chapter 15). Explained in chapter 20, *Masks as programs*.

    Raises:
        TypeError: if ``cap`` is not a real number.
        ValueError: if ``cap`` is not finite and > 0.
    """
    cap = check_real("cap", cap, above=0)

    def softcap_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return cap * torch.tanh(score / cap)

    return softcap_mod


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi's head slopes: ``2^(-8/n), 2^(-16/n), ...`` for ``n`` heads a power of
    two; otherwise those of the nearest power of two below, then every other
    slope of twice that (the paper's rule, 🤗 transformers' BLOOM).
    Explained in chapter 20, *Masks as programs*.

    Returns:
        Float32 tensor ``(num_heads,)``.

    Raises:
        TypeError: if ``num_heads`` is not an int.
        ValueError: if ``num_heads < 1``.
    """
    n = check_int("num_heads", num_heads, minimum=1)
    power = 2 ** math.floor(math.log2(n))
    slopes = 2.0 ** (-8.0 * torch.arange(1, power + 1, dtype=torch.float64) / power)
    odd = 2 * torch.arange(n - power, dtype=torch.float64) + 1  # 1, 3, 5, ...
    extra = 2.0 ** (-4.0 * odd / power)  # every other slope of 2 * power heads
    return torch.cat([slopes, extra]).float()  # (n,)


def alibi(slopes: Tensor) -> ScoreMod:
    """ALiBi ``score_mod``: ``score + slopes[h] * (j - i)``, a penalty that grows
    linearly with the distance to the key (no positional embedding at all).

    Explained in chapter 20, *Masks as programs*.

    Args:
        slopes: ``(H,)`` floating tensor, e.g. :func:`~attention_lib.alibi_slopes`.

    Raises:
        TypeError: if ``slopes`` is not a 1-D floating tensor.
    """
    if not (isinstance(slopes, Tensor) and slopes.is_floating_point() and slopes.dim() == 1):
        raise TypeError(f"slopes must be a floating tensor (H,), got {slopes!r}")

    def alibi_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + slopes[h] * (kv_idx - q_idx)

    return alibi_mod


def with_sink(output: Tensor, lse: Tensor, sink: Tensor) -> Tensor:
    """Attention with sink logits (gpt-oss) from attention without them.

    A sink is one more key with logit ``sink[h]`` and a zero value: it adds
    ``exp(sink)`` to each row's softmax denominator. Given the row's
    log-sum-exp ``lse`` (``flex_attention(..., return_aux=AuxRequest(lse=True))``),
    the output shrinks by ``exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse - sink)``:
    the ``sink`` of :func:`~attention_lib.scaled_dot_product_attention`
    (chapter 15). Explained in chapter 20, *Masks as programs*.

    Args:
        output: ``(B, H, Lq, d_v)`` attention output without the sink.
        lse: ``(B, H, Lq)`` log-sum-exp of each row's scores.
        sink: ``(H,)`` sink logits.

    Returns:
        ``(B, H, Lq, d_v)``, in the dtype of ``output``.

    Raises:
        ValueError: if the arguments are not tensors of these shapes.
    """
    shapes = [tuple(getattr(t, "shape", ())) for t in (output, lse, sink)]  # 3 shapes
    if len(shapes[0]) != 4 or shapes[1:] != [shapes[0][:-1], shapes[0][1:2]]:
        raise ValueError(f"need output (B, H, Lq, d_v), lse (B, H, Lq), sink (H,), got {shapes}")
    wide = torch.promote_types(output.dtype, torch.float32)  # low precision: in float32
    kept = torch.sigmoid(lse.to(wide) - sink.to(wide)[:, None])  # (B, H, Lq)
    return (output.to(wide) * kept[..., None]).to(output.dtype)


def _arguments(function: object) -> int:
    """How many arguments ``function`` takes (``-1`` if it is not a function)."""
    try:
        return len(inspect.signature(function).parameters) if callable(function) else -1
    except (TypeError, ValueError):  # a builtin without a signature
        return -1


def dense_mask(
    mask_mod: MaskMod,
    q_len: int,
    k_len: int | None = None,
    *,
    batch: int | None = None,
    heads: int | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """The library's keep-mask of a ``mask_mod``: ``True`` where it keeps.

    FlexAttention's own ``create_mask`` evaluates ``mask_mod`` at every
    ``(b, h, i, j)``; the result broadcasts against scores ``(B, H, Lq, Lk)``
    like :func:`~attention_lib.causal_mask` and
    :func:`~attention_lib.padding_mask`. Explained in chapter 20, *Masks as
    programs*.

    Args:
        mask_mod: ``mask_mod(b, h, q_idx, kv_idx) -> bool tensor``.
        q_len: number of queries ``Lq``.
        k_len: number of keys ``Lk``; defaults to ``q_len``.
        batch: ``B`` if the mask depends on the batch row, else ``None`` (1).
        heads: ``H`` if the mask depends on the head, else ``None`` (1).
        device: where to evaluate it.

    Returns:
        Bool keep-mask ``(B or 1, H or 1, Lq, Lk)``.

    Raises:
        TypeError: if ``mask_mod`` is not a function of 4 arguments (a
            ``score_mod`` takes 5) or a length is not an int.
        ValueError: if a length is negative.
    """
    if _arguments(mask_mod) != 4:  # a score_mod takes 5
        raise TypeError(f"mask_mod must be a function (b, h, q_idx, kv_idx), got {mask_mod!r}")
    k_len = q_len if k_len is None else k_len
    check_int("q_len", q_len, minimum=0), check_int("k_len", k_len, minimum=0)
    keep = create_mask(mask_mod, batch, heads, q_len, k_len, device=device or "cpu")
    return keep  # (B or 1, H or 1, Lq, Lk)


def tile_kinds(block_mask: BlockMask) -> Tensor:
    """Which tiles of a ``BlockMask`` are computed, computed and masked, or skipped.

    ``create_block_mask`` evaluates the ``mask_mod`` once and sorts the
    ``(BLOCK_SIZE x BLOCK_SIZE)`` tiles of the score matrix: tiles where it keeps
    every pair (``full_kv_indices``), tiles where it keeps some
    (``kv_indices``, the mask is applied inside) and tiles it keeps nothing of,
    which a compiled kernel never visits. The codes are chapter 11's.
    Explained in chapter 20, *Masks as programs*.

    Args:
        block_mask: a ``torch.nn.attention.flex_attention.BlockMask``.

    Returns:
        Long tensor ``(B, H, Lq / BLOCK, Lk / BLOCK)`` (rounded up): ``0`` =
        skipped, ``1`` = computed (every pair kept), ``2`` = computed and masked.

    Raises:
        TypeError: if ``block_mask`` is not a ``BlockMask``.
    """
    check_instance("block_mask", block_mask, BlockMask, "a flex_attention BlockMask")

    def tiles(num: Tensor | None, indices: Tensor | None) -> Tensor:
        shape = block_mask.kv_indices.shape  # (B, H, n_q, n_k)
        if num is None or indices is None:
            return torch.zeros(shape, dtype=torch.long)
        listed = torch.arange(shape[-1]) < num[..., None].cpu()  # (B, H, n_q, n_k)
        dense = torch.zeros(shape, dtype=torch.long)
        return dense.scatter_add(-1, indices.long().cpu(), listed.long()).clamp(max=1)

    partial = tiles(block_mask.kv_num_blocks, block_mask.kv_indices)
    full = tiles(block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
    q_tiles = -(-block_mask.seq_lengths[0] // block_mask.BLOCK_SIZE[0])
    k_tiles = -(-block_mask.seq_lengths[1] // block_mask.BLOCK_SIZE[1])
    return (full + 2 * partial)[..., :q_tiles, :k_tiles]  # (B, H, n_q, n_k)
