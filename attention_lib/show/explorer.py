"""Slider explorers that work in every reading mode of the book.

``explore(name, values, draw)`` turns a function that draws a matplotlib figure
for one parameter value into a slider. The returned :class:`SliderExplorer`
displays as ONE output whose MIME bundle carries two forms of the same slider:

- ``application/vnd.jupyter.widget-view+json``: a live ipywidgets view (a slider
  per parameter, a ``name = value`` label and an ``ipywidgets.Image``). Where a
  kernel runs (JupyterLab, Binder, Colab) the front end prefers this form, and
  every slider move calls ``draw`` again and replaces the image's PNG bytes.
- ``text/html``: a kernel-free slider. Every frame is pre-rendered to an inline
  base64 PNG; an ``<input type="range">`` per parameter and a few lines of inline
  JavaScript show one frame at a time and update the ``name = value`` label. No
  CDN, no external URL, no random ids: the same input gives the same HTML. The
  built HTML book is configured (myst-nb ``nb_mime_priority_overrides``) to drop
  the widget view, so it renders this form.
- ``text/plain``: a short deterministic summary.

Why not ``ipywidgets.interact``? Its Output widget shows nothing without a kernel
(so the built book would show a blank), its JavaScript comes from a CDN, and
nbval cannot replay Output-widget messages.

All frames are rendered when the explorer is *created*, not when it is
displayed: errors in ``draw`` and an exceeded frame budget then raise in the
notebook cell, instead of being printed (and swallowed) by IPython's display
formatter.
"""

from __future__ import annotations

import base64
import html
import io
import numbers
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..validation import check_instance, check_int, check_real
from .style import DPI, book_style, smallest_font_pt

if TYPE_CHECKING:  # pragma: no cover - imported lazily at run time
    import ipywidgets
    from matplotlib.figure import Figure


#: MIME type of an ipywidgets view; the HTML book build gives it priority ``null``.
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
#: Default resolution of the frames: the book's (attention_lib.show.style.DPI).
DEFAULT_DPI = DPI

# The kernel-free slider's only script: an inline ``oninput`` handler that finds
# its own explorer by relative DOM navigation (so several explorers on one page
# never interfere), turns the slider positions into a frame index (row-major over
# the parameters, like the frame list) and shows that frame and its label.
_ONINPUT_JS = (
    "var r=this.closest('.afs-explorer'),i=0;"
    "r.querySelectorAll('input.afs-slider').forEach(function(s){i=i*(+s.max+1)+(+s.value);});"
    "r.querySelectorAll('img.afs-frame').forEach(function(f){var on=+f.dataset.index===i;"
    "f.style.display=on?'':'none';"
    "if(on){r.querySelector('.afs-label').textContent=f.dataset.label;}});"
    "var p=this.parentNode.querySelector('.afs-position');"
    "p.textContent=(+this.value+1)+' / '+(+this.max+1);"
)

# The kernel-free slider's look: a track of the page's width (up to 24em), a thumb and a
# touch target of at least 28 px (WCAG 2.5.8 asks for 24), and the "k / N" position.
# Scoped to .afs-explorer; written once per explorer, so that it also works outside the
# book (JupyterLab, nbviewer) where the book's CSS is absent.
_STYLE = (
    "<style>"
    ".afs-explorer .afs-control{display:flex;flex-wrap:wrap;align-items:center;"
    "gap:0.25em 0.75em;margin:0.25em 0}"
    ".afs-explorer .afs-name{font-weight:600}"
    ".afs-explorer input.afs-slider{flex:1 1 12em;max-width:24em;min-width:8em;height:28px;"
    "margin:0;accent-color:#2a6fbb;cursor:pointer;touch-action:pan-y}"
    ".afs-explorer input.afs-slider:focus-visible{outline:2px solid #2a6fbb;"
    "outline-offset:2px}"
    ".afs-explorer .afs-position{font-variant-numeric:tabular-nums;min-width:4.5em;"
    "color:#555}"
    ".afs-explorer .afs-label{font-family:monospace;margin:0.3em 0}"
    ".afs-explorer img.afs-frame{max-width:100%;height:auto}"
    "</style>"
)


def _format_value(value: Any) -> str:
    """Short, deterministic text for a parameter value (the slider label)."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return f"{float(value):.6g}"
    return str(value)


def _normalise_values(values: Any, arg: str, name: str) -> list[Any]:
    """A non-empty list of distinct values; 0-d tensors/arrays become Python scalars."""
    array = hasattr(values, "tolist") and not isinstance(values, Sequence)
    if isinstance(values, (str, bytes)) or not (array or isinstance(values, Sequence)):
        raise TypeError(f"{arg} must be a sequence or 1-D array, got {type(values).__name__}")
    if array and getattr(values, "ndim", 1) != 1:
        raise ValueError(f"{arg} must be 1-D, got shape {tuple(getattr(values, 'shape', ()))}")
    if array:
        items = list(values.tolist())
    else:
        items = [
            v.item() if hasattr(v, "item") and getattr(v, "ndim", None) == 0 else v for v in values
        ]
    labels = [_format_value(v) for v in items]
    if not labels or len(set(labels)) < len(labels):
        raise ValueError(f"{arg} must be one or more distinct values for {name!r}, got {labels}")
    return items


def _check_name(name: Any, arg: str) -> str:
    check_instance(arg, name, str, "a non-empty str (the parameter's name)")
    if not name.strip():
        raise ValueError(f"{arg} must be a non-empty str (the parameter's name), got {name!r}")
    return name


def _as_figure(obj: Any, call: str) -> Figure:
    """Accept a Figure (or an Axes, whose figure is used) returned by ``draw``."""
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    if isinstance(obj, Axes):
        try:
            obj = obj.get_figure(root=True)  # matplotlib >= 3.10 (never a SubFigure)
        except TypeError:
            obj = obj.get_figure()
    if not isinstance(obj, Figure):
        raise TypeError(f"draw must return a Figure or Axes; {call} returned {type(obj).__name__}")
    return obj


def _start_index(start: Any, values: list[Any], arg: str, name: str) -> int:
    """Position of the value ``start`` among ``values`` (0 for ``None``)."""
    if start is None:
        return 0
    if hasattr(start, "item") and getattr(start, "ndim", None) == 0:
        start = start.item()
    wanted = _format_value(start)
    labels = [_format_value(v) for v in values]
    if wanted not in labels:
        raise ValueError(f"{arg} must be one of the values of {name!r} {labels}, got {start!r}")
    return labels.index(wanted)


def _add_colorbar(fig: Figure, label: str, call: str) -> None:
    """A colour bar for the first image (or colour-mapped collection) of ``fig``."""
    mappables = [
        m for ax in fig.axes for m in [*ax.images, *ax.collections] if m.get_array() is not None
    ]
    if not mappables:
        raise ValueError(f"colorbar={label!r} needs a colour-mapped image; {call} drew none")
    fig.colorbar(mappables[0], ax=fig.axes, label=label, shrink=0.9)


def _smallest_font_or_none(fig: Figure) -> float | None:
    try:
        return smallest_font_pt(fig, draw=False)
    except ValueError:  # a figure without any text
        return None


def _png_bytes(fig: Figure, dpi: float) -> bytes:
    """The PNG of ``fig`` without metadata (no software version): the bytes depend only
    on the figure, the dpi and the local rendering libraries."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def _palette_png(png: bytes) -> bytes:
    """``png`` with at most 256 colours (on white): about a third of the bytes of a
    plot's full-colour PNG, and the same picture to the eye. The kernel-free slider
    inlines every frame in the page, so this is most of a chapter's weight."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        dpi = image.info.get("dpi")
        rgba = image.convert("RGBA")
    flat = Image.new("RGBA", rgba.size, "white")
    flat.alpha_composite(rgba)
    palette = flat.convert("RGB").quantize(
        256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE
    )
    out = io.BytesIO()
    palette.save(out, format="png", optimize=True, **({"dpi": dpi} if dpi else {}))
    return out.getvalue()


class SliderExplorer:
    """A slider over one or two parameters that redraws a matplotlib figure.

    What :func:`explore` returns (chapter 1 is the first to use it); create it with
    :func:`explore`. See the module docstring for the display forms.

    Attributes:
        names: the parameter names, ``(name,)`` or ``(name, name2)``.
        values: the parameter values, one list per parameter.
        frame_labels: ``"name = value"`` (``"name = v1, name2 = v2"``, or the
            ``label`` function's text) per frame, row-major: frame
            ``i1 * len(values2) + i2``.
        frames: the pre-rendered PNG bytes, in the same order.
        start: the slider positions shown first, one index per parameter.
        smallest_font_pt: the smallest font in any frame, in points.
        redraw_count: live redraws done so far (slider moves).
        last_redraw_seconds: wall time of the last live redraw (draw + PNG).
    """

    def __init__(
        self,
        name: str,
        values: Sequence[Any],
        draw: Callable[..., Any],
        *,
        name2: str | None = None,
        values2: Sequence[Any] | None = None,
        max_frames: int = 64,
        max_html_bytes: int = 1_000_000,
        dpi: float = DEFAULT_DPI,
        start: Any = None,
        start2: Any = None,
        label: Callable[..., str] | None = None,
        colorbar: str | None = None,
    ) -> None:
        names = [_check_name(name, "name")]
        all_values = [_normalise_values(values, "values", name)]
        if (name2 is None) != (values2 is None):
            raise ValueError(
                f"name2 and values2 go together, got only {'values2' if name2 is None else 'name2'}"
            )
        if name2 is not None:
            names.append(_check_name(name2, "name2"))
            if name2 == name:
                raise ValueError(f"name2 must differ from name, both are {name!r}")
            all_values.append(_normalise_values(values2, "values2", name2))
        elif start2 is not None:
            raise ValueError("start2 needs a second slider (name2 and values2)")
        check_instance("draw", draw, Callable, "callable")
        check_instance("label", label, (Callable, type(None)), "callable (values -> str) or None")
        check_instance("colorbar", colorbar, (str, type(None)), "a str (the bar's label) or None")
        max_frames = check_int("max_frames", max_frames, minimum=1)
        max_html_bytes = check_int("max_html_bytes", max_html_bytes, minimum=1)
        dpi = check_real("dpi", dpi, at_least=10, at_most=300)

        self.names: tuple[str, ...] = tuple(names)
        self.values: tuple[list[Any], ...] = tuple(all_values)
        self.draw = draw
        self.dpi = dpi
        self.colorbar = colorbar
        self._label_fn = label
        self.start: tuple[int, ...] = tuple(
            _start_index(s, vals, arg, nm)
            for s, vals, arg, nm in zip((start, start2), all_values, ("start", "start2"), names)
        )
        self._shape = tuple(len(v) for v in all_values)
        n_frames = 1
        for n in self._shape:
            n_frames *= n
        if n_frames > max_frames:  # every frame is a PNG inside the page
            raise ValueError(f"{n_frames} frames exceed max_frames={max_frames}")

        self.frame_labels: list[str] = [self._label(idx) for idx in self._indices()]
        rendered = [self._render(idx, measure=True) for idx in self._indices()]
        self.frames: list[bytes] = [png for png, _ in rendered]
        # the smallest font (points) in any pre-rendered frame (attention_lib.show.style)
        self.smallest_font_pt: float | None = min(
            (pt for _, pt in rendered if pt is not None), default=None
        )
        self._html = self._build_html()
        size = len(self._html.encode("utf-8"))
        if size > max_html_bytes:  # fewer values, a smaller figure or a lower dpi help
            raise ValueError(f"{size:,} bytes of HTML exceed max_html_bytes={max_html_bytes:,}")
        self.redraw_count = 0
        self.last_redraw_seconds: float | None = None
        self._widget: ipywidgets.VBox | None = None

    # ------------------------------------------------------------------ frames
    def _indices(self) -> list[tuple[int, ...]]:
        if len(self._shape) == 1:
            return [(i,) for i in range(self._shape[0])]
        return [(i, j) for i in range(self._shape[0]) for j in range(self._shape[1])]

    def _index(self, idx: tuple[int, ...]) -> int:
        """Row-major frame number of the slider positions ``idx``."""
        return idx[0] * self._shape[1] + idx[1] if len(idx) == 2 else idx[0]

    def _label(self, idx: tuple[int, ...]) -> str:
        args = tuple(vals[i] for vals, i in zip(self.values, idx))
        if self._label_fn is None:
            return ", ".join(f"{nm} = {_format_value(v)}" for nm, v in zip(self.names, args))
        text = self._label_fn(*args)
        if not isinstance(text, str) or not text.strip():
            raise TypeError(f"label must return a non-empty str, got {text!r} for values {args}")
        return text

    def _render(self, idx: tuple[int, ...], measure: bool = False) -> tuple[bytes, float | None]:
        """Call ``draw`` for the values at ``idx`` (in the book's figure style) and return
        the figure as a 256-colour PNG (live redraws give the same bytes as the
        pre-rendered frames), with its smallest font in points if ``measure``."""
        import matplotlib.pyplot as plt

        args = tuple(vals[i] for vals, i in zip(self.values, idx))
        call = f"draw({', '.join(repr(a) for a in args)})"
        before = set(plt.get_fignums())
        fig = None
        try:
            with book_style():
                fig = _as_figure(self.draw(*args), call)
                if self.colorbar is not None:
                    _add_colorbar(fig, self.colorbar, call)
                png = _palette_png(_png_bytes(fig, self.dpi))
                # savefig drew every text (tick labels too): measure without redrawing
                return png, _smallest_font_or_none(fig) if measure else None
        finally:
            if fig is not None:  # shown as a PNG: never by the inline backend
                plt.close(fig)
            # Figures that draw opened and did not return (or opened before it
            # failed) would otherwise be shown by the inline backend later.
            for num in set(plt.get_fignums()) - before:
                plt.close(num)

    # --------------------------------------------------------- kernel-free HTML
    def _build_html(self) -> str:
        esc = html.escape
        controls = []
        for nm, n, at in zip(self.names, self._shape, self.start):
            controls.append(
                f'<label class="afs-control"><span class="afs-name">{esc(nm)}</span>'
                f'<input type="range" class="afs-slider" data-param="{esc(nm)}" min="0" '
                f'max="{n - 1}" step="1" value="{at}" aria-label="{esc(nm)}" '
                f'oninput="{_ONINPUT_JS}">'
                f'<span class="afs-position">{at + 1} / {n}</span></label>'
            )
        shown = self._index(self.start)
        frames = []
        for k, (label, png) in enumerate(zip(self.frame_labels, self.frames)):
            hidden = "" if k == shown else "display:none"
            b64 = base64.b64encode(png).decode("ascii")
            frames.append(
                f'<img class="afs-frame" data-index="{k}" data-label="{esc(label)}" '
                f'alt="{esc(label)}" style="{hidden}" src="data:image/png;base64,{b64}">'
            )
        font = "" if self.smallest_font_pt is None else f"{self.smallest_font_pt:g}"
        return (
            f'<div class="afs-explorer" data-frames="{len(self.frames)}" '
            f'data-smallest-font-pt="{font}" style="margin:0.5em 0">{_STYLE}\n'
            f'<div class="afs-controls">{"".join(controls)}</div>\n'
            '<div class="afs-label" aria-live="polite">'
            f"{esc(self.frame_labels[shown])}</div>\n"
            '<div class="afs-frames">\n' + "\n".join(frames) + "\n</div>\n</div>"
        )

    def to_html(self) -> str:
        """The kernel-free slider: self-contained, deterministic HTML."""
        return self._html

    # ------------------------------------------------------------- live widget
    @property
    def widget(self) -> ipywidgets.VBox:
        """The live ipywidgets view (created on first use, then reused)."""
        if self._widget is None:
            self._widget = self._build_widget()
        return self._widget

    def _build_widget(self) -> ipywidgets.VBox:
        import ipywidgets as w

        # one description width for all sliders, so that their tracks line up
        width = f"{0.6 * max(len(nm) for nm in self.names) + 0.5:.1f}em"
        self._sliders = [
            w.SelectionSlider(
                # the readout shows the position, "k / N"; the label, the value
                options=[(f"{i + 1} / {len(vals)}", i) for i in range(len(vals))],
                value=at,
                description=nm,
                readout=True,
                continuous_update=True,
                style={"description_width": width, "handle_color": "#2a6fbb"},
                layout=w.Layout(width="420px", max_width="100%", height="32px"),
            )
            for nm, vals, at in zip(self.names, self.values, self.start)
        ]
        shown = self._index(self.start)
        self._label_widget = w.Label(value=self.frame_labels[shown])
        self._image = w.Image(
            value=self.frames[shown], format="png", layout=w.Layout(max_width="100%")
        )
        for slider in self._sliders:
            slider.observe(self._on_slider, names="value")
        # flex-start: children keep their natural width (the default "stretch"
        # would scale the PNG up to the notebook's width and blur it)
        box = w.VBox(
            [*self._sliders, self._label_widget, self._image],
            layout=w.Layout(align_items="flex-start"),
        )
        box.add_class("afs-explorer-live")
        return box

    def _on_slider(self, change: dict[str, Any] | None = None) -> None:
        """Redraw for the sliders' current values (called on every slider move)."""
        idx = tuple(int(s.value) for s in self._sliders)
        label = self.frame_labels[self._index(idx)]
        start = time.perf_counter()
        try:
            png, _ = self._render(idx)
        except Exception as exc:
            # Shown in the widget: an exception in a widget callback would
            # otherwise only reach the kernel log.
            self._label_widget.value = f"{label}: draw failed: {type(exc).__name__}: {exc}"
            raise
        self._image.value = png
        self._label_widget.value = label
        self.last_redraw_seconds = time.perf_counter() - start
        self.redraw_count += 1

    # ----------------------------------------------------------------- display
    def __repr__(self) -> str:
        if len(self._shape) == 1:
            return f"SliderExplorer({self.names[0]}: {self._shape[0]} frames)"
        n1, n2 = self._shape
        return f"SliderExplorer({self.names[0]} x {self.names[1]}: {n1} x {n2} = {n1 * n2} frames)"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        # Written out rather than taken from the widget's own bundle, which
        # ipywidgets 7 (e.g. a Colab runtime) does not have.
        view = {"version_major": 2, "version_minor": 0, "model_id": self.widget.model_id}
        return {WIDGET_VIEW_MIME: view, "text/html": self._html, "text/plain": repr(self)}


def explore(
    name: str,
    values: Sequence[Any],
    draw: Callable[..., Any],
    *,
    name2: str | None = None,
    values2: Sequence[Any] | None = None,
    max_frames: int = 64,
    max_html_bytes: int = 1_000_000,
    dpi: float = DEFAULT_DPI,
    start: Any = None,
    start2: Any = None,
    label: Callable[..., str] | None = None,
    colorbar: str | None = None,
) -> SliderExplorer:
    """Make a slider that redraws a figure, live with a kernel and kernel-free in HTML.

    Explained in chapter 1, *Queries, keys and values*; used by every later chapter.

    Example::

        explore("temperature", [0.25, 0.5, 1, 2, 4],
                lambda t: attention_heatmap(torch.softmax(scores / t, -1)))

    Args:
        name: the parameter's name, shown as ``"name = value"``.
        values: the slider's values, in order (list, tuple, range, 1-D array or
            tensor; 0-d tensor items become Python numbers). Must be distinct.
        draw: ``draw(value)``, or ``draw(value, value2)`` with a second parameter,
            returns a matplotlib ``Figure`` (an ``Axes`` is accepted too, its
            figure is used). The explorer renders it to PNG and closes it.
        name2: name of an optional second parameter.
        values2: values of the second parameter (give both or neither).
        max_frames: frame budget: ``len(values) * len(values2)`` may not exceed it.
        max_html_bytes: size budget of the kernel-free HTML (all frames inline).
        dpi: resolution of every frame (live and pre-rendered); the book's
            ``attention_lib.show.style.DPI`` (96) by default.
        start: the value the slider shows first (default: the first one);
            choose an informative frame.
        start2: the same for the second slider.
        label: ``label(value)`` (or ``label(value, value2)``) returns the text
            shown above the frame, e.g. ``lambda d: f"dₖ = {d}"``; default
            ``"name = value"`` (``"name = v1, name2 = v2"``).
        colorbar: label of a colour bar added to every frame, for the first
            colour-mapped image of the figure (keep its ``vmin``/``vmax`` fixed
            across frames so that the bar means the same in all of them).

    Returns:
        A :class:`SliderExplorer`; display it (last expression of a cell).

    Raises:
        TypeError: a name is not a str, values are not a sequence, ``draw`` is
            not callable or does not return a Figure/Axes, ``max_frames`` or
            ``max_html_bytes`` is not an int, ``dpi`` is not a number, ``label``
            is not callable or returns no text, or ``colorbar`` is not a str.
        ValueError: an empty name, empty or repeated values, only one of
            ``name2``/``values2``, more frames than ``max_frames``, HTML larger
            than ``max_html_bytes``, a ``dpi`` outside ``[10, 300]``, a
            ``start``/``start2`` that is not one of the values (or ``start2``
            without a second slider), or ``colorbar`` for a figure without a
            colour-mapped image.
    """
    return SliderExplorer(
        name,
        values,
        draw,
        name2=name2,
        values2=values2,
        max_frames=max_frames,
        max_html_bytes=max_html_bytes,
        dpi=dpi,
        start=start,
        start2=start2,
        label=label,
        colorbar=colorbar,
    )
