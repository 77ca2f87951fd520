"""The kernel-free slider explorers (attention_lib.explorer) work in the built book.

Each `.afs-explorer` holds one `input.afs-slider[data-param]` per parameter with its
position, "(k of N)" (afs.js), one `.afs-label` ("name = value", "a = 1, b = 2" or the
chapter's own wording) and one `img.afs-frame` per combination, of which exactly one is shown.
A reader moves a slider with the keyboard or the mouse; the shown frame, the position and the
label must follow, with no kernel and no network. A parameter with two values is an either/or
choice, shown as a toggle of its two values in place of its slider (issue 44, item 5).
"""

from __future__ import annotations

import pytest
from allowed_errors import problems
from bookpages import EDITION, HTML_DIR, PAGES, Tab, built_html, pages_with_sliders
from bs4 import BeautifulSoup

SLIDER_PAGES = pages_with_sliders()

# The explorer's state as the reader sees it: the label and the frames that are visible.
STATE_JS = """(ex) => {
    const hash = (s) => { let h = 5381; for (let i = 0; i < s.length; i++) h = (h * 33 + s.charCodeAt(i)) | 0; return h; };
    const shown = [...ex.querySelectorAll('img.afs-frame')].filter(f => {
        const r = f.getBoundingClientRect();
        return getComputedStyle(f).display !== 'none' && f.offsetParent !== null && r.width > 0 && r.height > 0;
    });
    return {
        label: ex.querySelector('.afs-label').textContent.trim(),
        positions: [...ex.querySelectorAll('.afs-position')].map(p => p.textContent.trim()),
        shown: shown.map(f => ({index: f.dataset.index, alt: f.alt, src: hash(f.src),
                                natural: f.naturalWidth * f.naturalHeight})),
    };
}"""


def stop_text(at: int, last: int) -> str:
    """The stop beside a slider at value ``at`` of ``0..last`` (afs.js; issue 44, item 5)."""
    if EDITION == "zh":
        return f"（第 {at + 1} 档，共 {last + 1} 档）"
    return f"({at + 1} of {last + 1})"


def test_the_book_has_a_static_slider() -> None:
    assert (HTML_DIR / "index.html").exists(), f"{HTML_DIR} is not built"
    assert SLIDER_PAGES, (
        "no page of the built book has a kernel-free slider (.afs-explorer); chapter 1 "
        f"should have one. Pages: {PAGES}"
    )


@pytest.mark.parametrize("slider_page", SLIDER_PAGES)
def test_slider_html_is_complete(slider_page: str) -> None:
    soup = BeautifulSoup(built_html(slider_page), "html.parser")
    for ex in soup.select(".afs-explorer"):
        sliders = ex.select("input.afs-slider[data-param]")
        frames = ex.select("img.afs-frame")
        assert sliders and len(ex.select(".afs-label")) == 1
        n = 1
        for s in sliders:
            assert s["type"] == "range" and int(s["min"]) == 0
            n *= int(s["max"]) + 1
        assert len(frames) == n >= 2, (
            f"{slider_page}: {len(frames)} frames for {n} slider positions"
        )
        assert all(f["src"].startswith("data:image/png;base64,") for f in frames)
        # Nothing in the explorer reaches for another host.
        assert "http://" not in str(ex) and "https://" not in str(ex)


def check_state(state: dict, where: str) -> dict:
    assert len(state["shown"]) == 1, f"{where}: {len(state['shown'])} frames shown instead of 1"
    frame = state["shown"][0]
    assert frame["natural"] > 0, f"{where}: the shown frame did not decode"
    assert state["label"] == frame["alt"], (
        f"{where}: label {state['label']!r} vs frame {frame['alt']!r}"
    )
    return frame


# A two-stop slider's toggle (afs.js; issue 44, item 5): its name, its two options' names
# and which is chosen.
TOGGLE_JS = """(slider) => {
    const control = slider.closest('.afs-control');
    const toggle = control.nextElementSibling;
    if (!toggle || !toggle.matches('.afs-toggle')) return null;
    const group = toggle.querySelector('[role=radiogroup]');
    return {
        slider_shown: control.getClientRects().length > 0,
        name: document.getElementById(group.getAttribute('aria-labelledby'))?.textContent,
        options: [...group.querySelectorAll('[role=radio]')].map(b => {
            const r = b.getBoundingClientRect();
            return {text: b.textContent, checked: b.getAttribute('aria-checked'),
                    width: r.width, height: r.height};
        }),
    };
}"""


def check_toggle(page, ex, slider, where: str) -> None:
    """A two-stop slider is shown as a toggle of two named options: a click or an arrow
    key chooses the other one, and the frame and the label follow."""
    toggle = slider.evaluate(TOGGLE_JS)
    assert toggle, f"{where}: a two-way choice shown as a slider, not a toggle"
    assert not toggle["slider_shown"], f"{where}: the slider is shown beside its toggle"
    assert toggle["name"] == slider.get_attribute("data-param"), toggle
    options = toggle["options"]
    assert len(options) == 2 and all(o["text"].strip() for o in options), options
    assert options[0]["text"] != options[1]["text"], options
    assert all(o["height"] >= 24 and o["width"] >= 24 for o in options), (
        f"{where}: toggle options of {options}: a touch target needs 24 px (WCAG 2.5.8)"
    )
    at = int(slider.input_value())
    assert [o["checked"] for o in options] == [str(v == at).lower() for v in (0, 1)], options
    state = ex.evaluate(STATE_JS)
    check_state(state, where)
    # The label names the chosen option, where the labels are "name = value" pairs.
    toggle_box = slider.locator("xpath=ancestor::*[contains(@class, 'afs-control')][1]")
    buttons = toggle_box.locator("xpath=following-sibling::div[1]").locator("[role=radio]")
    for step, (press, to) in enumerate([("click", 1 - at), ("ArrowRight", at), ("click", at)]):
        before = state
        if press == "click":
            buttons.nth(to).click()
        else:
            buttons.nth(1 - to).press(press)
        assert slider.input_value() == str(to), f"{where}: {press} did not choose option {to}"
        state = ex.evaluate(STATE_JS)
        frame = check_state(state, f"{where} after {press}")
        checked = [b.get_attribute("aria-checked") for b in buttons.all()]
        assert checked == [str(v == to).lower() for v in (0, 1)], checked
        if step < 2:  # the third press is on the chosen option: nothing changes
            assert frame["index"] != before["shown"][0]["index"], f"{where}: same frame"
            assert state["label"] != before["label"], f"{where}: label stuck"
        if "=" in state["label"]:
            assert options[to]["text"] in state["label"], (options[to], state["label"])
    focused = page.evaluate("() => document.activeElement.textContent")
    assert focused == options[at]["text"], f"{where}: focus on {focused!r}"


@pytest.mark.parametrize("slider_page", SLIDER_PAGES)
def test_every_static_slider_moves_frame_and_label(tab: Tab, slider_page: str) -> None:
    tab.open(slider_page)
    page = tab.page
    explorers = page.locator(".afs-explorer")
    assert explorers.count() >= 1
    for e in range(explorers.count()):
        ex = explorers.nth(e)
        ex.scroll_into_view_if_needed()
        sliders = ex.locator("input.afs-slider[data-param]")
        for s in range(sliders.count()):
            slider = sliders.nth(s)
            param = slider.get_attribute("data-param")
            last = int(slider.get_attribute("max"))
            where = f"{slider_page} explorer {e} slider {param!r}"
            assert last >= 1, f"{where} has a single value: nothing to explore"
            if last == 1:  # an either/or choice: a toggle in its place
                check_toggle(page, ex, slider, where)
                continue
            box = slider.bounding_box()
            assert box["height"] >= 24 and box["width"] >= 100, (
                f"{where}: the slider is {box['width']:.0f} x {box['height']:.0f} px; a touch "
                "target needs 24 px (WCAG 2.5.8)"
            )
            state = ex.evaluate(STATE_JS)
            check_state(state, where)
            at = int(slider.input_value())  # the start frame the chapter chose
            assert state["positions"][s : s + 1] == [stop_text(at, last)], (
                f"{where}: position {state['positions']} at value {at}"
            )
            sources = {state["shown"][0]["src"]}
            # Keyboard: the reader tabs to the slider, goes Home (an explorer may start on a
            # later value, explore(start=...)), and presses the right arrow to the end.
            slider.focus()
            if slider.input_value() != "0":
                page.keyboard.press("Home")
                assert slider.input_value() == "0", f"{where}: Home did not move it"
                state = ex.evaluate(STATE_JS)
                check_state(state, f"{where} at Home")
                sources.add(state["shown"][0]["src"])
            for step in range(1, last + 1):
                before = state
                page.keyboard.press("ArrowRight")
                assert slider.input_value() == str(step), f"{where}: arrow key did not move it"
                state = ex.evaluate(STATE_JS)
                frame = check_state(state, f"{where} at {step}")
                assert frame["index"] != before["shown"][0]["index"], (
                    f"{where}: same frame at {step}"
                )
                assert state["label"] != before["label"], (
                    f"{where}: label stuck at {state['label']!r}"
                )
                assert state["positions"][s] == stop_text(step, last), state["positions"]
                sources.add(frame["src"])
            assert len(sources) >= 2, f"{where}: every position shows the same picture"
            # Mouse: a click at the left end of the track takes it back to the first value.
            before = state
            page.mouse.click(box["x"] + 2, box["y"] + box["height"] / 2)
            assert slider.input_value() == "0", f"{where}: a click on the track did not move it"
            state = ex.evaluate(STATE_JS)
            frame = check_state(state, f"{where} after click")
            assert frame["index"] != before["shown"][0]["index"]
            assert state["label"] != before["label"]
    assert not problems(tab), problems(tab)
