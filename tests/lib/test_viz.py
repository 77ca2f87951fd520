"""Tests for attention_lib.show.viz: heatmaps show exactly the weights, labelled by tokens."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attention_lib import attention_grid, attention_heatmap  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _weights(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(*shape, generator=g), dim=-1)


def _tick_texts(labels) -> list[str]:
    return [t.get_text() for t in labels]


def _colorbar_axes(fig) -> list:
    return [a for a in fig.axes if a.get_label() == "<colorbar>"]


def test_heatmap_image_is_the_weights_and_ticks_are_the_tokens():
    w = _weights(5, 7)  # (Lq, Lk)
    q = ["a", "b", "c", "d", "e"]
    k = ["k0", "k1", "k2", "k3", "k4", "k5", "k6"]
    ax = attention_heatmap(w, q, k, title="demo")
    image = ax.images[0]
    np.testing.assert_array_equal(np.asarray(image.get_array()), w.numpy())
    assert _tick_texts(ax.get_xticklabels()) == k  # keys are columns
    assert _tick_texts(ax.get_yticklabels()) == q  # queries are rows
    assert list(ax.get_xticks()) == list(range(7))
    assert list(ax.get_yticks()) == list(range(5))
    assert image.get_clim() == (0.0, 1.0)
    assert ax.get_title() == "demo"
    assert ax.get_xlabel() == "keys" and ax.get_ylabel() == "queries"
    assert len(_colorbar_axes(ax.figure)) == 1


def test_heatmap_rows_are_queries_not_transposed():
    w = torch.zeros(2, 3)
    w[1, 2] = 1.0  # query 1 attends only to key 2
    ax = attention_heatmap(w, ["q0", "q1"], ["k0", "k1", "k2"])
    arr = np.asarray(ax.images[0].get_array())
    assert arr.shape == (2, 3) and arr[1, 2] == 1.0 and arr.sum() == 1.0


def test_heatmap_accepts_grad_and_non_float32_tensors():
    w = _weights(4, 4).double().requires_grad_()
    ax = attention_heatmap(w * 1.0)  # non-leaf tensor that requires grad
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), w.detach().numpy(), rtol=1e-6)
    ax2 = attention_heatmap(_weights(3, 3).to(torch.bfloat16))
    assert np.asarray(ax2.images[0].get_array()).dtype == np.float32
    ax3 = attention_heatmap(torch.ones(3, 3, dtype=torch.bool).tril())  # a keep-mask
    np.testing.assert_array_equal(np.asarray(ax3.images[0].get_array()), np.tril(np.ones((3, 3))))
    ax4 = attention_heatmap(_weights(2, 2).numpy())
    assert np.asarray(ax4.images[0].get_array()).shape == (2, 2)


def test_heatmap_without_tokens_uses_positions():
    ax = attention_heatmap(_weights(3, 4))
    assert _tick_texts(ax.get_xticklabels()) == ["0", "1", "2", "3"]
    assert _tick_texts(ax.get_yticklabels()) == ["0", "1", "2"]


@pytest.mark.parametrize(
    ("side", "annotate", "expected"), [(8, None, 64), (9, None, 0), (9, True, 81), (3, False, 0)]
)
def test_heatmap_annotations(side, annotate, expected):
    w = _weights(side, side)
    ax = attention_heatmap(w, annotate=annotate, colorbar=False)
    texts = ax.texts
    assert len(texts) == expected
    if expected:
        assert [t.get_text() for t in texts] == [f"{v:.2f}" for v in w.flatten().tolist()]
    assert not _colorbar_axes(ax.figure)


def test_heatmap_draws_on_given_axes():
    fig, (a1, a2) = plt.subplots(1, 2)
    out = attention_heatmap(_weights(3, 3), ax=a2, colorbar=False)
    assert out is a2 and len(a2.images) == 1 and not a1.images


def test_heatmap_nan_is_shown_not_rejected():
    w = _weights(3, 3)
    w[1] = float("nan")  # e.g. a fully masked row of a naive softmax
    arr = np.asarray(attention_heatmap(w).images[0].get_array())
    assert np.isnan(arr[1]).all() and np.isfinite(arr[[0, 2]]).all()


def test_heatmap_custom_scale_for_scores():
    scores = torch.tensor([[-2.0, 3.0], [0.5, 1.0]])
    with pytest.raises(ValueError, match="vmin"):
        attention_heatmap(scores)
    ax = attention_heatmap(scores, vmin=-3, vmax=3)
    assert ax.images[0].get_clim() == (-3.0, 3.0)


@pytest.mark.parametrize(
    ("weights", "kwargs", "exc", "pattern"),
    [
        (
            _weights(2, 3, 3),
            {},
            ValueError,
            "attention_grid",
        ),
        (_weights(4), {}, ValueError, "shape"),
        (torch.zeros(0, 3), {}, ValueError, "empty"),
        ([[0.5, 0.5]], {}, TypeError, "weights"),
        (
            _weights(2, 3),
            {"key_tokens": ["a", "b"]},
            ValueError,
            "key_tokens",
        ),
        (
            _weights(2, 3),
            {"query_tokens": ["a"]},
            ValueError,
            "query_tokens",
        ),
        (
            _weights(2, 2),
            {"query_tokens": "ab"},
            TypeError,
            "query_tokens",
        ),
        (_weights(2, 2), {"vmin": 1.0, "vmax": 0.0}, ValueError, "vmin"),
        (torch.ones(2, 2, dtype=torch.complex64), {}, TypeError, "real-valued"),
        (
            _weights(2, 2),
            {"cmap": "no-such-map"},
            ValueError,
            "cmap",
        ),
        (
            _weights(2, 2),
            {"fmt": "%d"},
            ValueError,
            "fmt",
        ),
        # wrong type -> TypeError, wrong value -> ValueError
        (_weights(2, 2), {"cmap": 3}, TypeError, "cmap"),
        (_weights(2, 2), {"fmt": None}, TypeError, "fmt"),
        (_weights(2, 2), {"vmin": "0"}, TypeError, "vmin"),
        (
            _weights(2, 2),
            {"vmax": float("nan")},
            ValueError,
            "vmax",
        ),
        (_weights(2, 2), {"annotate": 1}, TypeError, "annotate"),
        (_weights(2, 2), {"colorbar": "yes"}, TypeError, "colorbar"),
    ],
)
def test_heatmap_rejects_bad_input(weights, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        attention_heatmap(weights, **kwargs)
    assert plt.get_fignums() == []  # rejected before any figure was opened


def test_grid_three_d_one_panel_per_head_shared_scale():
    w = _weights(3, 4, 5)  # (H, Lq, Lk)
    q, k = list("abcd"), list("vwxyz")
    fig = attention_grid(w, q, k)
    panels = [a for a in fig.axes if a.images]
    assert [a.get_title() for a in panels] == ["head 0", "head 1", "head 2"]
    for h, ax in enumerate(panels):
        np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), w[h].numpy())
        assert ax.images[0].get_clim() == (0.0, 1.0)
    assert len(_colorbar_axes(fig)) == 1  # one shared colourbar
    assert _tick_texts(panels[0].get_yticklabels()) == q
    assert _tick_texts(panels[2].get_xticklabels()) == k
    # shared labels: only the first column shows query labels
    assert not panels[1].yaxis.get_tick_params()["labelleft"]


def test_grid_four_d_layers_by_heads_and_custom_titles():
    w = _weights(2, 3, 4, 4)  # (layers, H, Lq, Lk)
    fig = attention_grid(w)
    titles = [a.get_title() for a in fig.axes if a.images]
    assert titles == [f"layer {l}, head {h}" for l in range(2) for h in range(3)]
    panels = [a for a in fig.axes if a.images]
    np.testing.assert_array_equal(np.asarray(panels[4].images[0].get_array()), w[1, 1].numpy())
    fig2 = attention_grid(w, row_titles=["enc 1", "enc 2"], col_titles=["h-a", "h-b", "h-c"])
    assert [a.get_title() for a in fig2.axes if a.images][-1] == "enc 2, h-c"


def test_grid_wraps_heads_and_hides_unused_cells():
    fig = attention_grid(_weights(5, 3, 3), max_cols=3, colorbar=False)
    grid_axes = [a for a in fig.axes if a.get_label() != "<colorbar>"]
    assert len(grid_axes) == 6 and sum(a.get_visible() for a in grid_axes) == 5
    assert sum(bool(a.images) for a in grid_axes) == 5


@pytest.mark.parametrize(
    ("weights", "kwargs", "pattern"),
    [
        (_weights(3, 3), {}, "2-D"),
        (_weights(2, 3, 3), {"row_titles": ["x", "y"]}, "row_titles"),
        (
            _weights(2, 3, 3),
            {"col_titles": ["only one"]},
            "col_titles",
        ),
        (_weights(2, 2, 3, 3), {"row_titles": ["a"]}, "row_titles"),
        (_weights(2, 3, 3), {"key_tokens": ["a"]}, "key_tokens"),
        (_weights(2, 3, 3), {"max_cols": 0}, "max_cols"),
        (_weights(2, 3, 3) * 2, {}, "colour scale"),
        (_weights(2, 3, 3), {"cmap": "nope"}, "cmap"),
    ],
)
def test_grid_rejects_bad_input(weights, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        attention_grid(weights, **kwargs)
    assert plt.get_fignums() == []


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"max_cols": True}, "max_cols"),
        ({"max_cols": 2.0}, "max_cols"),
        ({"panel_size": "2"}, "panel_size"),
        ({"cmap": None}, "cmap"),
    ],
)
def test_grid_rejects_wrong_types_with_type_error(kwargs, pattern):
    with pytest.raises(TypeError, match=pattern):
        attention_grid(_weights(2, 3, 3), **kwargs)
    assert plt.get_fignums() == []


def test_grid_accepts_numpy_integers():
    fig = attention_grid(_weights(6, 3, 3), max_cols=np.int64(3), colorbar=False)
    assert sum(bool(a.images) for a in fig.axes) == 6
