"""Issue 44, item 5: results that are tables read as tables, in both editions.

- A result table (attention_lib.show.table) is one HTML table with a header row, in its
  own box; no cell's printed text is split over several output boxes (the notebooks are
  executed with tools/execute_notebooks.py, which merges a cell's consecutive streams).
- On a 390 px phone, a table wider than the column scrolls sideways in its box, which
  shows the fading cue of wide code blocks (afs.js marks it ``afs-scrolls``) and takes
  the keyboard focus; the page itself never scrolls sideways.
"""

from __future__ import annotations

from itertools import pairwise

import pytest
from bookpages import NOTEBOOK_PAGES, built_html
from bs4 import BeautifulSoup
from reading import SHOW_ALL_JS

TABLE_PAGES = [d for d in NOTEBOOK_PAGES if 'class="afs-table"' in built_html(d)]

TABLES_JS = """() => [...document.querySelectorAll('article div.afs-table')]
    .filter(b => b.offsetParent !== null)
    .map(b => ({wide: b.scrollWidth > b.clientWidth + 1,
                cued: b.classList.contains('afs-scrolls')
                      && getComputedStyle(b).maskImage !== 'none',
                focusable: b.tabIndex === 0,
                header: b.querySelector('thead th')?.textContent ?? null,
                page_wide: document.documentElement.scrollWidth > innerWidth + 1}))"""


def test_some_pages_show_result_tables() -> None:
    assert len(TABLE_PAGES) >= 5, TABLE_PAGES


def split_streams(soup: BeautifulSoup) -> int:
    """Cells whose printed text comes out as two or more boxes in a row (one per piece the
    kernel flushed). A print next to a value or a progress bar is two outputs: not counted
    (reading_report.split_outputs counts those too)."""
    split = 0
    for out in soup.select("article .cell_output"):
        boxes = [" ".join(d.get("class") or []) for d in out.find_all("div", recursive=False)]
        split += any("stream" in a and "stream" in b for a, b in pairwise(boxes))
    return split


def test_printed_output_is_one_box_per_cell(notebook: str) -> None:
    soup = BeautifulSoup(built_html(notebook), "html.parser")
    assert split_streams(soup) == 0, f"{notebook}: cells print over several boxes (re-execute)"
    for box in soup.select("article div.afs-table"):
        assert len(box.find_all("table")) == 1 and box.find("thead"), f"{notebook}: {box}"


@pytest.mark.parametrize("page_name", TABLE_PAGES)
def test_wide_tables_scroll_in_their_box_with_a_cue_on_a_phone(
    loaded_phone, page_name: str
) -> None:
    page = loaded_phone(page_name).page
    page.evaluate(SHOW_ALL_JS)
    page.wait_for_timeout(100)  # afs.js checks the boxes on their resize
    tables = page.evaluate(TABLES_JS)
    assert tables, f"{page_name}: no result table shown"
    for t in tables:
        assert t["header"] is not None, f"{page_name}: a table without a header row"
        assert t["focusable"], f"{page_name}: a table box the keyboard cannot scroll"
        if t["wide"]:
            assert t["cued"], f"{page_name}: a table wider than the phone with no cue"
    assert not tables[0]["page_wide"], f"{page_name}: the page scrolls sideways"
