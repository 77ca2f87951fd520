"""attention_lib.show.phone: the phone rendition of a figure (issue 44, item 3)."""

from __future__ import annotations

import base64

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from attention_lib.show.phone import (
    METADATA_KEY,
    PHONE_COLUMN_PX,
    phone_metadata,
    phone_png,
    phone_width_in,
    png_size,
    with_phone_rendition,
)
from attention_lib.show.style import (
    DPI,
    MIN_FONT_PT,
    MIN_TEXT_PX,
    PIXEL_RATIO,
    book_style,
    text_css_px,
)


@pytest.fixture
def three_panels():
    with book_style():
        fig, axes = plt.subplots(1, 3, figsize=(7.1, 2.6), constrained_layout=True)
        for i, ax in enumerate(axes):
            im = ax.imshow(np.arange(36.0).reshape(6, 6))
            ax.set_title(f"head {i}")
            ax.set_xlabel("key")
            ax.set_ylabel("query")
        fig.colorbar(im, ax=axes[-1])
        yield fig
    plt.close(fig)


def test_phone_width_shows_the_rules_smallest_font_at_9_px():
    width = phone_width_in(MIN_FONT_PT)
    assert text_css_px(MIN_FONT_PT, DPI, width * DPI, PHONE_COLUMN_PX) == pytest.approx(MIN_TEXT_PX)


def test_a_wide_row_of_panels_is_restacked_and_legible(three_panels):
    size = three_panels.get_size_inches().copy()
    specs = [ax.get_subplotspec() for ax in three_panels.axes if ax.get_subplotspec()]
    png, width, height = phone_png(three_panels)
    px_w, px_h = png_size(png)
    assert (px_w / PIXEL_RATIO, px_h / PIXEL_RATIO) == (width, height)
    # two panels per row: taller than wide, unlike the 1 x 3 desktop figure
    assert height > width
    assert text_css_px(MIN_FONT_PT, DPI, width, PHONE_COLUMN_PX) >= MIN_TEXT_PX - 0.05
    # the figure is put back as it was
    assert np.allclose(three_panels.get_size_inches(), size)
    assert [ax.get_subplotspec() for ax in three_panels.axes if ax.get_subplotspec()] == specs


def test_a_figure_legible_on_a_phone_gets_no_rendition():
    with book_style():
        fig, ax = plt.subplots(figsize=(3.0, 2.0))
        ax.plot([0, 1], [1, 0])
    try:
        assert phone_png(fig) is None
        assert phone_metadata(fig) is None
    finally:
        plt.close(fig)


def test_the_png_formatter_adds_the_rendition_to_its_metadata(three_panels):
    calls = []

    def retina(fig):
        calls.append(fig)
        return b"PNG", {"width": 692, "height": 256}

    wrapped = with_phone_rendition(retina)
    assert with_phone_rendition(wrapped) is wrapped  # installed once
    data, md = wrapped(three_panels)
    assert data == b"PNG" and md["width"] == 692 and calls == [three_panels]
    phone = md[METADATA_KEY]
    assert png_size(base64.b64decode(phone["png"])) == (
        pytest.approx(phone["width"] * PIXEL_RATIO, abs=1),
        pytest.approx(phone["height"] * PIXEL_RATIO, abs=1),
    )


def test_png_size_refuses_other_bytes():
    with pytest.raises(ValueError, match="not a PNG"):
        png_size(b"GIF89a" + bytes(30))


def test_two_heatmaps_stack_and_show_their_query_labels_then_are_put_back():
    import torch

    from attention_lib import attention_grid

    tokens = ["the", "hungry", "cat", "chased", "a", "mouse"]
    fig = attention_grid(torch.full((2, 6, 6), 1 / 6), tokens, tokens)
    try:
        right = fig.axes[1]
        assert not right.yaxis.get_tick_params()["labelleft"]
        _, width, height = phone_png(fig)
        assert height > 1.5 * width  # one above the other
        assert not right.yaxis.get_tick_params()["labelleft"]  # put back
        assert right.get_ylabel() == ""
    finally:
        plt.close(fig)


def test_a_title_wider_than_its_panel_breaks_outside_math_and_is_put_back():
    import torch

    from attention_lib import attention_heatmap
    from attention_lib.show.phone import _split_outside_math

    assert _split_outside_math("$Q = XW_q$: actions look") == "$Q = XW_q$:\nactions look"
    assert _split_outside_math("$a b$") is None
    title = "cross-attention: German queries, English keys"
    ax = attention_heatmap(torch.full((3, 7), 1 / 7), title=title)
    try:
        seen = []
        real_save = ax.figure.savefig

        def save(*args, **kwargs):
            seen.append(ax.get_title())
            return real_save(*args, **kwargs)

        ax.figure.savefig = save
        phone_png(ax.figure)
        assert seen and all("\n" in t for t in seen)
        assert ax.get_title() == title
    finally:
        plt.close(ax.figure)
