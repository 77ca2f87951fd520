"""Heatmaps of attention weights: one matrix, or a grid of heads (and layers).

Queries are rows and keys are columns, as in the weight matrix itself: row ``i``
shows how query ``i`` spreads its attention over the keys, and every row of a
softmax output sums to 1. The colour scale is fixed to ``0..1`` by default, so
that two heatmaps (or two frames of a slider) can be compared by eye.

Weights may be tensors that require grad or live on another device; they are
detached and copied to the CPU as float32 before plotting.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy
import torch
from torch import Tensor

from ..validation import check_bool, check_choice, check_instance, check_int, check_real
from .style import MAX_WIDTH_IN, MIN_FONT_PT, book_style

if TYPE_CHECKING:  # pragma: no cover - imported lazily at run time
    from matplotlib.axes import Axes
    from matplotlib.colors import Colormap
    from matplotlib.figure import Figure
    from matplotlib.image import AxesImage


#: Matrices up to this size (in both dimensions) get value annotations by default.
ANNOTATE_MAX_SIDE = 8
#: Tick labels of up to this many tokens get the full tick font size.
_FULL_TICKS = 16
#: Tick label size (points) of the heatmaps; never below the book's MIN_FONT_PT.
_TICK_PT = 9.0
#: A grid panel is at least this wide (inches): more panels per row wrap.
PANEL_MIN_IN = 1.3
#: Tolerance for weights that overshoot ``[vmin, vmax]`` by float rounding.
_RANGE_TOL = 1e-4
#: The hint of the error for weights with too many dims.
_ONE_MATRIX = " (select one batch element/head first, e.g. weights[0], or use attention_grid)"


def _prepare(
    weights: Any,
    dims: tuple[int, ...],
    shape: str,
    query_tokens: Sequence[Any] | None,
    key_tokens: Sequence[Any] | None,
    *,
    vmin: float,
    vmax: float,
    cmap: str,
    fmt: str,
    annotate: object,
    colorbar: object,
) -> tuple[numpy.ndarray, Colormap, list[str] | None, list[str] | None]:
    """Check the arguments that attention_heatmap and attention_grid share, before any
    figure exists; return the weights as a float32 CPU numpy array (detached), the
    colour map and the query and key labels as strings."""
    import matplotlib

    t = torch.from_numpy(weights) if isinstance(weights, numpy.ndarray) else weights
    check_instance("weights", t, Tensor, f"a torch.Tensor or numpy.ndarray of shape {shape}")
    if t.is_complex():
        raise TypeError(f"weights must be real-valued, got dtype {t.dtype}")
    if t.dim() not in dims:
        hint = _ONE_MATRIX if t.dim() > max(dims) else ""
        raise ValueError(f"weights must have shape {shape}, got {t.dim()}-D {tuple(t.shape)}{hint}")
    if 0 in t.shape:
        raise ValueError(f"weights must not be empty, got shape {tuple(t.shape)}")
    arr = t.detach().to(device="cpu", dtype=torch.float32).numpy()
    # Values outside the fixed colour scale would be clipped silently: refuse them.
    vmax = check_real("vmax", vmax)
    vmin = check_real("vmin", vmin, below=vmax)
    finite = arr[numpy.isfinite(arr)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (vmin, vmax)
    tol = _RANGE_TOL * (vmax - vmin)
    if lo < vmin - tol or hi > vmax + tol:
        raise ValueError(
            f"weights has values in [{lo:.4g}, {hi:.4g}], outside the colour scale [vmin={vmin:g}, "
            f"vmax={vmax:g}]; to plot other values (e.g. raw scores), pass vmin= and vmax="
        )
    for name, value in (("cmap", cmap), ("fmt", fmt)):
        check_instance(name, value, str, "a str")
    if cmap not in matplotlib.colormaps:
        raise ValueError(f"cmap must be a matplotlib colour map name, got {cmap!r}")
    try:
        format(0.5, fmt)
    except ValueError:
        raise ValueError(f"fmt must be a float format spec such as '.2f', got {fmt!r}") from None
    check_choice("annotate", annotate, (None, True, False))
    check_bool("colorbar", colorbar)
    lq, lk = arr.shape[-2:]
    q_labels = _check_labels(query_tokens, "query_tokens", lq, "query (row of weights)")
    k_labels = _check_labels(key_tokens, "key_tokens", lk, "key (column of weights)")
    # NaN cells (e.g. a fully masked row of a naive softmax) are drawn light grey.
    return arr, matplotlib.colormaps[cmap].with_extremes(bad="lightgrey"), q_labels, k_labels


def _luminance(rgba: Sequence[float]) -> float:
    """WCAG relative luminance of an sRGB colour given as floats in [0, 1]."""
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgba[:3]]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def _text_colour(rgba: Sequence[float]) -> str:
    """Black or white, whichever contrasts more with a cell of colour ``rgba``
    (so "nan" on a light grey cell is black, not white)."""
    lum = _luminance(rgba)
    return "black" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "white"


def _annotation_fits(fmt: str, cell_in: float) -> bool:
    """Whether a value formatted with ``fmt`` at MIN_FONT_PT fits a cell ``cell_in`` wide."""
    chars = len(format(0.5, fmt))
    return cell_in >= (0.6 * chars * MIN_FONT_PT + 4) / 72


def _check_labels(items: Any, name: str, length: int, per: str) -> list[str] | None:
    """``None``, or a sequence of ``length`` labels (one per ``per``), as strings."""
    if items is None:
        return None
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise TypeError(f"{name} must be a sequence of {length} labels, got {type(items).__name__}")
    if len(items) != length:
        raise ValueError(f"{name} must have {length} labels, one per {per}, got {len(items)}")
    return [str(t) for t in items]


def _tick_fontsize(labels: list[str] | None, n: int) -> float:
    if labels is None or n <= _FULL_TICKS:
        return _TICK_PT
    return max(MIN_FONT_PT, _TICK_PT * _FULL_TICKS / n)


def _x_rotation(labels: list[str] | None) -> int:
    return 90 if labels is not None and max(len(s) for s in labels) > 2 else 0


def _set_ticks(ax: Axes, which: str, labels: list[str] | None, n: int) -> None:
    """Token labels on every tick; without tokens, integer positions (sparse if many)."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    if labels is None:
        step = max(1, math.ceil(n / 16))
        positions = list(range(0, n, step))
        axis.set_ticks(positions, labels=[str(p) for p in positions], fontsize=_TICK_PT)
        return
    rotation = _x_rotation(labels) if which == "x" else 0
    axis.set_ticks(range(n), labels=labels, fontsize=_tick_fontsize(labels, n), rotation=rotation)


def _draw_heatmap(
    ax: Axes,
    arr: numpy.ndarray,  # (Lq, Lk)
    query_tokens: list[str] | None,
    key_tokens: list[str] | None,
    *,
    annotate: bool,
    vmin: float,
    vmax: float,
    cmap: Colormap,
    fmt: str,
    annot_size: float = MIN_FONT_PT,
) -> AxesImage:
    """Draw one (Lq, Lk) matrix on ``ax``; shared by the single heatmap and the grid."""
    lq, lk = arr.shape
    image = ax.imshow(arr, cmap=cmap, vmin=vmin, vmax=vmax, aspect="equal", interpolation="nearest")
    _set_ticks(ax, "x", key_tokens, lk)
    _set_ticks(ax, "y", query_tokens, lq)
    ax.set_xlabel("keys")
    ax.set_ylabel("queries")
    if annotate:
        cells = image.to_rgba(arr)  # (Lq, Lk, 4): the colour of each cell, NaN's too
        for i in range(lq):
            for j in range(lk):
                ax.text(
                    j,
                    i,
                    format(float(arr[i, j]), fmt),
                    ha="center",
                    va="center",
                    fontsize=annot_size,
                    color=_text_colour(cells[i, j]),
                )
    return image


def _new_heatmap_axes(
    lq: int,
    lk: int,
    q_labels: list[str] | None,
    k_labels: list[str] | None,
    title: str | None,
    colorbar: bool,
) -> tuple[Axes, Axes | None, tuple[float, float]]:
    """A new pyplot figure sized for the matrix, with margins computed from the labels.

    The margins and the axis-label positions are estimated from the label
    lengths instead of being measured: a layout engine (or matplotlib's
    automatic axis-label placement) measures every tick label again on each
    draw, which roughly doubles the time of a redraw; that matters for live
    sliders.

    Returns:
        ``(ax, cax, (xlabel_y, ylabel_x))``: the heatmap axes, the colourbar axes
        (or ``None``) and where the axis labels go, in axes coordinates.
    """
    import matplotlib.pyplot as plt

    def chars(labels: list[str] | None, n: int) -> int:
        return max(len(s) for s in labels) if labels else len(str(n - 1))

    def pt(points: float) -> float:  # points to inches
        return points / 72.0

    em = 0.65  # generous average glyph width, in font sizes
    x_fs, y_fs = _tick_fontsize(k_labels, lk), _tick_fontsize(q_labels, lq)
    x_rot = _x_rotation(k_labels)
    # tick length + pad (7 pt) + tick labels, in points
    x_ticks = 7 + (x_fs * em * chars(k_labels, lk) if x_rot else x_fs * 1.25)
    y_ticks = 7 + y_fs * em * chars(q_labels, lq)
    cell = min(0.45, 4.2 / max(lq, lk))  # inches per matrix cell: at most 4.2 in a side
    width, height = cell * lk, cell * lq
    left = pt(y_ticks + 18)  # + "queries"
    bottom = pt(x_ticks + 18)  # + "keys"
    top = pt(22 if title else 8)
    right = pt(70 if colorbar else 8)  # pad + bar + "0.5" tick labels + "weight"
    fig_w, fig_h = left + width + right, bottom + height + top
    fig = plt.figure(figsize=(fig_w, fig_h))
    ax = fig.add_axes((left / fig_w, bottom / fig_h, width / fig_w, height / fig_h))
    cax = None
    if colorbar:
        cax = fig.add_axes(
            ((left + width + pt(10)) / fig_w, bottom / fig_h, pt(10) / fig_w, height / fig_h),
            label="<colorbar>",
        )
    coords = (-pt(x_ticks + 2) / height, -pt(y_ticks + 2) / width)
    return ax, cax, coords


def attention_heatmap(
    weights: Tensor | numpy.ndarray,
    query_tokens: Sequence[Any] | None = None,
    key_tokens: Sequence[Any] | None = None,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    annotate: bool | None = None,
    colorbar: bool = True,
    vmin: float = 0.0,
    vmax: float = 1.0,
    cmap: str = "viridis",
    fmt: str = ".2f",
) -> Axes:
    """Plot one attention-weight matrix: queries as rows, keys as columns.

    Explained in chapter 1, *Queries, keys and values*; used by every later chapter.

    Args:
        weights: attention weights, a tensor (may require grad or live on any
            device) or numpy array. Detached, copied to the CPU as float32.
        query_tokens: one label per query (row), or ``None`` for row indices.
        key_tokens: one label per key (column), or ``None`` for column indices.
        ax: axes to draw on; ``None`` creates a new figure (via pyplot, so the
            inline backend shows it) sized for the matrix and its labels.
        title: axes title.
        annotate: write each value in its cell. ``None`` (default) annotates
            matrices of at most 8 x 8.
        colorbar: add a colourbar next to the axes.
        vmin, vmax: the fixed colour scale, ``0..1`` by default so that plots are
            comparable. Finite values outside it raise (they would be clipped).
        cmap: matplotlib colour map name.
        fmt: format spec of the annotations.

    Returns:
        The matplotlib ``Axes`` holding the heatmap (``ax.images[0]`` is the
        image; its ``get_array()`` is the weight matrix).

    Raises:
        TypeError: ``weights`` is not a tensor/array, tokens are not a sequence,
            ``vmin``/``vmax`` are not numbers, ``cmap``/``fmt`` are not str or
            ``annotate``/``colorbar`` are not bools.
        ValueError: ``weights`` is not 2-D or is empty, a token list has the wrong
            length, values lie outside ``[vmin, vmax]``, or ``cmap``/``fmt`` is
            not a colour map name/format spec.

    Shapes:
        - weights: ``(Lq, Lk)``
        - query_tokens: ``Lq`` labels; key_tokens: ``Lk`` labels.
    """
    arr, colours, q_labels, k_labels = _prepare(
        weights,
        (2,),
        "(Lq, Lk)",
        query_tokens,
        key_tokens,
        vmin=vmin,
        vmax=vmax,
        cmap=cmap,
        fmt=fmt,
        annotate=annotate,
        colorbar=colorbar,
    )  # (Lq, Lk)
    lq, lk = arr.shape
    if annotate is None:
        annotate = lq <= ANNOTATE_MAX_SIDE and lk <= ANNOTATE_MAX_SIDE
    with book_style():  # dpi and font sizes of the book (attention_lib.show.style)
        return _heatmap(
            arr,
            q_labels,
            k_labels,
            ax=ax,
            title=title,
            annotate=annotate,
            colorbar=colorbar,
            vmin=vmin,
            vmax=vmax,
            colours=colours,
            fmt=fmt,
        )


def _heatmap(
    arr: numpy.ndarray,
    q_labels: list[str] | None,
    k_labels: list[str] | None,
    *,
    ax: Axes | None,
    title: str | None,
    annotate: bool,
    colorbar: bool,
    vmin: float,
    vmax: float,
    colours: Colormap,
    fmt: str,
) -> Axes:
    """attention_heatmap after validation: draw on ``ax`` or on a new figure."""
    lq, lk = arr.shape
    cax, coords = None, None
    if ax is None:
        ax, cax, coords = _new_heatmap_axes(lq, lk, q_labels, k_labels, title, colorbar)
    image = _draw_heatmap(
        ax,
        arr,
        q_labels,
        k_labels,
        annotate=bool(annotate),
        vmin=vmin,
        vmax=vmax,
        cmap=colours,
        fmt=fmt,
    )
    if coords is not None:  # fixed positions: no measuring of tick labels per draw
        ax.xaxis.set_label_coords(0.5, coords[0])
        ax.yaxis.set_label_coords(coords[1], 0.5)
    if title is not None:
        # An explicit y turns off matplotlib's automatic title placement, which
        # measures the x axis on every draw (~15% of a redraw); our key labels
        # are always below the matrix, so nothing can collide with the title.
        ax.set_title(title, fontsize=10, y=1.0)
    if colorbar:
        fig = ax.get_figure()
        if cax is not None:
            bar = fig.colorbar(image, cax=cax, label="weight")
            cax.yaxis.set_label_coords(4.4, 0.5)  # right of the "0.5" tick labels
        else:  # caller's axes: take the space from them
            bar = fig.colorbar(image, ax=ax, label="weight", shrink=0.9)
        bar.set_ticks([vmin, vmin + 0.5 * (vmax - vmin), vmax])
    return ax


def attention_grid(
    weights: Tensor | numpy.ndarray,
    query_tokens: Sequence[Any] | None = None,
    key_tokens: Sequence[Any] | None = None,
    *,
    row_titles: Sequence[Any] | None = None,
    col_titles: Sequence[Any] | None = None,
    annotate: bool | None = None,
    colorbar: bool = True,
    max_cols: int = 4,
    panel_size: float = 2.2,
    suptitle: str | None = None,
    vmin: float = 0.0,
    vmax: float = 1.0,
    cmap: str = "viridis",
    fmt: str = ".2f",
) -> Figure:
    """Plot one heatmap per head, or per layer and head, on a shared colour scale.

    Explained in chapter 6, *Multi-head attention* (and used in chapter 7).

    A 3-D input ``(H, Lq, Lk)`` gives one panel per head titled ``"head h"``,
    wrapped after ``max_cols`` panels. A 4-D input ``(layers, H, Lq, Lk)`` gives one
    row per layer and one column per head, titled ``"layer l, head h"``. All panels
    share the colour scale ``[vmin, vmax]`` and one colourbar; token labels are
    drawn on the outer panels only.

    The grid follows the book's figure rules (``attention_lib.show.style``): it
    is never wider than the book's column, so panels wrap (at most as many per row
    as fit at 1.3 in each, rows balanced; a 4-D grid's heads wrap so that no row
    mixes two layers) and shrink below ``panel_size`` when needed; no text is
    smaller than 8 pt.

    Args:
        weights: a tensor (may require grad or live on any device) or numpy array.
        query_tokens: one label per query (row), or ``None``.
        key_tokens: one label per key (column), or ``None``.
        row_titles: 4-D input only: one name per layer, replacing ``"layer l"``.
        col_titles: one name per head, replacing ``"head h"``.
        annotate: write values in the cells; ``None`` annotates matrices of at
            most 8 x 8 whose cells are wide enough for the values at 8 pt.
        colorbar: add one colourbar shared by all panels.
        max_cols: 3-D input only: at most this many panels per row.
        panel_size: height of one panel in inches (at most; see above).
        suptitle: title of the whole figure.
        vmin, vmax: the shared, fixed colour scale (``0..1`` by default).
        cmap: matplotlib colour map name.
        fmt: format spec of the annotations.

    Returns:
        The matplotlib ``Figure`` (created via pyplot, so the inline backend
        shows it).

    Raises:
        TypeError: ``weights`` is not a tensor/array, labels are not sequences,
            ``max_cols`` is not an int, ``panel_size``/``vmin``/``vmax`` are not
            numbers, ``cmap``/``fmt`` are not str or ``annotate``/``colorbar``
            are not bools.
        ValueError: ``weights`` is not 3-D or 4-D, label/title lists have the
            wrong length, ``row_titles`` is given for 3-D input, values lie
            outside ``[vmin, vmax]``, ``max_cols < 1`` or ``panel_size <= 0``.

    Shapes:
        - weights: ``(H, Lq, Lk)`` or ``(layers, H, Lq, Lk)``
    """
    arr, colours, q_labels, k_labels = _prepare(
        weights,
        (3, 4),
        "(H, Lq, Lk) or (layers, H, Lq, Lk)",
        query_tokens,
        key_tokens,
        vmin=vmin,
        vmax=vmax,
        cmap=cmap,
        fmt=fmt,
        annotate=annotate,
        colorbar=colorbar,
    )
    four_d = arr.ndim == 4
    if not four_d and row_titles is not None:
        raise ValueError(f"row_titles needs 4-D weights (layers, H, Lq, Lk), got {arr.shape}")
    arr = arr if four_d else arr[None]  # (layers, H, Lq, Lk)
    n_layers, n_heads, lq, lk = arr.shape
    heads = _check_labels(col_titles, "col_titles", n_heads, "head") or [
        f"head {h}" for h in range(n_heads)
    ]
    layers = _check_labels(row_titles, "row_titles", n_layers, "layer") or [
        f"layer {l}" for l in range(n_layers)
    ]
    max_cols = check_int("max_cols", max_cols, minimum=1)
    panel_size = check_real("panel_size", panel_size, above=0)
    aspect = min(1.6, max(0.6, lk / lq))  # panel width / height
    ncols, panel_w = _grid_columns(
        n_layers * n_heads, n_heads if four_d else None, max_cols, panel_size * aspect, colorbar
    )
    if annotate is None:
        annotate = (
            lq <= ANNOTATE_MAX_SIDE
            and lk <= ANNOTATE_MAX_SIDE
            and _annotation_fits(fmt, 0.8 * panel_w / lk)
        )
    with book_style():  # dpi and font sizes of the book (attention_lib.show.style)
        fig = _grid(
            arr,
            q_labels,
            k_labels,
            layers,
            heads,
            four_d=four_d,
            ncols=ncols,
            panel=(panel_w, panel_w / aspect),
            annotate=bool(annotate),
            colorbar=colorbar,
            vmin=vmin,
            vmax=vmax,
            colours=colours,
            fmt=fmt,
        )
        if suptitle is not None:
            fig.suptitle(suptitle)
    return fig


def _grid_columns(
    n_panels: int, per_row_group: int | None, max_cols: int, panel_w: float, colorbar: bool
) -> tuple[int, float]:
    """Panels per row and panel width (inches) so that the grid fits the book's column.

    At most as many panels per row as fit MAX_WIDTH_IN at PANEL_MIN_IN each (and at most
    ``max_cols``); rows are balanced (4 panels on 3 columns become 2 + 2). The heads of a
    4-D grid (``per_row_group`` of them per layer) stay one layer per row when they fit,
    else wrap on a divisor of the head count, so that no row mixes two layers.
    """
    room = MAX_WIDTH_IN - _grid_margin(colorbar)
    fit = max(1, int(room // PANEL_MIN_IN))
    if per_row_group is not None:
        ncols = per_row_group
        if ncols > fit:
            ncols = max(d for d in range(1, fit + 1) if per_row_group % d == 0)
    else:
        ncols = min(n_panels, max_cols, fit)
        ncols = math.ceil(n_panels / math.ceil(n_panels / ncols))
    return ncols, min(panel_w, room / ncols)


def _grid_margin(colorbar: bool) -> float:
    """Width (inches) of a grid beside its panels: query labels, and the colour bar."""
    return 0.6 + (1.1 if colorbar else 0.3)


def _grid(
    arr: numpy.ndarray,
    q_labels: list[str] | None,
    k_labels: list[str] | None,
    layers: list[str],
    heads: list[str],
    *,
    four_d: bool,
    ncols: int,
    panel: tuple[float, float],
    annotate: bool,
    colorbar: bool,
    vmin: float,
    vmax: float,
    colours: Colormap,
    fmt: str,
) -> Figure:
    """attention_grid after validation: one panel per (layer, head), ``ncols`` per row."""
    import matplotlib.pyplot as plt

    n_layers, n_heads = arr.shape[:2]
    # Panel k of the flat list goes to grid cell divmod(k, ncols).
    panels = [(l, h) for l in range(n_layers) for h in range(n_heads)]
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        squeeze=False,
        layout="constrained",
        figsize=(ncols * panel[0] + _grid_margin(colorbar), nrows * (panel[1] + 0.35) + 0.4),
    )
    image = None
    for k, (l, h) in enumerate(panels):
        r, c = divmod(k, ncols)
        ax = axes[r, c]
        image = _draw_heatmap(
            ax,
            arr[l, h],
            q_labels,
            k_labels,
            annotate=annotate,
            vmin=vmin,
            vmax=vmax,
            cmap=colours,
            fmt=fmt,
        )
        ax.set_title(f"{layers[l]}, {heads[h]}" if four_d else heads[h], fontsize=10, y=1.0)
        # Shared labels: only the left column keeps query labels, and only a panel
        # with no panel below it keeps key labels.
        if c > 0:
            ax.set_ylabel("")
            ax.tick_params(axis="y", labelleft=False)
        if k + ncols < len(panels):
            ax.set_xlabel("")
            ax.tick_params(axis="x", labelbottom=False)
    for k in range(len(panels), nrows * ncols):
        axes.flat[k].set_visible(False)  # unused cells of a wrapped grid
    if colorbar and image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), label="weight", shrink=0.9)
    return fig
