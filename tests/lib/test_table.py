"""attention_lib.show.table: a result table as HTML in a notebook, aligned text elsewhere."""

from __future__ import annotations

import pytest

from attention_lib.show.table import Table, table


def test_text_is_aligned_and_numbers_right_aligned() -> None:
    t = table([["full cache", 64, 0.98], ["window", 8, 0.4125]], ["cache", "kept", "acc"], digits=3)
    assert repr(t).splitlines() == [
        "cache       kept    acc",
        "----------  ----  -----",
        "full cache    64  0.980",
        "window         8  0.412",
    ]
    assert str(t) == repr(t)


def test_html_is_one_table_with_a_header_and_escaped_cells() -> None:
    t = table([["<a>", 1.5]], ["name", "x"], caption="Results & more")
    out = t._repr_html_()
    assert out.count("<table") == 1 and "<thead><tr><th>name</th>" in out
    assert "&lt;a&gt;" in out and "Results &amp; more" in out
    assert '<td style="text-align:right">1.5</td>' in out
    assert "overflow-x:auto" in out  # scrolls sideways on a phone, not the page


def test_small_values_keep_their_digits() -> None:
    assert "1.23e-05" in repr(table([[1.234e-5]], ["err"], digits=3))


def test_bad_input_is_refused() -> None:
    with pytest.raises(TypeError):
        table([[1]], "x")
    with pytest.raises(TypeError):
        table(["ab"], ["x", "y"])
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        table([[1, 2]], ["a", "b", "c"])
    with pytest.raises(ValueError):
        table([[1]], ["a"], digits=-1)
    assert isinstance(table([], ["a"]), Table)


def test_formats_per_column_and_numbers_stay_right_aligned() -> None:
    t = table(
        [[8, 1_048_576, 0.0123, 0.25], [128, 4_194_304, 0.5, 1.0]],
        ["N", "flops", "share", "ratio"],
        formats=["d", ",d", ".1%", None],
        digits=2,
    )
    assert repr(t).splitlines() == [
        "  N      flops  share  ratio",
        "---  ---------  -----  -----",
        "  8  1,048,576   1.2%   0.25",
        "128  4,194,304  50.0%   1.00",
    ]
    assert '<td style="text-align:right">1,048,576</td>' in t._repr_html_()
    with pytest.raises(ValueError, match="1 specs for 2 columns"):
        table([[1, 2]], ["a", "b"], formats=[".2f"])
    with pytest.raises(TypeError):
        table([[1]], ["a"], formats=".2f")


def test_numbers_written_as_text_are_right_aligned_too() -> None:
    t = table([["a", "1.62x", "0.97/0.98"], ["bb", "12.00x", "-"]], ["m", "speed-up", "w"])
    assert t.numeric == [False, True, True]
    assert repr(t).splitlines()[2:] == ["a      1.62x  0.97/0.98", "bb    12.00x          -"]
