"""Headless Chromium reading the built book the way an offline reader would.

The built HTML (`_build/html`, made by `make build-strict`) is served by `http.server` on
127.0.0.1 in a thread; every request to any other host is aborted and recorded. Each test
gets a fresh browser context; on failure its page is saved as a screenshot under
`_build/browser-failures/`. Which pages exist is read from `_toc.yml`, and which sliders
exist from the built pages, so the suite follows the book as chapters land.
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from bookpages import (
    CHROMIUM,
    EDITION,
    EDITIONS,
    FAILURES,
    HTML_DIR,
    NOTEBOOK_PAGES,
    PAGES,
    SITE_DIR,
    Tab,
)

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
TIMEOUT_MS = 15_000
# The two screens the book is read on: a desktop and a phone (touch, mobile viewport, two
# device pixels per CSS px).
DESKTOP = {"viewport": {"width": 1280, "height": 900}}
PHONE = {
    "viewport": {"width": 390, "height": 844},
    "is_mobile": True,
    "has_touch": True,
    "device_scale_factor": 2,
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # `docname`: every page of _toc.yml; `notebook`: every notebook page of it.
    if "docname" in metafunc.fixturenames:
        metafunc.parametrize("docname", PAGES)
    if "notebook" in metafunc.fixturenames:
        metafunc.parametrize("notebook", NOTEBOOK_PAGES)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="session", autouse=True)
def _fresh_failure_screenshots() -> None:
    """Screenshots of an earlier run would mislead: start every run with none."""
    shutil.rmtree(FAILURES, ignore_errors=True)


@pytest.fixture(scope="session")
def html_dir() -> Path:
    """The whole site (both editions); the suite reads the edition AFS_EDITION names."""
    for folder in (SITE_DIR, HTML_DIR):
        if not (folder / "index.html").exists():
            pytest.fail(f"{folder} has no index.html: build the book first (`make build-strict`)")
    return SITE_DIR


@pytest.fixture(scope="session")
def site_url(html_dir: Path) -> Iterator[str]:
    """The root of the served site (the English edition)."""
    handler = functools.partial(_QuietHandler, directory=str(html_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def base_url(site_url: str) -> str:
    """The root of the edition under test: the site root, or zh/ for the Chinese edition."""
    return site_url + EDITIONS[EDITION]


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's chromium (`apt-get install chromium`)"
        )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


def _new_context(browser, base_url: str, screen: dict = DESKTOP):
    """A browser context that aborts, and records per page, every request to another host."""
    context = browser.new_context(**screen, service_workers="block")
    context.set_default_timeout(TIMEOUT_MS)
    local = urlparse(base_url).netloc
    context.tabs = {}  # Page -> Tab

    def route(r) -> None:
        url = r.request.url
        if urlparse(url).netloc == local or url.startswith(("data:", "blob:", "about:")):
            r.continue_()
            return
        # An offline reader gets nothing from other hosts.
        try:
            owners = [context.tabs[r.request.frame.page]]
        except Exception:  # no page to blame (a worker, a closed frame): blame them all
            owners = list(context.tabs.values())
        for tab in owners:
            tab.blocked.append(url)
        r.abort()

    context.route("**/*", route)
    return context


def _new_tab(context, base_url: str) -> Tab:
    """A new page of `context`, recording its console errors and uncaught exceptions."""
    page = context.new_page()
    tab = Tab(page=page, base_url=base_url)
    context.tabs[page] = tab

    def console(msg) -> None:
        if msg.type == "error":
            tab.console_errors.append((msg.text, msg.location.get("url", "")))

    def response(r) -> None:
        if r.status >= 400:
            tab.failed.append(f"{r.status} {r.url}")

    def request_failed(r) -> None:
        error = r.failure or ""
        # Requests to other hosts are aborted on purpose (tab.blocked); a request the
        # browser cancels because the reader moved on to another page is no failure.
        if r.url not in tab.blocked and "ERR_ABORTED" not in error:
            tab.failed.append(f"{error} {r.url}")

    page.on("console", console)
    page.on("pageerror", lambda exc: tab.page_errors.append(getattr(exc, "message", str(exc))))
    page.on("response", response)
    page.on("requestfailed", request_failed)
    return tab


FULL_PAGE_SHOTS = 10  # then only the viewport: a full long page takes seconds to capture
_shots_taken = 0


def _screenshot_on_failure(request: pytest.FixtureRequest, tabs: list[Tab]) -> None:
    global _shots_taken
    rep = getattr(request.node, "rep_call", None)
    if rep is None or not rep.failed:
        return
    FAILURES.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid.split("::", 1)[-1]).strip("_")
    for i, tab in enumerate(tabs):
        shot = FAILURES / (f"{name}.png" if len(tabs) == 1 else f"{name}-{i}.png")
        _shots_taken += 1
        try:
            tab.page.screenshot(path=str(shot), full_page=_shots_taken <= FULL_PAGE_SHOTS)
            print(f"screenshot saved: {shot}")
        except Exception as exc:  # a crashed page must not hide the real failure
            print(f"no screenshot for {name}: {exc}")


@pytest.fixture
def tab_at(browser, request: pytest.FixtureRequest) -> Iterator[Callable[[str], Tab]]:
    """`tab_at(base_url)`: a fresh page in a fresh context that reaches only base_url's host.

    Every request to another host is aborted and recorded; on failure the page is saved as
    a screenshot. `tab` uses it for the built book, test_jupyterlab_live.py for JupyterLab.
    """
    contexts: list[object] = []
    tabs: list[Tab] = []

    def make(base_url: str, screen: dict = DESKTOP) -> Tab:
        context = _new_context(browser, base_url, screen)
        contexts.append(context)
        tabs.append(_new_tab(context, base_url))
        return tabs[-1]

    try:
        yield make
    finally:
        _screenshot_on_failure(request, tabs)
        for context in contexts:
            context.close()


@pytest.fixture
def tab(tab_at: Callable[[str], Tab], base_url: str) -> Tab:
    """A fresh page in a fresh context, for tests that click, type or move things."""
    return tab_at(base_url)


@pytest.fixture
def phone_tab(tab_at: Callable[..., Tab], base_url: str) -> Tab:
    """A fresh page in a fresh context on a 390 x 844 touch screen."""
    return tab_at(base_url, PHONE)


# Pages loaded once per session are each read as on a reader's first visit: nothing the
# site saved on an earlier page (the theme's colour mode, say) is left in localStorage.
FIRST_VISIT_JS = "try { window.localStorage.clear(); } catch (e) {}"


def _first_visit_context(browser, base_url: str, screen: dict):
    context = _new_context(browser, base_url, screen)
    context.add_init_script(FIRST_VISIT_JS)
    return context


@pytest.fixture(scope="session")
def _loaded_pages(browser, base_url: str) -> Iterator[tuple[object, dict[str, Tab]]]:
    context = _first_visit_context(browser, base_url, DESKTOP)
    try:
        yield context, {}
    finally:
        context.close()


@pytest.fixture(scope="session")
def _loaded_phone_pages(browser, base_url: str) -> Iterator[tuple[object, dict[str, Tab]]]:
    context = _first_visit_context(browser, base_url, PHONE)
    try:
        yield context, {}
    finally:
        context.close()


@pytest.fixture
def loaded(
    base_url: str, _loaded_pages: tuple[object, dict[str, Tab]], request: pytest.FixtureRequest
) -> Iterator[Callable[[str], Tab]]:
    """`loaded(docname)`: the page as first loaded (once per session), for read-only checks.

    Loading every page once instead of once per test keeps the suite fast; tests that
    change a page (open menus, move sliders) use `tab` instead.
    """
    yield from _loaded(base_url, _loaded_pages, request)


@pytest.fixture
def loaded_phone(
    base_url: str,
    _loaded_phone_pages: tuple[object, dict[str, Tab]],
    request: pytest.FixtureRequest,
) -> Iterator[Callable[[str], Tab]]:
    """`loaded_phone(docname)`: like `loaded`, on a 390 x 844 touch screen."""
    yield from _loaded(base_url, _loaded_phone_pages, request)


def _loaded(
    base_url: str, pages: tuple[object, dict[str, Tab]], request: pytest.FixtureRequest
) -> Iterator[Callable[[str], Tab]]:
    context, cache = pages
    used: list[Tab] = []

    def get(docname: str) -> Tab:
        if docname not in cache:
            tab = _new_tab(context, base_url)
            tab.response = tab.open(docname)
            tab.page.wait_for_timeout(300)  # late errors of deferred and async scripts
            cache[docname] = tab
        tab = cache[docname]
        tab.page.bring_to_front()  # background tabs get no animation frames: clicks would crawl
        used.append(tab)
        return tab

    yield get
    _screenshot_on_failure(request, used)
