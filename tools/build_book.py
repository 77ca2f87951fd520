"""Build the HTML book in every language: English at _build/html, Chinese at _build/html/zh.

Usage (from the repository root, inside the repository's virtual environment)::

    python tools/build_book.py            # both editions (what `make book` runs)
    python tools/build_book.py --strict   # warnings and broken links fail (`make build-strict`)
    python tools/build_book.py --lang zh  # one edition only

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="fail on any warning")
    parser.add_argument("--lang", choices=sorted(EDITIONS), action="append")
    args = parser.parse_args(argv)
    failed = [e for e in args.lang or list(EDITIONS) if build(e, strict=args.strict) != 0]
    if failed:
        print(f"Build failed for: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"The book is at file://{BUILD / 'html' / 'index.html'}")
    print(f"中文版: file://{BUILD / 'html' / 'zh' / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
