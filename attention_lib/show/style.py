"""The book's figure rules: resolution, font sizes and width, so every figure is legible.

Explained in chapter 1, *Queries, keys and values* (its first cell calls
:func:`use_book_style`); used by every figure of the book.

A figure is read as a PNG inside the book's text column, 688 CSS px wide on a
1280 px desktop (measured in Chromium by ``tests/browser``). Text of ``pt``
points in a PNG rendered at ``dpi`` dots per inch is ``pt * dpi / 72`` image
pixels high; shown ``displayed`` CSS px wide instead of its ``natural`` width
in pixels, it is :func:`text_css_px` CSS px high. The rules:

- every figure is laid out at :data:`DPI` = 96, one CSS px per image "dot" at
  natural size (so a 9-pt label is 12 CSS px, like 9-pt text of the page); the
  notebooks' static figures are saved with :data:`PIXEL_RATIO` = 2 image pixels per
  CSS px (the inline backend's ``retina`` PNG, whose ``width`` tells the page its
  size in CSS px), so they are sharp on 2x screens;
- no text is smaller than :data:`MIN_FONT_PT` = 8 pt (10.7 CSS px at natural size);
- a figure is at most :data:`MAX_WIDTH_IN` = 7.1 in (682 px) wide, so the column
  never shrinks it on a desktop: its smallest text stays >= :data:`MIN_TEXT_PX`
  = 9 CSS px. Grids of heatmaps wrap their panels to fit (few per row);
- on a phone the column is about 358 px: a figure would shrink to 5-7 px text, so a
  notebook's figure also carries a narrower *phone rendition*
  (:mod:`attention_lib.show.phone`), which the book shows on narrow screens; the
  book's ``afs.js`` lets the reader tap a shrunk figure open at full size.

:func:`book_style` is the matplotlib ``rc`` context that the library's own
plotting functions draw in; :func:`use_book_style` applies the same rules to a
notebook's own ``plt`` figures; :func:`smallest_text_px` checks a figure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - imported lazily at run time
    from matplotlib.figure import Figure


#: Width of the book's text column on a 1280 x 900 desktop, in CSS px (Chromium).
COLUMN_PX = 688
#: Resolution of every figure: one image pixel per CSS px at natural size.
DPI = 96
#: Image pixels per CSS px of the notebooks' static figures (sharp on 2x screens).
PIXEL_RATIO = 2
#: The smallest font of any figure, in points.
MIN_FONT_PT = 8.0
#: The smallest text a reader should meet in a figure on a desktop, in CSS px.
MIN_TEXT_PX = 9.0
#: The widest figure, in inches: ``MAX_WIDTH_IN * DPI`` fits the column.
MAX_WIDTH_IN = 7.1

#: matplotlib rc settings of the book's figures (sizes in points).
BOOK_RC: dict[str, Any] = {
    "figure.dpi": DPI,
    "savefig.dpi": "figure",
    "figure.figsize": (6.4, 4.0),
    "font.size": 10.0,
    "axes.titlesize": 11.0,
    "axes.labelsize": 10.0,
    "xtick.labelsize": 9.0,
    "ytick.labelsize": 9.0,
    "legend.fontsize": 9.0,
    "legend.title_fontsize": 9.0,
    "figure.titlesize": 12.0,
    "figure.labelsize": 10.0,
}


def text_css_px(font_pt: float, dpi: float, natural_px: float, displayed_px: float) -> float:
    """CSS px height of ``font_pt`` text in a PNG of ``natural_px`` pixels at ``dpi``,
    shown ``displayed_px`` CSS px wide (a browser never enlarges it past natural size)."""
    return font_pt * dpi / 72.0 * min(1.0, displayed_px / natural_px)


@contextlib.contextmanager
def book_style() -> Iterator[None]:
    """Draw inside this ``with`` block with the book's figure rules (:data:`BOOK_RC`)."""
    import matplotlib

    with matplotlib.rc_context(BOOK_RC):
        yield


def _texts(fig: Figure, draw: bool = True) -> list[Any]:
    """Every visible, non-empty text of ``fig``, tick labels included; a hidden artist
    (an unused grid cell, a switched-off tick label) hides all it holds. ``draw=False``
    if the figure was just drawn or saved (its tick labels exist)."""
    from matplotlib.text import Text

    if draw:
        fig.canvas.draw()  # makes the tick labels a saved image shows
    found, todo = [], [fig]
    while todo:
        artist = todo.pop()
        if not artist.get_visible():
            continue
        if isinstance(artist, Text) and artist.get_text().strip():
            found.append(artist)
        todo.extend(artist.get_children())
    return found


def smallest_font_pt(fig: Figure, draw: bool = True) -> float:
    """The size in points of the smallest visible text in ``fig`` (``draw=False``: the
    figure was just drawn or saved, its tick labels exist)."""
    sizes = [t.get_fontsize() for t in _texts(fig, draw)]
    if not sizes:
        raise ValueError("the figure has no visible text")
    return float(min(sizes))


def smallest_text_px(
    fig: Figure, displayed_px: float = COLUMN_PX, *, dpi: float | None = None, tight: bool = True
) -> float:
    """CSS px height of the smallest text of ``fig`` shown in a column ``displayed_px`` wide.

    Args:
        fig: the figure.
        displayed_px: the column width in CSS px (the 1280 px desktop's by default).
        dpi: the resolution it is saved at (default: the figure's own, as the inline
            backend and :func:`~attention_lib.explore` use).
        tight: whether the saved image is cropped to its content (the inline backend
            saves with ``bbox_inches="tight"``; explorer frames are not cropped).
    """
    dpi = float(fig.dpi if dpi is None else dpi)
    font = smallest_font_pt(fig)
    if tight:
        width_in = fig.get_tightbbox(fig.canvas.get_renderer()).width
    else:
        width_in = fig.get_size_inches()[0]
    return text_css_px(font, dpi, width_in * dpi, displayed_px)
