"""Issue 44, item 2: nothing covers a figure.

The "Enlarge" button that opens a shrunk figure at full size sits in its own line above
the figure, never on it: on every page, on a 390 px phone (2x pixels) and at 1280 px, no
shown button covers figure ink (the pixels under it, with the buttons hidden, are the
white page). It shows only for a figure shown below 85 % of its size, so never on a
desktop, where figures are at most a few per cent too wide for the column.
"""

from __future__ import annotations

import pytest
from bookpages import NOTEBOOK_PAGES
from reading import zoom_controls_over_ink

SHRUNK = 0.85

SHOWN_BELOW_JS = """(shrunk) => [...document.querySelectorAll('article .afs-zoom-cue')]
    .filter(c => !c.hidden).map(c => {
        const img = [...c.parentElement.querySelectorAll('img')]
            .find(i => i.getBoundingClientRect().width > 0);
        const full = parseFloat(img.style.width) || img.naturalWidth;
        return img.getBoundingClientRect().width / full;
    }).filter(r => r >= shrunk)"""


@pytest.mark.parametrize("where", ["phone", "desktop"])
def test_no_control_covers_figure_ink(loaded, loaded_phone, notebook: str, where: str) -> None:
    page = (loaded if where == "desktop" else loaded_phone)(notebook).page
    found = zoom_controls_over_ink(page)
    assert not found["over_ink"], (
        f"{notebook} on a {where}: {found['over_ink']} of {found['controls']} controls "
        f"over figure ink: {found['over']}"
    )
    barely = page.evaluate(SHOWN_BELOW_JS, SHRUNK)
    assert not barely, f"{notebook} on a {where}: Enlarge on figures shown at {barely}"


def test_no_enlarge_button_on_a_desktop(loaded) -> None:
    shown = []
    for notebook in NOTEBOOK_PAGES[:4]:
        page = loaded(notebook).page
        shown += page.evaluate(SHOWN_BELOW_JS, 0)
    assert not shown, f"Enlarge shown at 1280 px on figures shown at {shown} of their size"
