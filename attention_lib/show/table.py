"""Result tables that read as tables (issue 44, item 5).

A chapter that prints a result table with f-strings shows it as monospaced text, cut at
the phone's edge, and one ``print`` per line can come out as several output boxes.
:func:`table` returns one object that a notebook shows as an HTML table (a header row,
numbers right-aligned, a box that scrolls sideways on a narrow screen with the book's
fading cue) and whose plain text, what nbval compares and a terminal prints, is the same
table aligned in columns::

    from attention_lib.show.table import table
    table([["full cache", 64, 0.98], ["window only", 8, 0.41]],
          header=["cache", "kept", "accuracy"], digits=3)

Nothing here imports IPython: Jupyter calls ``_repr_html_`` itself.
"""

from __future__ import annotations

import html
import numbers
import re
from collections.abc import Sequence
from typing import Any


def _cell(value: Any, digits: int | None, spec: str | None = None) -> str:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return str(value)
    if spec is not None:
        return format(value, spec)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if digits is None:
        return repr(float(value))
    return f"{float(value):.{digits}g}" if abs(value) < 1e-3 and value else f"{value:.{digits}f}"


# A cell written as a number by the caller ("1.62x", "12.5%", "0.97/0.98", "-" for none)
_NUMBER_TEXT = re.compile(r"[-+]?\d[\d.,/]*(?:e[-+]?\d+)?[x%]?|-")


# A number and its unit stay on one line in a cell ("100 tokens", "4 KiB").
_NUMBER_UNIT = re.compile(
    r"(\d) (s|ms|µs|ns|min|h|B|kB|KiB|MB|MiB|GB|GiB|%|x|×|tokens?|FLOPs?)(?!\w)"
)


def _unbroken(text: str) -> str:
    return _NUMBER_UNIT.sub("\\1\u00a0\\2", text)


def _numeric(value: Any) -> bool:
    if isinstance(value, str):
        return _NUMBER_TEXT.fullmatch(value.strip()) is not None
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class Table:
    """A result table: rows of cells under a header, shown as HTML in a notebook and as
    aligned text elsewhere. Build it with :func:`table`."""

    def __init__(
        self,
        rows: Sequence[Sequence[Any]],
        header: Sequence[str],
        digits: int | None,
        caption: str | None,
        formats: Sequence[str | None] | None = None,
    ) -> None:
        self.header = [str(h) for h in header]
        self.rows = [list(r) for r in rows]
        self.digits = digits
        self.caption = caption
        self.formats = list(formats) if formats is not None else [None] * len(self.header)
        self.text_rows = [
            [_cell(v, digits, f) for v, f in zip(r, self.formats, strict=True)] for r in self.rows
        ]
        # a column is numeric (right-aligned) when every cell in it is a number, or a
        # string that reads as one
        self.numeric = [
            all(_numeric(r[j]) for r in self.rows) and bool(self.rows)
            for j in range(len(self.header))
        ]

    def __repr__(self) -> str:
        widths = [
            max([len(h)] + [len(r[j]) for r in self.text_rows]) for j, h in enumerate(self.header)
        ]

        def line(cells: Sequence[str]) -> str:
            return "  ".join(
                c.rjust(w) if self.numeric[j] else c.ljust(w)
                for j, (c, w) in enumerate(zip(cells, widths, strict=True))
            ).rstrip()

        out = [self.caption] if self.caption else []
        out += [line(self.header), line(["-" * w for w in widths])]
        out += [line(r) for r in self.text_rows]
        return "\n".join(out)

    __str__ = __repr__

    def _repr_html_(self) -> str:
        def cell(tag: str, text: str, j: int) -> str:
            align = ' style="text-align:right"' if self.numeric[j] else ""
            return f"<{tag}{align}>{_unbroken(html.escape(text))}</{tag}>"

        head = "".join(cell("th", h, j) for j, h in enumerate(self.header))
        body = "".join(
            "<tr>" + "".join(cell("td", c, j) for j, c in enumerate(r)) + "</tr>"
            for r in self.text_rows
        )
        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return (
            '<div class="afs-table" style="overflow-x:auto;max-width:100%">'
            f'<table class="table">{caption}<thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>"
        )


def table(
    rows: Sequence[Sequence[Any]],
    header: Sequence[str],
    *,
    digits: int | None = None,
    caption: str | None = None,
    formats: Sequence[str | None] | None = None,
) -> Table:
    """One result table, shown as an HTML table in a notebook and as aligned text in
    nbval's comparison and a terminal.

    Args:
        rows: the rows, each a sequence of cells (str, int, float, bool...), as many as
            ``header`` has names.
        header: the column names.
        digits: decimals of the float cells (values below 0.001 get that many
            significant digits); ``None`` prints ``repr(float)``.
        caption: an optional line above the table.
        formats: a format spec per column for its numbers (``format(value, spec)``:
            ``"5d"``, ``",d"``, ``".2f"``, ``".1%"``, ``".2e"``...), ``None`` for a column
            that follows ``digits``; as many as ``header`` has names.

    Returns:
        A :class:`Table`; make it the last expression of a cell (or ``display`` it).

    Raises:
        TypeError: if ``header`` is a string or a row is not a sequence.
        ValueError: if a row does not have one cell per column, ``formats`` does not have
            one entry per column, or ``digits < 0``.
    """
    if isinstance(header, str) or not isinstance(header, Sequence):
        raise TypeError("header must be a sequence of column names")
    if digits is not None and (not isinstance(digits, int) or digits < 0):
        raise ValueError(f"digits must be an int >= 0 or None, got {digits!r}")
    if formats is not None:
        if isinstance(formats, str) or not isinstance(formats, Sequence):
            raise TypeError(f"formats must be a sequence of format specs, got {formats!r}")
        if len(formats) != len(header):
            raise ValueError(f"formats has {len(formats)} specs for {len(header)} columns")
    for i, row in enumerate(rows):
        if isinstance(row, str) or not isinstance(row, Sequence):
            raise TypeError(f"row {i} is not a sequence of cells: {row!r}")
        if len(row) != len(header):
            raise ValueError(f"row {i} has {len(row)} cells for {len(header)} columns")
    return Table(rows, header, digits, caption, formats)
