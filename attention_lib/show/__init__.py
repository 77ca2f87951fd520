"""The book's display kit: heatmaps, slider explorers and progress bars.

Everything that draws or displays lives here, apart from the algorithm:
:mod:`attention_lib.show.viz` (heatmaps of attention weights),
:mod:`attention_lib.show.explorer` (sliders that work with and without a
kernel), :mod:`attention_lib.show.style` (the figure rules every figure follows:
dpi, font sizes, width), :mod:`attention_lib.show.phone` (each figure's phone
rendition), :mod:`attention_lib.show.table` (result tables) and
:mod:`attention_lib.show.progress` (the training progress bar).
matplotlib, ipywidgets, IPython and tqdm are imported only when a function
here is called, so ``import attention_lib`` stays light; no module at the top
level of ``attention_lib`` imports them.

Import the public names from ``attention_lib`` itself, e.g.
``from attention_lib import attention_heatmap, explore``.
"""
