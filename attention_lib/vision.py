"""Attention beyond text: images as tokens, positions in two and three
dimensions, and the mask of a model that reads images inside text.

* :func:`patchify` cuts images into square patches, one token each;
  :class:`PatchEmbedding` projects them, adds a class token and 2-D positions
  (a learned row and a learned column embedding); :class:`VisionTransformer`
  runs them through the book's :class:`~attention_lib.Encoder` without a mask
  (every patch sees every other) and classifies from the class token (ViT).
* :func:`rope_2d` is axial 2-D RoPE for patches (Qwen2-VL's vision encoder):
  half of the coordinate pairs turn with the patch's row, half with its column.
* :func:`mrope` is multimodal RoPE: each pair turns with one of three position
  ids (time, height, width), chosen by contiguous sections (Qwen2-VL) or
  interleaved (Qwen3-VL); :func:`mrope_positions` gives the three ids of a
  sequence of text and images, as 🤗 transformers' ``get_rope_index``.
* :func:`vision_mask` is the keep-mask of Gemma 3: causal over the sequence,
  and bidirectional inside each image.

Explained in chapter 19, *Attention beyond text*.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .encoder import Encoder
from .masks import causal_mask
from .rope import check_d_head, inverse_frequencies
from .validation import check_base, check_int, check_integer_tensor, check_tensor

#: Token types of :func:`mrope_positions` and :func:`vision_mask`: text and image.
TEXT, IMAGE = 0, 1


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """Cut images into square patches, each flattened into one token.

    Patches are read row by row (left to right, top to bottom), and each
    patch's values are ordered channel, row, column, as
    ``nn.Conv2d(C, d, patch_size, stride=patch_size)`` reads its input: a
    linear layer on the patches equals that convolution.

    Explained in chapter 19, *Attention beyond text*.

    Args:
        images: ``(B, C, H, W)``, floating.
        patch_size: the side ``p`` of a patch; must divide ``H`` and ``W``.

    Returns:
        ``(B, (H / p) * (W / p), C * p * p)``.

    Raises:
        TypeError: if ``images`` is not a floating tensor or ``patch_size``
            not an int.
        ValueError: if ``images`` is not 4-D or ``patch_size`` does not divide
            its height and width.
    """
    p = check_int("patch_size", patch_size, minimum=1)
    if (
        check_tensor("images", images, min_dim=4).dim() != 4
        or images.shape[-1] % p
        or (images.shape[-2] % p)
    ):
        raise ValueError(
            f"images must be (B, C, H, W) with H, W divisible by patch_size={p}, "
            f"got {tuple(images.shape)}"
        )
    batch, channels, height, width = images.shape
    x = images.reshape(batch, channels, height // p, p, width // p, p)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, H/p, W/p, C, p, p)
    return x.reshape(batch, (height // p) * (width // p), channels * p * p)


def patch_positions(rows: int, cols: int, *, device: torch.device | str | None = None) -> Tensor:
    """The (row, column) of every patch of a ``rows x cols`` grid, in
    :func:`patchify`'s order: ``(rows * cols, 2)`` long.

    Explained in chapter 19, *Attention beyond text*.
    """
    r = torch.arange(check_int("rows", rows, minimum=1), device=device)
    c = torch.arange(check_int("cols", cols, minimum=1), device=device)
    return torch.cartesian_prod(r, c)  # (rows * cols, 2)


class PatchEmbedding(nn.Module):
    """Images to tokens: patches, a linear projection, a class token and 2-D
    positions (ViT, Dosovitskiy et al. 2021).

    Token 0 is a learned class token; token ``1 + r * cols + c`` is the patch
    at row ``r``, column ``c``, to which the learned embeddings of its row and
    of its column are added (the class token gets no position).

    Explained in chapter 19, *Attention beyond text*.

    Args:
        image_size: ``(H, W)`` of the images (or one int for square images).
        patch_size: side of a patch; divides ``H`` and ``W``.
        channels: colour channels ``C``.
        d_model: width of the tokens.

    Shapes:
        - images: ``(B, C, H, W)``
        - output: ``(B, 1 + (H / p) (W / p), d_model)``
    """

    def __init__(
        self,
        image_size: int | tuple[int, int],
        patch_size: int,
        channels: int,
        d_model: int,
        *,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
        self.patch_size = check_int("patch_size", patch_size, minimum=1)
        if check_int("H", height, minimum=1) % patch_size or check_int("W", width, minimum=1) % (
            patch_size
        ):
            raise ValueError(f"image_size {(height, width)} is not divisible by {patch_size}")
        self.grid = (height // patch_size, width // patch_size)
        self.project = nn.Linear(channels * patch_size**2, d_model)
        self.class_token = nn.Parameter(0.02 * torch.randn(d_model))
        self.row = nn.Parameter(0.02 * torch.randn(self.grid[0], d_model))  # (rows, d)
        self.col = nn.Parameter(0.02 * torch.randn(self.grid[1], d_model))  # (cols, d)
        if dtype is not None:
            self.to(dtype)

    def positions(self) -> Tensor:
        """The 2-D position embedding of every patch, ``(N, d_model)``."""
        rows, cols = patch_positions(*self.grid, device=self.row.device).unbind(-1)
        return self.row[rows] + self.col[cols]  # (N, d)

    def forward(self, images: Tensor) -> Tensor:
        patches = patchify(images, self.patch_size)  # (B, N, C p p)
        if patches.shape[1] != self.grid[0] * self.grid[1]:
            raise ValueError(f"images must be {self.grid} patches, got {tuple(images.shape)}")
        tokens = self.project(patches) + self.positions()  # (B, N, d)
        cls = self.class_token.expand(len(images), 1, -1)  # (B, 1, d)
        return torch.cat([cls, tokens], dim=1)  # (B, 1 + N, d)


class VisionTransformer(nn.Module):
    """A small ViT: :class:`PatchEmbedding`, the book's pre-LN
    :class:`~attention_lib.Encoder` with bidirectional attention (no mask) and
    a linear classifier on the class token.

    Explained in chapter 19, *Attention beyond text*.

    Args:
        image_size, patch_size, channels, d_model: as :class:`PatchEmbedding`.
        num_heads, num_layers, d_ff: as :class:`~attention_lib.Encoder`.
        num_classes: outputs of the classifier.
        dtype: dtype of the parameters.

    Shapes:
        - images: ``(B, C, H, W)``
        - logits: ``(B, num_classes)``
        - weights (``need_weights=True``): ``(B, num_layers, H, 1 + N, 1 + N)``,
          token 0 the class token.
    """

    def __init__(
        self,
        image_size: int | tuple[int, int],
        patch_size: int,
        channels: int,
        d_model: int,
        num_heads: int,
        num_layers: int,
        num_classes: int,
        *,
        d_ff: int | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.embed = PatchEmbedding(image_size, patch_size, channels, d_model)
        self.encoder = Encoder(d_model, num_heads, num_layers, d_ff)
        self.head = nn.Linear(d_model, num_classes)
        if dtype is not None:
            self.to(dtype)

    def forward(
        self, images: Tensor, *, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        out = self.encoder(self.embed(images), need_weights=need_weights)
        x, weights = out if need_weights else (out, None)  # (B, 1 + N, d)
        logits = self.head(x[:, 0])  # (B, classes): read from the class token
        return (logits, weights) if need_weights else logits


def rope_2d(positions: Tensor, d_head: int, *, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """Axial 2-D RoPE for patches: ``cos`` and ``sin`` of every coordinate pair.

    The ``d_head / 2`` pairs of a head (rotate-half layout) are split in two:
    the first half turn with the patch's row, the second half with its
    column, each at the speeds of a head of width ``d_head / 2``. A query
    and a key then meet with an angle that depends only on their difference
    in rows and in columns. This is Qwen2-VL's vision encoder
    (``Qwen2VLVisionRotaryEmbedding``). Rotate with
    ``attention_lib.rope.rotate_pairs(x, cos, sin)``.

    Explained in chapter 19, *Attention beyond text*.

    Args:
        positions: integer ``(..., L, 2)``, the (row, column) of each token
            (:func:`patch_positions`).
        d_head: width of a head, divisible by 4.
        base: the RoPE base.

    Returns:
        ``(cos, sin)``, each ``(..., L, d_head / 2)`` in float64.

    Raises:
        TypeError: if ``positions`` is not an integer tensor.
        ValueError: if ``positions`` is not ``(..., L, 2)`` or ``d_head`` is
            not divisible by 4.
    """
    if check_integer_tensor("positions", positions).dim() < 2 or positions.shape[-1] != 2:
        raise ValueError(
            f"positions must be (..., L, 2) rows and columns, got {tuple(positions.shape)}"
        )
    if check_d_head(d_head) % 4:
        raise ValueError(f"d_head must be divisible by 4 for 2-D RoPE, got {d_head}")
    omega = inverse_frequencies(d_head // 2, check_base(base), positions.device)  # (d/4,)
    angle = (positions.to(torch.float64)[..., None] * omega).flatten(-2)  # (..., L, d/2)
    return angle.cos(), angle.sin()


def mrope(
    positions: Tensor,
    d_head: int,
    sections: Sequence[int],
    *,
    base: float = 10000.0,
    interleaved: bool = False,
) -> tuple[Tensor, Tensor]:
    """Multimodal RoPE (M-RoPE): ``cos`` and ``sin`` of every coordinate pair
    from three position ids, time, height and width.

    Pair ``i`` turns at the speed ``omega_i`` of 1-D RoPE, by the position
    id of the axis it belongs to. ``sections = (s_t, s_h, s_w)`` with
    ``s_t + s_h + s_w = d_head / 2`` says how many pairs each axis gets:

    * **sectioned** (Qwen2-VL, ``interleaved=False``): pairs ``0 .. s_t-1``
      read time, the next ``s_h`` height, the last ``s_w`` width, so the
      width gets only the slowest speeds;
    * **interleaved** (Qwen3-VL): pairs cycle t, h, w, t, h, w, ... while
      ``3 s_h`` and ``3 s_w`` pairs last, the rest read time: every axis gets
      fast and slow speeds.

    For text, the three ids are equal, and both are 1-D RoPE exactly.
    Rotate with ``attention_lib.rope.rotate_pairs(x, cos, sin)``.

    Explained in chapter 19, *Attention beyond text*.

    Args:
        positions: integer ``(3, ..., L)``: time, height and width ids
            (:func:`mrope_positions`).
        d_head: width of a head (even).
        sections: pairs per axis, summing to ``d_head / 2``.
        base: the RoPE base.
        interleaved: Qwen3-VL's layout instead of Qwen2-VL's.

    Returns:
        ``(cos, sin)``, each ``(..., L, d_head / 2)`` in float64.

    Raises:
        TypeError: if ``positions`` is not an integer tensor.
        ValueError: if ``positions`` does not have 3 rows, or ``sections``
            are not three counts summing to ``d_head / 2``.
    """
    if check_integer_tensor("positions", positions).dim() < 2 or len(positions) != 3:
        raise ValueError(
            f"positions must be (3, ..., L): t, h, w ids, got {tuple(positions.shape)}"
        )
    half = check_d_head(d_head) // 2
    if len(sections) != 3 or sum(sections) != half or min(sections) < 0:
        raise ValueError(
            f"sections must be 3 counts summing to d_head / 2 = {half}, got {sections}"
        )
    axis = torch.cat([torch.full((n,), a) for a, n in enumerate(sections)])  # (d/2,) sectioned
    if interleaved:
        axis = torch.zeros(half, dtype=torch.long)  # time, except h and w in turn
        for a in (1, 2):
            axis[a : 3 * sections[a] : 3] = a
    omega = inverse_frequencies(d_head, check_base(base), positions.device)  # (d/2,)
    chosen = positions[axis.to(positions.device)].movedim(0, -1)  # (..., L, d/2): each pair's id
    angle = chosen.to(torch.float64) * omega
    return angle.cos(), angle.sin()


def mrope_positions(token_types: Tensor, grids: Tensor, *, merge: int = 1) -> Tensor:
    """The three M-RoPE position ids of a sequence of text and images.

    Text tokens count up as in 1-D RoPE, with the same id on all three axes.
    An image of ``h x w`` tokens (after merging ``merge x merge`` patches)
    starting at id ``s`` gets time ``s`` and height ``s + r``, width ``s + c``
    for its token at row ``r``, column ``c``; the text after it continues at
    ``s + max(h, w)``. This is 🤗 transformers' ``get_rope_index`` of Qwen2-VL
    and Qwen3-VL for images (no padding).

    Explained in chapter 19, *Attention beyond text*.

    Args:
        token_types: integer ``(B, L)``: ``TEXT`` (0) or ``IMAGE`` (1);
            each run of image tokens is one image.
        grids: integer ``(num_images, 3)``: each image's ``(t, h, w)`` in
            patches, in order over the batch.
        merge: the vision encoder's spatial merge (2 in Qwen2-VL).

    Returns:
        ``(3, B, L)`` long.

    Raises:
        TypeError: if ``token_types`` or ``grids`` is not an integer tensor.
        ValueError: on shapes that are not ``(B, L)`` and ``(num_images, 3)``,
            or an image whose run of tokens does not hold ``t h w / merge^2``.
    """
    if check_integer_tensor("token_types", token_types).dim() != 2 or (
        check_integer_tensor("grids", grids).dim() != 2 or grids.shape[-1] != 3
    ):
        raise ValueError(
            f"token_types must be (B, L), grids (num_images, 3): got "
            f"{tuple(token_types.shape)}, {tuple(grids.shape)}"
        )
    merge = check_int("merge", merge, minimum=1)
    out = torch.empty(3, *token_types.shape, dtype=torch.long)
    images = iter(grids.tolist())
    for b, row in enumerate(token_types.tolist()):
        start, i = 0, 0  # the next free id, the first token of the run
        for kind, run in itertools.groupby(row):
            n = len(list(run))
            if kind == TEXT:  # 1-D positions, equal on the three axes
                out[:, b, i : i + n] = torch.arange(start, start + n)
                start += n
            else:
                t, h, w = next(images, (0, 0, 0))
                if t * (h // merge) * (w // merge) != n:
                    raise ValueError(f"row {b}: an image of {n} tokens for grid {(t, h, w)}")
                thw = torch.cartesian_prod(*(torch.arange(s) for s in (t, h // merge, w // merge)))
                out[:, b, i : i + n] = thw.reshape(n, 3).T + start  # (3, n)
                start += max(h, w) // merge
            i += n
    return out.to(token_types.device)


def vision_mask(token_types: Tensor) -> Tensor:
    """The keep-mask of a causal model that reads images (Gemma 3): causal,
    except that the tokens of one image see each other both ways.

    Query ``i`` may attend to key ``j`` when ``j <= i``, or when ``i`` and
    ``j`` belong to the same image (one run of ``IMAGE`` tokens). Text
    after an image sees all of it; text before it sees none of it.

    Explained in chapter 19, *Attention beyond text*.

    Args:
        token_types: integer ``(B, L)``: ``TEXT`` (0) or ``IMAGE`` (1).

    Returns:
        bool keep-mask ``(B, 1, L, L)`` (``True`` = may attend).

    Raises:
        TypeError: if ``token_types`` is not an integer tensor.
        ValueError: if it is not ``(B, L)``.
    """
    if check_integer_tensor("token_types", token_types).dim() != 2:
        raise ValueError(f"token_types must be (B, L), got {tuple(token_types.shape)}")
    image = token_types == IMAGE  # (B, L)
    starts = image & ~nn.functional.pad(image, (1, 0))[:, :-1]  # first token of each image
    block = torch.where(image, starts.cumsum(-1), 0)  # (B, L): image number, 0 for text
    same = (block[:, :, None] == block[:, None, :]) & image[:, :, None]  # (B, L, L)
    return (causal_mask(token_types.shape[1], device=token_types.device) | same)[:, None]


def tokens_per_image(height: int, width: int, patch_size: int, *, merge: int = 1) -> int:
    """How many tokens an image of ``height x width`` pixels costs: its patches
    of ``patch_size``, merged ``merge x merge`` into one token (Qwen2-VL: 14
    and 2). Both sides must be multiples of ``patch_size * merge`` (resize
    first, as the image processors do).

    Explained in chapter 19, *Attention beyond text*.
    """
    side = check_int("patch_size", patch_size, minimum=1) * check_int("merge", merge, minimum=1)
    if check_int("height", height, minimum=1) % side or check_int("width", width, minimum=1) % side:
        raise ValueError(f"height and width must be multiples of {side}, got {height} x {width}")
    return (height // side) * (width // side)
