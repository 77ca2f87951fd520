"""Tests for attention_lib.show.style: every figure of the library is legible in the book.

The smallest text of a figure, in CSS px, follows from its font size, its dpi and the
width it is displayed at (the book's column, measured in Chromium at 1280 px):
``pt * dpi / 72 * min(1, column / natural width)``. It must be >= 9 CSS px.
"""

from __future__ import annotations

import base64
import io
import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from attention_lib import attention_grid, attention_heatmap, explore  # noqa: E402
from attention_lib.show import style  # noqa: E402
from attention_lib.show.style import (  # noqa: E402
    COLUMN_PX,
    DPI,
    MIN_FONT_PT,
    MIN_TEXT_PX,
    book_style,
    smallest_font_pt,
    smallest_text_px,
    text_css_px,
)
from attention_lib.show.phone import use_book_style  # noqa: E402
from attention_lib.show.viz import _luminance  # noqa: E402


@pytest.fixture(autouse=True)
def _clean():
    with matplotlib.rc_context():  # use_book_style below must not leak into other tests
        yield
    plt.close("all")


def _weights(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(*shape, generator=g), dim=-1)


def _natural_px(fig) -> float:
    """Width of the PNG the inline backend makes (tight bounding box), in pixels."""
    return fig.get_tightbbox(fig.canvas.get_renderer()).width * fig.dpi


def test_text_css_px_is_points_times_pixels_per_point_times_shrink():
    assert text_css_px(9, 72, 500, 688) == 9  # 1 px per pt, shown at natural size
    assert text_css_px(9, 96, 500, 688) == pytest.approx(12)  # 96 dpi: 4/3 px per pt
    assert text_css_px(8, 100, 1376, 688) == pytest.approx(8 * 100 / 72 / 2)  # halved
    # the rule's own numbers: 8 pt at the book's dpi, shown at natural size
    assert text_css_px(MIN_FONT_PT, DPI, 600, COLUMN_PX) >= MIN_TEXT_PX
    # a figure of MAX_WIDTH_IN inches at DPI is never shrunk by the column
    assert style.MAX_WIDTH_IN * DPI <= COLUMN_PX


def test_smallest_text_px_uses_the_smallest_font_and_the_shrink():
    fig, ax = plt.subplots(figsize=(10, 3), dpi=100)
    ax.set_title("big", fontsize=14)
    ax.text(0.5, 0.5, "tiny", fontsize=6)
    ax.set_xticks([0, 1], ["a", "b"], fontsize=10)
    ax.set_yticks([])
    assert smallest_font_pt(fig) == 6
    natural = _natural_px(fig)
    assert natural > COLUMN_PX
    assert smallest_text_px(fig) == pytest.approx(6 * 100 / 72 * COLUMN_PX / natural)
    assert smallest_text_px(fig) < MIN_TEXT_PX  # what the rule forbids
    # hidden axes do not count
    ax.set_visible(False)
    fig.text(0.1, 0.1, "only this", fontsize=11)
    assert smallest_font_pt(fig) == 11


@pytest.mark.parametrize(
    ("shape", "tokens", "kwargs"),
    [
        ((3, 3), True, {}),
        ((6, 6), True, {"title": "a title"}),
        ((8, 8), False, {}),
        ((12, 12), True, {}),
        ((32, 32), True, {"annotate": False}),
        ((64, 64), False, {}),
        ((5, 9), True, {"colorbar": False}),
    ],
)
def test_every_heatmap_is_legible_in_the_column(shape, tokens, kwargs):
    lq, lk = shape
    q = [f"q{i}" for i in range(lq)] if tokens else None
    k = [f"k{j}" for j in range(lk)] if tokens else None
    fig = attention_heatmap(_weights(lq, lk), q, k, **kwargs).figure
    assert fig.dpi == DPI
    assert smallest_font_pt(fig) >= MIN_FONT_PT
    assert _natural_px(fig) <= COLUMN_PX  # never shrunk on a desktop
    assert smallest_text_px(fig) >= MIN_TEXT_PX


@pytest.mark.parametrize(
    ("shape", "kwargs"),
    [
        ((4, 6, 6), {}),
        ((8, 6, 6), {}),
        ((4, 6, 6), {"max_cols": 2, "panel_size": 2.4}),
        ((3, 7, 7), {"colorbar": False, "annotate": False}),
        ((12, 4, 4), {}),
        ((2, 4, 6, 6), {}),  # chapter 7: 2 layers x 4 heads
        ((2, 8, 10, 10), {}),
        ((1, 2, 20, 20), {"panel_size": 5.0}),
    ],
)
def test_every_grid_fits_the_column_with_legible_text(shape, kwargs):
    weights = _weights(*shape)
    n_tok = shape[-1]
    toks = [f"t{i}" for i in range(n_tok)]
    fig = attention_grid(weights, toks, toks, **kwargs)
    assert fig.dpi == DPI
    assert smallest_font_pt(fig) >= MIN_FONT_PT
    assert _natural_px(fig) <= COLUMN_PX
    assert smallest_text_px(fig) >= MIN_TEXT_PX
    panels = [a for a in fig.axes if a.images]
    assert len(panels) == math.prod(shape[:-2])


def test_grid_rows_stay_few_and_balanced():
    # 4 heads fit one row; 8 heads wrap into 2 rows of 4; 5 panels on 3 columns: 3 + 2
    def cols(fig) -> int:
        return len({round(a.get_position().x0, 3) for a in fig.axes if a.images})

    assert cols(attention_grid(_weights(4, 6, 6))) == 4
    assert cols(attention_grid(_weights(8, 6, 6))) == 4
    assert cols(attention_grid(_weights(5, 6, 6), max_cols=3)) == 3
    # a 4-D grid whose heads do not fit wraps on a divisor: no row mixes two layers
    fig = attention_grid(_weights(2, 8, 6, 6))
    titles = [a.get_title() for a in fig.axes if a.images]
    assert cols(fig) == 4 and titles[3] == "layer 0, head 3" and titles[4] == "layer 0, head 4"


def test_nan_and_every_annotation_contrast_with_their_cell():
    w = _weights(4, 4)
    w[2] = float("nan")  # a fully masked row of a naive softmax
    ax = attention_heatmap(w, annotate=True)
    image = ax.images[0]
    cells = image.to_rgba(image.get_array())
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t for t in ax.texts}
    assert texts[(2, 0)].get_text() == "nan"
    for (i, j), text in texts.items():
        fg = _luminance(matplotlib.colors.to_rgba(text.get_color()))
        bg = _luminance(cells[i, j])
        ratio = (max(fg, bg) + 0.05) / (min(fg, bg) + 0.05)
        assert ratio >= 4.5, (i, j, text.get_text(), text.get_color(), ratio)  # WCAG AA
    assert texts[(2, 0)].get_color() == "black"  # dark text on the light grey NaN cell


def test_explorer_frames_follow_the_rules_even_for_a_plain_draw():
    def draw(t):
        fig, ax = plt.subplots(figsize=(6, 3))  # no dpi, no font sizes: the book's apply
        ax.plot([0, 1], [0, t], label="a line")
        ax.set_title(f"t = {t}")
        ax.legend()
        return fig

    ex = explore("t", [1, 2], draw)
    for png in ex.frames:
        image = Image.open(io.BytesIO(png))
        dpi = image.info["dpi"][0]
        assert dpi == pytest.approx(DPI, abs=0.1)
        assert image.width <= COLUMN_PX
        assert text_css_px(ex.smallest_font_pt, dpi, image.width, COLUMN_PX) >= MIN_TEXT_PX
    assert ex.smallest_font_pt >= MIN_FONT_PT
    assert f'data-smallest-font-pt="{ex.smallest_font_pt:g}"' in ex.to_html()


def test_use_book_style_applies_to_plain_figures_and_book_style_is_scoped():
    with book_style():
        fig, _ = plt.subplots()
        assert fig.dpi == DPI
    assert (
        matplotlib.rcParams["figure.dpi"] != DPI or matplotlib.rcParamsDefault["figure.dpi"] == DPI
    )
    use_book_style()
    fig, ax = plt.subplots()
    ax.set_title("t")
    ax.plot([0, 1], [1, 0], label="x")
    ax.legend()
    assert fig.dpi == DPI and smallest_font_pt(fig) >= MIN_FONT_PT
    assert smallest_text_px(fig) >= MIN_TEXT_PX


def test_use_book_style_makes_notebook_figures_sharp_on_2x_screens():
    # In a notebook (an IPython shell), the inline backend then shows every figure as a PNG
    # of PIXEL_RATIO pixels per CSS px, with the width in CSS px the page shows it at.
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        use_book_style()
        fig, ax = plt.subplots(figsize=(4, 2))
        ax.plot([0, 1], [1, 0])
        data, metadata = shell.display_formatter.format(fig)
        png = data["image/png"]
        png = png if isinstance(png, bytes) else base64.b64decode(png)
        with Image.open(io.BytesIO(png)) as image:
            width, dpi = image.width, image.info["dpi"][0]
        assert style.PIXEL_RATIO == 2
        assert metadata["image/png"]["width"] == width // style.PIXEL_RATIO
        assert dpi == pytest.approx(DPI * style.PIXEL_RATIO, abs=0.5)
        # the smallest text in CSS px is the same as a 1x figure's at natural size
        shown = metadata["image/png"]["width"]
        assert text_css_px(MIN_FONT_PT, dpi, width, shown) == pytest.approx(
            MIN_FONT_PT * DPI / 72, rel=0.01
        )
    finally:
        from IPython.core.pylabtools import select_figure_formats

        select_figure_formats(shell, {"png"})
        InteractiveShell.clear_instance()
