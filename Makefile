# Attention from Scratch: the two commands of the README are `make book` and `make test`.
# Both create (or reuse) the virtual environment .venv in the repository.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: book test unit-and-booktests unit booktests nbval nbval-portable build-strict browser lab execute catalogs clean pdf

# --no-compile: pip would byte-compile all 16,500 modules it installs (about 45 s of one
# core); Python compiles the ones a run imports, once, and keeps them.
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -r requirements.txt
	touch $(STAMP)

## make book: build the HTML book, English into _build/html and Chinese into _build/html/zh
## (the two editions side by side, one process each)
book: $(STAMP)
	$(PY) tools/build_book.py

## make test: the library's tests and the book's tests (side by side, one core each), nbval
## over every notebook (on this CPU, then as another CPU would run it; two notebooks at a
## time), the strict book build (both editions side by side), the browser tests (both
## editions side by side): every stage keeps a 2-core machine's two cores busy (about 37
## minutes there with .ci/run's installs, README.md).
test: unit-and-booktests nbval nbval-portable build-strict browser
	@echo "All tests passed."

## make unit-and-booktests: `make unit` and `make booktests` at once (neither reads what the
## other writes); each one's report is printed whole when it ends
unit-and-booktests: $(STAMP)
	@$(MAKE) --no-print-directory -j2 --output-sync=target unit booktests

## make unit: the library's tests (tests/lib); nothing here reads or builds the book
unit: $(STAMP)
	$(PY) -m pytest tests/lib -p no:cacheprovider -q

## make booktests: the book's tests (tests/book): notebooks' structure, catalogs, config, Binder
booktests: $(STAMP)
	$(PY) -m pytest tests/book -p no:cacheprovider -q

## make nbval: every notebook re-run and compared with its stored outputs, on this CPU as
## it is (its kernels, its threads), two notebooks at a time (tools/nbval_portable.py)
nbval: $(STAMP)
	$(PY) tools/nbval_portable.py --native

## make nbval-portable: nbval as a reader's other CPU runs it (another kernel dispatch,
## one thread): every printed number must be the same there (tools/nbval_portable.py)
nbval-portable: $(STAMP)
	$(PY) tools/nbval_portable.py

## make build-strict: both editions built at once (tools/build_book.py --strict, one process
## each), where any warning or broken internal link fails
build-strict: $(STAMP)
	rm -rf _build/html _build/zh _build/.doctrees _build/.doctrees-zh
	$(PY) tools/build_book.py --strict

## make browser: the browser suite on the English and the Chinese edition, side by side
## (most of its time is axe-core's JavaScript, one core per browser); the Chinese run's
## report follows the English one
browser: $(STAMP)
	@mkdir -p _build
	@AFS_EDITION=zh $(PY) -m pytest tests/browser -p no:cacheprovider -q \
		--ignore=tests/browser/test_jupyterlab_live.py > _build/browser-zh.log 2>&1 & zh=$$!; \
	$(PY) -m pytest tests/browser -p no:cacheprovider -q; en=$$?; \
	wait $$zh; zh_rc=$$?; \
	echo "--- the Chinese edition (AFS_EDITION=zh) ---"; cat _build/browser-zh.log; \
	test $$en -eq 0 && test $$zh_rc -eq 0

## make pdf: after `make book`, a PDF of each page and of the whole book, both editions,
## printed by Chromium (_build/html/pdf/ and _build/html/zh/pdf/; linked from each page's
## download menu)
pdf: $(STAMP)
	$(PY) tools/build_book.py --pdf

## make lab: open the notebooks in JupyterLab with the repository's environment
lab: $(STAMP)
	$(VENV)/bin/jupyter lab book/

## make execute [NB=book/03_softmax.ipynb]: re-execute notebooks so stored outputs match the code
execute: $(STAMP)
	$(PY) tools/execute_notebooks.py $(NB)

## make catalogs: after changing English text, refresh the translation catalogs in locale/
catalogs: $(STAMP)
	$(PY) tools/i18n.py update

clean:
	rm -rf _build
