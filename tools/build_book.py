"""Build the HTML book in every language: English at _build/html, Chinese at _build/html/zh.

Usage (from the repository root, inside the repository's virtual environment)::

    python tools/build_book.py            # both editions, side by side (`make book`)
    python tools/build_book.py --strict   # warnings and broken links fail (`make build-strict`)
    python tools/build_book.py --lang zh  # one edition only
    python tools/build_book.py --pdf      # PDFs of the built HTML (what `make pdf` runs)

Both editions are one Jupyter Book (the same _config.yml, _toc.yml and notebooks with their
stored outputs); the Chinese one adds ``language = "zh_CN"``, so Sphinx replaces the prose
with the translations in locale/zh_CN/LC_MESSAGES/ (see README.md, "Editing a translation").
This is the build `jupyter-book build .` runs, called once per language through
jupyter-book's Python entry point, which is the only way to pass the language override.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from jupyter_book.sphinx import build_sphinx

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "_build"

# Edition code -> (Sphinx language, Sphinx's output folder, doctree folder, published folder).
# The Chinese edition is built beside the English one, then copied into its zh/ folder:
# myst-nb writes its scratch folder `jupyter_execute` next to the output folder, which would
# otherwise put a second copy of every figure into the published site.
EDITIONS: dict[str, tuple[str, Path, Path, Path]] = {
    "en": ("en", BUILD / "html", BUILD / ".doctrees", BUILD / "html"),
    "zh": ("zh_CN", BUILD / "zh" / "html", BUILD / ".doctrees-zh", BUILD / "html" / "zh"),
}


def build(edition: str, *, strict: bool) -> int:
    """Build one edition; returns Sphinx's exit status (0 when it succeeded)."""
    language, outdir, doctrees, published = EDITIONS[edition]
    overrides = {
        "external_toc_path": "_toc.yml",
        "latex_individualpages": False,
        "language": language,
    }
    if strict:
        overrides["nitpicky"] = True
    print(f"Building the {edition} edition into {published.relative_to(ROOT)}", flush=True)
    result = build_sphinx(
        ROOT,
        outdir,
        noconfig=True,
        path_config=ROOT / "_config.yml",
        confoverrides=overrides,
        doctreedir=doctrees,
        builder="html",
        warningiserror=strict,
        keep_going=strict,
    )
    if result != 0:  # an exit status, or the exception that stopped the build
        return result if isinstance(result, int) else 1
    if published != outdir:
        shutil.rmtree(published, ignore_errors=True)
        shutil.copytree(outdir, published)
    return 0


def build_side_by_side(editions: list[str], *, strict: bool) -> list[str]:
    """Build ``editions`` at once, one process each (a Sphinx build keeps one core busy):
    each has its own output, doctree and myst-nb scratch folders (EDITIONS), so they do
    not meet. Each build's log is printed whole when it ends; returns the failed ones."""
    import subprocess

    BUILD.mkdir(exist_ok=True)
    runs = {}
    for edition in editions:
        log = open(BUILD / f"build-{edition}.log", "w+", encoding="utf-8")  # noqa: SIM115
        command = [sys.executable, __file__, "--lang", edition] + (["--strict"] if strict else [])
        runs[edition] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log)
    failed = []
    for edition, (process, log) in runs.items():
        if process.wait() != 0:
            failed.append(edition)
        log.seek(0)
        print(log.read(), end="", flush=True)
        log.close()
    return failed


# Issue 44, item 9: a PDF of each chapter and of the whole book, in each edition, printed
# by the Chromium the browser tests use, from the built HTML and its print CSS (afs.css:
# no navigation, code wrapped). Written into the site, beside the pages: pdf/<page>.pdf and
# pdf/book.pdf of each edition (so the pages' download menu links to them, afs.js).
CHROMIUM = "/usr/bin/chromium"
PDF_NAME = {"en": "attention-from-scratch", "zh": "attention-from-scratch-zh"}

# Before printing: every folded cell opened, every figure loaded, each slider on its first
# frame, MathJax done.
PRINT_READY_JS = """async () => {
    document.querySelectorAll('article details').forEach(d => d.open = true);
    document.querySelectorAll('img[loading="lazy"]').forEach(i => i.loading = 'eager');
    document.querySelectorAll('.afs-explorer input.afs-slider').forEach(s => {
        s.value = s.min; s.dispatchEvent(new Event('input', {bubbles: true}));
    });
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
        await MathJax.startup.promise;
    }
    await Promise.all([...document.images].map(i => i.complete ? null : new Promise(r => {
        i.addEventListener('load', r); i.addEventListener('error', r); })));
}"""

# The whole book: the articles of every page (as built, before MathJax), in the order of
# _toc.yml, put into the first page, then typeset at once (MathJax's CSS then covers every
# character of the book).
JOIN_JS = """async (urls) => {
    const parts = [];
    for (const url of urls) {
        const html = await (await fetch(url)).text();
        const doc = new DOMParser().parseFromString(html, 'text/html');
        const article = doc.querySelector('article');
        parts.push(`<section class="afs-print-page">${article ? article.innerHTML : ''}</section>`);
    }
    const main = document.querySelector('article');
    main.innerHTML = parts.join('');
    if (window.MathJax && MathJax.typesetPromise) {
        MathJax.typesetClear && MathJax.typesetClear();
        await MathJax.typesetPromise([main]);
    }
}"""


def toc_pages() -> list[str]:
    """The book's pages in reading order (``_toc.yml``)."""
    sys.path.insert(0, str(ROOT / "tests" / "book"))
    from book_urls import toc_entries

    return toc_entries(ROOT / "_toc.yml")


def make_pdfs(editions: list[str]) -> int:
    """Print each page and the whole book of ``editions`` to PDF (the HTML must be built)."""
    import functools
    import http.server
    import threading

    from playwright.sync_api import sync_playwright

    site = BUILD / "html"
    if not (site / "index.html").exists():
        print("Build the book first (make book).", file=sys.stderr)
        return 1

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    pages = toc_pages()
    options = {
        "format": "A4",
        "print_background": True,
        "margin": {"top": "18mm", "bottom": "18mm", "left": "16mm", "right": "16mm"},
        "display_header_footer": True,
        "header_template": "<span></span>",
        "footer_template": '<div style="font-size:8px;width:100%;text-align:center">'
        '<span class="pageNumber"></span></div>',
    }
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.set_default_timeout(120_000)
        for edition in editions:
            folder = EDITIONS[edition][3].relative_to(site).as_posix()
            prefix = "" if folder == "." else f"{folder}/"
            base = f"http://127.0.0.1:{server.server_address[1]}/{prefix}"
            out = site / prefix / "pdf"
            for docname in pages:
                page = context.new_page()
                page.emulate_media(media="print")
                page.goto(f"{base}{docname}.html", wait_until="load")
                page.evaluate(PRINT_READY_JS)
                target = out / f"{docname}.pdf"
                target.parent.mkdir(parents=True, exist_ok=True)
                page.pdf(path=str(target), **options)
                print(f"{target.relative_to(ROOT)}", flush=True)
                page.close()
            page = context.new_page()
            page.emulate_media(media="print")
            page.goto(f"{base}{pages[0]}.html", wait_until="load")
            page.evaluate(PRINT_READY_JS)
            page.evaluate(JOIN_JS, [f"{base}{d}.html" for d in pages])
            page.evaluate(PRINT_READY_JS)
            target = out / f"{PDF_NAME[edition]}.pdf"
            page.pdf(path=str(target), **options)
            print(f"{target.relative_to(ROOT)}", flush=True)
            page.close()
        browser.close()
    server.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="fail on any warning")
    parser.add_argument("--lang", choices=sorted(EDITIONS), action="append")
    parser.add_argument("--pdf", action="store_true", help="PDFs of the built book only")
    args = parser.parse_args(argv)
    if args.pdf:
        return make_pdfs(args.lang or list(EDITIONS))
    editions = args.lang or list(EDITIONS)
    if len(editions) == 1:
        failed = [e for e in editions if build(e, strict=args.strict) != 0]
    else:
        failed = build_side_by_side(editions, strict=args.strict)
    if failed:
        print(f"Build failed for: {', '.join(failed)}", file=sys.stderr)
        return 1
    # (side by side, each edition's build said where it is)
    if editions == ["en"]:
        print(f"The book is at file://{BUILD / 'html' / 'index.html'}")
    elif editions == ["zh"]:
        print(f"中文版: file://{BUILD / 'html' / 'zh' / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
