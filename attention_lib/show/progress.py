"""The progress bar of :func:`~attention_lib.train_token_classifier`.

tqdm and IPython are imported when a bar is made, never at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def progress_bar(total: int, desc: str = "training") -> tuple[Any, Callable[[], None]]:
    """A ``tqdm.auto`` progress bar and a function to call after closing it.

    In a notebook, tqdm shows an ipywidgets bar whose plain-text form is frozen
    at the moment it is displayed (0%). We display it ourselves with a display
    id and refresh that display once at the end, so that a saved notebook (and
    the HTML book built from it, which shows the plain text) holds the finished
    bar instead of an empty one.
    """
    from tqdm.auto import tqdm
    from tqdm.notebook import tqdm as notebook_tqdm

    if not issubclass(tqdm, notebook_tqdm):  # a terminal: a plain text bar
        return tqdm(total=total, desc=desc, unit="step"), lambda: None
    from IPython.display import display

    bar = tqdm(total=total, desc=desc, unit="step", display=False)
    handle = display(bar.container, display_id=True)
    return bar, lambda: handle.update(bar.container) if handle is not None else None
