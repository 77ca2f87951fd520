"""A phone rendition of every figure, so a phone shows its text at >= 9 CSS px (issue 44).

Explained in chapter 1, *Queries, keys and values* (its first cell calls
:func:`~attention_lib.show.phone.use_book_style`, which installs it); used by every
static figure of the book.

A figure laid out for the desktop column (:data:`~attention_lib.show.style.COLUMN_PX`,
688 CSS px) is shrunk to about 358 CSS px on a 390 px phone: its 8-pt text, 10.7 CSS px
at natural size, becomes 5-7 px. Text in points keeps its size when the *figure* is
made narrower, so a narrower figure shown at (nearly) its natural size on the phone keeps
its text legible. The rules (:func:`phone_png`):

- a figure whose smallest text already shows at >= :data:`MIN_TEXT_PX` on the phone gets
  no second rendition;
- otherwise it is drawn again, at most :func:`phone_width_in` inches wide (so its
  smallest text shows at >= 9 CSS px in :data:`PHONE_COLUMN_PX`), its height scaled less
  than its width (panels keep room for their data);
- a row of panels of one grid that would be narrower than :data:`PHONE_PANEL_IN` is
  restacked with fewer per row (panels that stack; two heatmaps side by side become one
  above the other), when every axes of the figure sits in one cell of that grid
  (colorbars of a constrained layout follow their panel); a panel that moves to the
  first column shows the query labels a shared axis had hidden;
- a panel title wider than its panel breaks over two lines (not inside ``$...$``);
- the figure is then put back as it was (size and grid), so a later display is unchanged.

In a notebook, the inline backend's PNG of a figure carries the rendition in its output
metadata (``metadata["image/png"]["afs_phone"]``: a base64 PNG at
:data:`~attention_lib.show.style.PIXEL_RATIO` = 2 and its CSS size). nbval never
compares metadata or PNGs; the book's Sphinx extension (``book/_ext/afs_site.py``) writes
it next to the desktop PNG and shows one or the other by the screen's width.
"""

from __future__ import annotations

import base64
import io
import math
import struct
from typing import TYPE_CHECKING, Any

from .style import (
    BOOK_RC,
    DPI,
    MIN_FONT_PT,
    MIN_TEXT_PX,
    PIXEL_RATIO,
    smallest_font_pt,
    text_css_px,
)

if TYPE_CHECKING:  # pragma: no cover - imported lazily at run time
    from matplotlib.figure import Figure

#: Width of the book's text column on a 390 x 844 phone, in CSS px (Chromium: 358; a
#: little less, so a rendition fits with the page's margins on slightly narrower phones).
PHONE_COLUMN_PX = 350
#: The narrowest a rendition is made, in inches (below it, panels have no room).
MIN_PHONE_WIDTH_IN = 3.0
#: A panel of a restacked grid is at least this wide on the phone, in inches (a heatmap
#: with its query labels; two line plots side by side would be 2 in each).
PHONE_PANEL_IN = 2.6
#: A restacked grid has at most this many rows with one panel per row (else two per row).
MAX_PHONE_ROWS = 4
#: Key of the rendition in the inline PNG's output metadata.
METADATA_KEY = "afs_phone"


def phone_width_in(font_pt: float) -> float:
    """The widest a figure whose smallest text is ``font_pt`` points may be, in inches, for
    that text to show at >= :data:`MIN_TEXT_PX` CSS px in a :data:`PHONE_COLUMN_PX` column."""
    return font_pt * PHONE_COLUMN_PX / (72.0 * MIN_TEXT_PX)


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height in pixels of a PNG (its IHDR chunk)."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return struct.unpack(">II", png[16:24])


def _rule_font(fig: Figure) -> float:
    """The smallest font of ``fig`` (just drawn), in points, but at most the rules'
    :data:`~attention_lib.show.style.MIN_FONT_PT`: what the book's browser suite assumes of
    a static figure it measures, so a rendition is legible by that measure too."""
    return min(smallest_font_pt(fig, draw=False), MIN_FONT_PT)


def _save(fig: Figure, dpi: float) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def _grid(fig: Figure) -> tuple[Any, list[tuple[Any, int]]] | None:
    """The one top-level grid of a figure whose axes each fill one of its cells (colorbar
    axes of a constrained layout aside), and each axes with its cell's index; ``None``
    when the figure is laid out otherwise."""
    from matplotlib.gridspec import GridSpec

    constrained = type(fig.get_layout_engine()).__name__ == "ConstrainedLayoutEngine"
    grid, cells = None, []
    for ax in fig.axes:
        spec = ax.get_subplotspec()
        if spec is None:
            if constrained and hasattr(ax, "_colorbar"):
                continue
            return None
        gs = spec.get_gridspec()
        if type(gs) is not GridSpec or (grid is not None and gs is not grid):
            return None
        if spec.num2 != spec.num1:
            return None  # a panel over several cells
        grid = gs
        cells.append((ax, spec.num1))
    return (grid, cells) if grid is not None else None


def _restack(fig: Figure, width_in: float) -> tuple[float, list[Any]]:
    """Restack a row of panels that would be narrower than :data:`PHONE_PANEL_IN` into
    fewer columns; returns the factor of the height and what to put back."""
    from matplotlib.gridspec import GridSpec

    found = _grid(fig)
    if found is None:
        return 1.0, []
    grid, cells = found
    rows, cols = grid.get_geometry()
    new_cols = max(1, int(width_in // PHONE_PANEL_IN))
    if cols <= new_cols:
        return 1.0, []
    used = max(i for _, i in cells) + 1
    if math.ceil(used / new_cols) > MAX_PHONE_ROWS and cols > 2:
        new_cols = 2  # a long grid: smaller panels rather than a figure many screens tall
    new_rows = math.ceil(used / new_cols)
    new = GridSpec(new_rows, new_cols, figure=fig)
    first = min(cells, key=lambda c: c[1])[0]
    undo: list = []
    for ax, i in cells:
        spec = ax.get_subplotspec()
        undo.append(lambda ax=ax, spec=spec: ax.set_subplotspec(spec))
        ax.set_subplotspec(new[i // new_cols, i % new_cols])
        if i % new_cols == 0 and i % cols != 0 and ax.get_visible():
            # a shared y axis hid this panel's labels: the first column shows them
            on = ax.yaxis.get_tick_params().get("labelleft", True)
            label = ax.get_ylabel()
            undo.append(lambda ax=ax, on=on: ax.tick_params(axis="y", labelleft=on))
            undo.append(lambda ax=ax, label=label: ax.set_ylabel(label))
            ax.tick_params(axis="y", labelleft=True)
            if not label:
                ax.set_ylabel(first.get_ylabel())
    # new_rows / rows as many rows; a panel's height follows its width by a square root
    # (phone_png scales the whole figure's by (phone width / width) ** 0.5)
    return new_rows / rows * (cols / new_cols) ** 0.5, undo


def _split_outside_math(text: str) -> str | None:
    """``text`` broken at the space nearest its middle that is not inside ``$...$``."""
    spaces, math = [], False
    for i, ch in enumerate(text):
        if ch == "$":
            math = not math
        elif ch == " " and not math:
            spaces.append(i)
    if "\n" in text or not spaces:
        return None
    at = min(spaces, key=lambda i: abs(i - len(text) / 2))
    return text[:at] + "\n" + text[at + 1 :]


def _wrap_wide_titles(fig: Figure) -> list[Any]:
    """Break over two lines each axes title wider than its axes (the figure just drawn):
    on a narrow figure a title keeps its size in points and would run into its neighbours
    (a colorbar, the next panel). Returns what puts the titles back."""
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    undo = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        names = {ax.get_title(loc=loc) for loc in ("left", "center", "right")}
        titles = [c for c in ax.get_children() if isinstance(c, Text) and c.get_text() in names]
        for title in titles:
            text = title.get_text()
            if not text or not title.get_visible():
                continue
            if title.get_window_extent(renderer).width <= 1.02 * ax.bbox.width:
                continue
            broken = _split_outside_math(text)
            if broken is not None:
                title.set_text(broken)
                undo.append(lambda title=title, text=text: title.set_text(text))
    return undo


def phone_png(fig: Figure, *, tries: int = 3) -> tuple[bytes, float, float] | None:
    """The phone rendition of ``fig``: a PNG at ``PIXEL_RATIO * DPI`` dots per inch, cropped
    to its content like the inline backend's, and its CSS width and height; ``None`` when
    the figure's own rendition already shows its smallest text at >= ``MIN_TEXT_PX`` on
    the phone, or has no text.

    The figure is resized (and a wide row of panels restacked) only while this runs.
    """
    dpi = DPI * PIXEL_RATIO
    fig.canvas.draw()
    try:
        font = _rule_font(fig)
    except ValueError:
        return None
    natural = fig.get_tightbbox(fig.canvas.get_renderer()).width * DPI
    if text_css_px(font, DPI, natural, PHONE_COLUMN_PX) >= MIN_TEXT_PX:
        return None
    size = fig.get_size_inches().copy()
    target = max(MIN_PHONE_WIDTH_IN, phone_width_in(font))
    height_factor, undo = _restack(fig, target)
    try:
        width = target
        # the cropped image's width is the figure's, give or take its outer text: narrow it
        # until the text shows large enough (at most ``tries`` renders)
        for _ in range(tries):
            scale = width / size[0]
            fig.set_size_inches(width, size[1] * height_factor * max(scale, 0.35) ** 0.5)
            fig.canvas.draw()
            undo += _wrap_wide_titles(fig)
            png = _save(fig, dpi)
            px_w, px_h = png_size(png)
            css_w, css_h = px_w / PIXEL_RATIO, px_h / PIXEL_RATIO
            font = _rule_font(fig)
            shown = text_css_px(font, DPI, css_w, PHONE_COLUMN_PX)
            if shown >= MIN_TEXT_PX or width <= MIN_PHONE_WIDTH_IN:
                break
            width = max(MIN_PHONE_WIDTH_IN, width * shown / MIN_TEXT_PX * 0.98)
        return png, css_w, css_h
    finally:
        for put_back in reversed(undo):
            put_back()
        fig.set_size_inches(size)


def phone_metadata(fig: Figure) -> dict[str, Any] | None:
    """The output metadata entry of ``fig``'s phone rendition (see the module's
    docstring), or ``None`` when it needs none."""
    found = phone_png(fig)
    if found is None:
        return None
    png, width, height = found
    return {
        "png": base64.b64encode(png).decode("ascii"),
        "width": round(width),
        "height": round(height),
    }


def with_phone_rendition(png_formatter: Any) -> Any:
    """Wrap the inline backend's PNG formatter of figures (``(png, metadata)``) so that its
    metadata also carries the phone rendition (:data:`METADATA_KEY`)."""
    if isinstance(png_formatter, _WithPhoneRendition):
        return png_formatter
    return _WithPhoneRendition(png_formatter)


class _WithPhoneRendition:
    """A figure's PNG formatter whose metadata also carries the phone rendition."""

    def __init__(self, png_formatter: Any) -> None:
        self.png_formatter = png_formatter

    def __call__(self, fig: Figure) -> Any:
        out = self.png_formatter(fig)
        if out is None:
            return out
        data, md = out if isinstance(out, tuple) else (out, {})
        phone = phone_metadata(fig)
        if phone is None:
            return out
        return data, {**(md or {}), METADATA_KEY: phone}


def use_book_style() -> None:
    """Apply the book's figure rules to every figure made from now on (e.g. ``plt``'s).

    Call it once, after ``import matplotlib.pyplot`` (the inline backend sets its own
    resolution when pyplot is imported). In a notebook it also makes the inline backend
    save figures with ``PIXEL_RATIO`` (2) pixels per CSS px (its ``retina`` format).
    """
    import matplotlib

    matplotlib.rcParams.update(BOOK_RC)
    _retina_inline_figures()


def _retina_inline_figures() -> None:
    """Figures shown by the inline backend as 2x PNGs (nothing outside IPython)."""
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import select_figure_formats
    except ImportError:  # pragma: no cover - matplotlib without IPython
        return
    shell = get_ipython()
    if shell is None:
        return
    # The inline backend's own setting where it is loaded (it re-registers the
    # formatters with its print options); else the formatters directly. pyplot loads
    # its backend only for the first figure, and the inline backend then registers its
    # formats: load it now, so that the setting below is the one it registers.
    import matplotlib
    from matplotlib.backends import backend_registry

    backend = matplotlib.get_backend()
    if "inline" in backend:
        backend_registry.load_backend_module(backend)
    inline = [c for c in shell.configurables if type(c).__name__ == "InlineBackend"]
    for backend in inline:
        backend.figure_formats = {"retina"}
    if not inline:
        select_figure_formats(shell, {"retina"})
    # every figure's PNG also carries its phone rendition (attention_lib.show.phone)
    from matplotlib.figure import Figure

    png = shell.display_formatter.formatters["image/png"]
    png.for_type(Figure, with_phone_rendition(png.lookup_by_type(Figure)))
