"""Tests for attention_lib.show.explorer: live widget, kernel-free HTML fallback, budgets."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser

import matplotlib

matplotlib.use("Agg")

import ipywidgets as widgets  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attention_lib import SliderExplorer, attention_heatmap, explore  # noqa: E402
from attention_lib.show.explorer import _ONINPUT_JS, WIDGET_VIEW_MIME  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DPI = 20  # tiny frames keep the tests fast


class Recorder:
    """A draw function that records its calls and draws a grey level per distinct call.

    The level is the rank of the call's arguments among the distinct calls seen so
    far: distinct values always draw distinct frames, and the same value always the
    same frame. (A level from ``hash(repr(value))`` made the frames collide in ~6%
    of runs, because Python randomises ``str`` hashes per process.)
    """

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self._levels: dict[tuple, int] = {}

    def __call__(self, *args):
        self.calls.append(args)
        rank = self._levels.setdefault(args, len(self._levels))
        level = (rank % 11) / 10.0  # 11 grey levels, far apart in the colour map
        fig, ax = plt.subplots(figsize=(1, 1))
        ax.imshow(np.full((2, 2), level), vmin=0, vmax=1)
        ax.set_axis_off()
        return fig


class Tags(HTMLParser):
    """Collects (tag, attrs) of every start tag, and the text of the .afs-label."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.label_text = ""
        self._in_label = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        self._in_label = "afs-label" in a.get("class", "").split()

    def handle_data(self, data):
        if self._in_label:
            self.label_text += data

    def handle_endtag(self, tag):
        self._in_label = False

    def find(self, tag: str, cls: str) -> list[dict]:
        return [a for t, a in self.tags if t == tag and cls in a.get("class", "").split()]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_fallback_has_one_frame_per_value_with_labels():
    draw = Recorder()
    values = [0.25, 0.5, 1.0, 2.0]
    ex = explore("temperature", values, draw, dpi=DPI)
    assert draw.calls == [(v,) for v in values]
    page = Tags(ex.to_html())
    assert len(page.find("div", "afs-explorer")) == 1
    frames = page.find("img", "afs-frame")
    assert [f["data-index"] for f in frames] == ["0", "1", "2", "3"]
    labels = ["temperature = 0.25", "temperature = 0.5", "temperature = 1", "temperature = 2"]
    assert [f["data-label"] for f in frames] == labels
    assert [f["alt"] for f in frames] == labels
    # only the first frame is visible before any interaction
    assert [("display:none" in f["style"]) for f in frames] == [False, True, True, True]
    assert page.label_text == "temperature = 0.25"
    (slider,) = page.find("input", "afs-slider")
    assert slider["type"] == "range" and slider["data-param"] == "temperature"
    assert (slider["min"], slider["max"], slider["step"], slider["value"]) == ("0", "3", "1", "0")
    assert "closest('.afs-explorer')" in slider["oninput"]
    # every frame is the inline PNG of the matching pre-rendered frame
    for f, png in zip(frames, ex.frames):
        assert f["src"].startswith("data:image/png;base64,")
        assert base64.b64decode(f["src"].split(",", 1)[1]) == png
        assert png.startswith(PNG_SIGNATURE)
    assert len(set(ex.frames)) == 4  # distinct values drew distinct frames


def test_fallback_two_parameters_one_frame_per_pair():
    draw = Recorder()
    ex = explore("temperature", [0.5, 1.0, 2.0], draw, name2="head", values2=[0, 1], dpi=DPI)
    pairs = [(t, h) for t in [0.5, 1.0, 2.0] for h in [0, 1]]
    assert draw.calls == pairs  # row-major: frame index = i1 * len(values2) + i2
    page = Tags(ex.to_html())
    frames = page.find("img", "afs-frame")
    assert len(frames) == 6 == len(ex.frames)
    assert [f["data-label"] for f in frames] == [
        f"temperature = {t:g}, head = {h}" for t, h in pairs
    ]
    sliders = page.find("input", "afs-slider")
    assert [(s["data-param"], s["max"]) for s in sliders] == [("temperature", "2"), ("head", "1")]
    assert page.label_text == "temperature = 0.5, head = 0"
    assert repr(ex) == "SliderExplorer(temperature x head: 3 x 2 = 6 frames)"


def test_fallback_is_self_contained_and_deterministic():
    w = torch.softmax(torch.randn(4, 4, generator=torch.Generator().manual_seed(0)), -1)

    def draw(t):
        return attention_heatmap(
            w ** (1 / t) / (w ** (1 / t)).sum(-1, keepdim=True), list("abcd"), list("abcd")
        )

    html1 = explore("temperature", [0.5, 1, 2], draw, dpi=DPI).to_html()
    html2 = explore("temperature", [0.5, 1, 2], draw, dpi=DPI).to_html()
    assert html1 == html2
    # base64 text could contain "http" by chance: look at everything else
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "data:image/png;base64,X", html1)
    assert "http" not in text and "//" not in text.replace("://", "")
    assert "<script" not in text and "<link" not in text and " id=" not in text
    assert "src=" in text and all(
        s == "data:image/png;base64,X" for s in re.findall(r'src="([^"]*)"', text)
    )


def test_mimebundle_has_widget_view_html_and_plain():
    ex = explore("n", range(3), Recorder(), dpi=DPI)
    bundle = ex._repr_mimebundle_()
    assert set(bundle) == {WIDGET_VIEW_MIME, "text/html", "text/plain"}
    assert bundle[WIDGET_VIEW_MIME]["model_id"] == ex.widget.model_id
    # the same view data ipywidgets itself would display
    assert bundle[WIDGET_VIEW_MIME] == ex.widget._repr_mimebundle_()[WIDGET_VIEW_MIME]
    assert bundle["text/html"] == ex.to_html()
    assert bundle["text/plain"] == repr(ex) == "SliderExplorer(n: 3 frames)"
    # displaying twice shows the same live widget (one model, two views)
    assert ex._repr_mimebundle_()[WIDGET_VIEW_MIME]["model_id"] == ex.widget.model_id


def _live_parts(ex: SliderExplorer):
    box = ex.widget
    sliders = [c for c in box.children if isinstance(c, widgets.SelectionSlider)]
    (label,) = [c for c in box.children if isinstance(c, widgets.Label)]
    (image,) = [c for c in box.children if isinstance(c, widgets.Image)]
    return sliders, label, image


def test_live_slider_move_redraws_with_the_new_value():
    draw = Recorder()
    values = [0.25, 0.5, 1.0, 2.0]
    ex = explore("temperature", values, draw, dpi=DPI)
    (slider,), label, image = _live_parts(ex)
    assert slider.description == "temperature"
    assert image.value == ex.frames[0] and label.value == "temperature = 0.25"
    before = image.value
    draw.calls.clear()
    slider.value = 2  # what the front end does when the reader moves the slider
    assert draw.calls == [(1.0,)]
    assert image.value != before and bytes(image.value).startswith(PNG_SIGNATURE)
    assert image.value == ex.frames[2]  # same drawing as the pre-rendered frame
    assert label.value == "temperature = 1"
    assert ex.redraw_count == 1 and ex.last_redraw_seconds is not None
    slider.value = 0
    assert draw.calls[-1] == (0.25,) and image.value == before


def test_live_second_slider_redraws_with_both_values():
    draw = Recorder()
    ex = explore(
        "temperature", [0.5, 1.0], draw, name2="layer", values2=["enc0", "enc1", "enc2"], dpi=DPI
    )
    (s1, s2), label, image = _live_parts(ex)
    draw.calls.clear()
    s2.value = 2
    assert draw.calls == [(0.5, "enc2")] and label.value == "temperature = 0.5, layer = enc2"
    s1.value = 1
    assert draw.calls[-1] == (1.0, "enc2") and image.value == ex.frames[1 * 3 + 2]


def test_live_draw_error_is_shown_and_raised():
    state = {"fail": False}  # the live redraw calls draw again: state may have changed

    def draw(v):
        if state["fail"]:
            raise RuntimeError("boom")
        return Recorder()(v)

    ex = explore("k", [1, 2], draw, dpi=DPI)
    (slider,), label, image = _live_parts(ex)
    state["fail"] = True
    with pytest.raises(RuntimeError, match="boom"):
        slider.value = 1
    assert label.value == "k = 2: draw failed: RuntimeError: boom"
    assert image.value == ex.frames[0] and ex.redraw_count == 0


def test_frame_budget_raises_before_drawing():
    draw = Recorder()
    with pytest.raises(ValueError, match="max_frames"):
        explore("i", range(65), draw)
    with pytest.raises(ValueError, match="72 frames"):  # 9 values x 8 values
        explore("a", range(9), draw, name2="b", values2=range(8))
    with pytest.raises(ValueError, match="max_frames"):
        explore("i", range(4), draw, max_frames=3)
    assert draw.calls == []


def test_html_size_budget_raises_with_size():
    with pytest.raises(ValueError, match=r"[\d,]+ bytes"):
        explore("i", range(3), Recorder(), dpi=DPI, max_html_bytes=1000)


def test_figures_are_closed_and_axes_are_accepted():
    ex = explore("t", [1, 2], lambda t: attention_heatmap(torch.eye(3) / t), dpi=DPI)
    assert len(ex.frames) == 2 and plt.get_fignums() == []


def test_figures_opened_by_a_failing_draw_are_closed():
    def draw(v):
        plt.figure()
        if v == 2:
            raise RuntimeError("draw broke")
        return None

    with pytest.raises(TypeError, match="returned NoneType"):
        explore("v", [1, 2], draw, dpi=DPI)
    assert plt.get_fignums() == []
    with pytest.raises(RuntimeError, match="draw broke"):
        explore("v", [2], draw, dpi=DPI)
    assert plt.get_fignums() == []


def test_tensor_and_array_values_become_python_numbers():
    draw = Recorder()
    explore("t", torch.tensor([0.5, 2.0]), draw, dpi=DPI)
    explore("t", np.array([1, 3]), draw, dpi=DPI)
    assert draw.calls == [(0.5,), (2.0,), (1,), (3,)]
    assert all(type(c[0]) in (float, int) for c in draw.calls)


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "pattern"),
    [
        (("t", [], Recorder()), {}, ValueError, "values"),
        (("t", "abc", Recorder()), {}, TypeError, "values"),
        (("t", {1, 2}, Recorder()), {}, TypeError, "values"),
        (("t", [1, 2, 1], Recorder()), {}, ValueError, "distinct"),
        (("", [1], Recorder()), {}, ValueError, "name"),
        ((3, [1], Recorder()), {}, TypeError, "name"),
        (
            ("t", [1], Recorder()),
            {"max_frames": 2.5},
            TypeError,
            "max_frames",
        ),
        (
            ("t", [1], Recorder()),
            {"max_html_bytes": True},
            TypeError,
            "max_html_bytes",
        ),
        (
            ("t", [1], Recorder()),
            {"dpi": "72"},
            TypeError,
            "dpi",
        ),
        (("t", [1], "not callable"), {}, TypeError, "draw"),
        (("t", [1], Recorder()), {"name2": "u"}, ValueError, "name2"),
        (("t", [1], Recorder()), {"values2": [1]}, ValueError, "name2"),
        (
            ("t", [1], Recorder()),
            {"name2": "t", "values2": [1]},
            ValueError,
            "name2",
        ),
        (("t", [1], Recorder()), {"max_frames": 0}, ValueError, "max_frames"),
        (
            ("t", [1], Recorder()),
            {"dpi": 0},
            ValueError,
            "dpi",
        ),
        (
            ("t", [1], lambda v: None),
            {},
            TypeError,
            "draw",
        ),
        (
            ("t", torch.zeros(2, 2), Recorder()),
            {},
            ValueError,
            "1-D",
        ),
    ],
)
def test_explore_rejects_bad_input(args, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        explore(*args, **kwargs)


def test_inline_script_needs_no_escaping_in_a_double_quoted_attribute():
    # The handler is written verbatim into oninput="...": a quote, an ampersand or
    # a "<" would break the attribute or be read as markup.
    assert not set(_ONINPUT_JS) & {'"', "&", "<"}


# ----------------------------------------------------- start frame, labels, colour bar, k / N
def test_start_opens_on_the_given_value_in_both_forms():
    ex = explore("dₖ", [1, 4, 16, 64], Recorder(), dpi=DPI, start=16)
    assert ex.start == (2,)
    tags = Tags(ex.to_html())
    (slider,) = tags.find("input", "afs-slider")
    assert slider["value"] == "2"
    shown = [f for f in tags.find("img", "afs-frame") if "display:none" not in f["style"]]
    assert [f["data-index"] for f in shown] == ["2"]
    assert tags.label_text == "dₖ = 16"
    (live,), label, image = _live_parts(ex)
    assert live.value == 2 and label.value == "dₖ = 16" and image.value == ex.frames[2]


def test_start2_and_the_row_major_frame():
    ex = explore(
        "a", [0, 1], Recorder(), name2="b", values2=["x", "y", "z"], dpi=DPI, start=1, start2="z"
    )
    assert ex.start == (1, 2)
    shown = [
        f for f in Tags(ex.to_html()).find("img", "afs-frame") if "display:none" not in f["style"]
    ]
    assert [f["data-index"] for f in shown] == ["5"]  # 1 * 3 + 2


def test_position_reads_k_of_n_and_follows_the_slider():
    ex = explore("n", range(5), Recorder(), dpi=DPI, start=3)
    html = ex.to_html()
    assert '<span class="afs-position">4 / 5</span>' in html
    assert "afs-position" in _ONINPUT_JS and "' / '" in _ONINPUT_JS
    (slider,), _, _ = _live_parts(ex)
    assert slider.readout and [o for o, _ in slider.options] == [f"{k} / 5" for k in range(1, 6)]


def test_slider_has_a_touch_sized_styled_track():
    html = explore("n", range(2), Recorder(), dpi=DPI).to_html()
    style = re.search(r"<style>(.*?)</style>", html).group(1)
    height = re.search(r"input\.afs-slider\{[^}]*height:(\d+)px", style)
    assert height and int(height.group(1)) >= 24  # WCAG 2.5.8 target size
    assert "accent-color" in style and ".afs-explorer " in style  # styled, scoped


def test_label_function_names_frames_as_the_prose_does():
    ex = explore(
        "layer_head",
        ["l1h1", "l1h2"],
        Recorder(),
        name2="string",
        values2=[0, 1],
        dpi=DPI,
        label=lambda lh, s: f"{lh}, string {s}",
    )
    assert ex.frame_labels == [
        "l1h1, string 0",
        "l1h1, string 1",
        "l1h2, string 0",
        "l1h2, string 1",
    ]
    assert Tags(ex.to_html()).label_text == "l1h1, string 0"


def test_colorbar_is_added_to_every_frame():
    seen = []

    def draw(t):
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.imshow(np.eye(3) * t, vmin=0, vmax=2)
        seen.append(fig)
        return fig

    ex = explore("t", [1, 2], draw, dpi=DPI, colorbar="weight")
    assert all(len(fig.axes) == 2 for fig in seen)  # the panel and its colour bar
    assert seen[0].axes[1].get_ylabel() == "weight"
    assert len(ex.frames) == 2


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        (
            {"start": 5},
            ValueError,
            "start",
        ),
        ({"start2": 0}, ValueError, "start2"),
        ({"label": "x"}, TypeError, "label"),
        (
            {"label": lambda v: None},
            TypeError,
            "label",
        ),
        ({"colorbar": 1}, TypeError, "colorbar"),
    ],
)
def test_bad_start_label_and_colorbar(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        explore("n", range(3), Recorder(), dpi=DPI, **kwargs)


def test_colorbar_needs_an_image():
    def draw(t):
        fig, ax = plt.subplots(figsize=(1, 1))
        ax.plot([0, t])
        return fig

    with pytest.raises(ValueError, match="colour-mapped"):
        explore("t", [1, 2], draw, dpi=DPI, colorbar="w")
