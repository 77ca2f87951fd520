"""Issue 44: phone renditions of figures placed in the built page (book/_ext/afs_site.py,
item 3), and a cell's printed text stored as one output box (tools/execute_notebooks.py,
item 5)."""

from __future__ import annotations

import base64
import hashlib
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
sys.path.insert(0, str(ROOT / "tools"))

from afs_site import add_phone_images, phone_renditions
from execute_notebooks import coalesce_streams

DESKTOP = b"\x89PNG\r\n\x1a\n desktop"
PHONE = b"\x89PNG\r\n\x1a\n phone"
KEY = hashlib.sha256(DESKTOP).hexdigest()


def notebook(phone: bool = True) -> dict:
    md = {"image/png": {"width": 692, "height": 256}}
    if phone:
        md["image/png"]["afs_phone"] = {
            "png": base64.b64encode(PHONE).decode(),
            "width": 390,
            "height": 432,
        }
    out = {
        "output_type": "display_data",
        "data": {"image/png": base64.b64encode(DESKTOP).decode()},
        "metadata": md,
    }
    return {"cells": [{"cell_type": "code", "outputs": [out]}]}


def test_renditions_are_keyed_by_the_desktop_pngs_file_name():
    found = phone_renditions(notebook())
    assert found == {KEY: {"png": PHONE, "width": 390, "height": 432}}
    assert phone_renditions(notebook(phone=False)) == {}


def test_the_phone_image_follows_the_desktop_one_with_its_alt():
    body = (
        f'<p>x</p><img alt="Two heads." src="../_images/{KEY}.png" '
        'style="width: 692px; height: 256px;" />'
        '<img alt="other" src="../_images/' + "0" * 64 + '.png" />'
    )
    out, used = add_phone_images(body, phone_renditions(notebook()))
    assert used == {KEY}
    assert (
        f'<img class="afs-desktop" alt="Two heads." src="../_images/{KEY}.png" '
        'style="width: 692px; height: 256px;" />'
        f'<img class="afs-phone" alt="Two heads." src="../_images/{KEY}-phone.png" '
        'style="width: 390px; height: 432px;" />'
    ) in out
    assert out.count("<img") == 3  # the figure without a rendition is left alone
    with_class, _ = add_phone_images(
        f'<img class="big" src="_images/{KEY}.png" />', phone_renditions(notebook())
    )
    assert with_class.startswith('<img class="afs-desktop big"')


def stream(text: str, name: str = "stdout") -> dict:
    return {"output_type": "stream", "name": name, "text": text}


def test_consecutive_streams_of_one_name_are_one_box():
    shown = {"output_type": "display_data", "data": {"text/plain": "x"}, "metadata": {}}
    outputs = [
        stream("a\n"),
        stream("b\n"),
        stream("w\n", "stderr"),
        stream("c\n"),
        shown,
        stream("d\n"),
        stream("10%\r50%\r100%\n"),
    ]
    merged = coalesce_streams(outputs)
    assert merged == [
        stream("a\nb\n"),
        stream("w\n", "stderr"),
        stream("c\n"),
        shown,
        stream("d\n100%\n"),
    ]


MINE = [f"{n:02d}" for n in range(1, 11)] + ["13", "20"]


@pytest.mark.parametrize(
    "path",
    [p for p in sorted((ROOT / "book").glob("*.ipynb")) if p.name[:2] in MINE],
    ids=lambda p: p.name,
)
def test_no_stored_cell_prints_in_several_boxes(path):
    nb = nbformat.read(path, as_version=4)
    split = [
        i
        for i, cell in enumerate(nb.cells)
        for a, b in zip(cell.get("outputs", []), cell.get("outputs", [])[1:])
        if a.output_type == b.output_type == "stream" and a.name == b.name
    ]
    assert not split, f"{path.name}: cells {split} print in several boxes (re-execute)"
