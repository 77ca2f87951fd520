"""Every figure stored in a notebook's outputs shows up, visible and non-empty."""

from __future__ import annotations

import json

from bookpages import source_path

# myst-nb's MIME priority for the html builder, with the widget view dropped as in
# _config.yml (nb_mime_priority_overrides): the first type a bundle has is rendered.
HTML_PRIORITY = [
    "application/javascript",
    "text/html",
    "image/svg+xml",
    "image/png",
    "image/jpeg",
    "text/markdown",
    "text/latex",
    "text/plain",
]
REMOVED = {"remove-cell", "remove_cell", "remove-output", "remove_output"}


def stored_figures(notebook: str) -> int:
    """How many outputs of the notebook render as an image in the HTML book."""
    cells = json.loads(source_path(notebook).read_text())["cells"]
    count = 0
    for cell in cells:
        if cell["cell_type"] != "code" or REMOVED & set(cell["metadata"].get("tags", [])):
            continue
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            shown = next((m for m in HTML_PRIORITY if m in data), None)
            count += bool(shown and shown.startswith("image/"))
    return count


def test_every_stored_figure_is_visible(loaded, notebook: str) -> None:
    page = loaded(notebook).page
    # Outputs of cells tagged hide-output sit in closed <details>: open them, as a reader would.
    page.evaluate("() => document.querySelectorAll('article details').forEach(d => d.open = true)")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.cell_output img')].every(i => i.complete)"
    )
    figures = page.locator(".cell_output img:not(.afs-explorer img)")
    expected = stored_figures(notebook)
    assert figures.count() == expected, (
        f"{notebook}: {expected} figures stored in the notebook, {figures.count()} on the page"
    )
    for i in range(figures.count()):
        img = figures.nth(i)
        img.scroll_into_view_if_needed()
        assert img.is_visible(), f"{notebook}: figure {i} is hidden"
        natural = img.evaluate("i => [i.naturalWidth, i.naturalHeight]")
        assert natural[0] > 0 and natural[1] > 0, f"{notebook}: figure {i} did not decode"
        box = img.bounding_box()
        assert box and box["width"] > 0 and box["height"] > 0, f"{notebook}: figure {i} has no size"
