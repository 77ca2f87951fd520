"""The live-kernel reading mode: JupyterLab shows the live slider, and moving it redraws.

A slider explorer displays as ONE output whose MIME bundle carries an ipywidgets view and a
kernel-free HTML fallback (attention_lib.explorer). The built book must show the fallback
(test_browser_sliders.py); JupyterLab, which has a kernel, must show only the live widget:
no duplicate static copy, a "name = value" label, and a new PNG when the slider moves.

The test starts JupyterLab from the repository's venv on 127.0.0.1 with every Jupyter and
IPython directory (and HOME) in a temporary folder, so that neither the server nor its
kernel reads or writes the user's home or the repository, and with a kernelspec of its own
that runs the venv's python. It writes a one-cell
notebook there, runs the cell in headless Chromium (no request leaves 127.0.0.1) and moves
the slider with the keyboard, as a reader would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from bookpages import ROOT, Tab

VENV = ROOT / ".venv"
VENV_PYTHON = VENV / "bin" / "python"
KERNEL_NAME = "afs-venv"
TOKEN = "afs-browser-test-token"
NOTEBOOK = "live_explorer.ipynb"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
NAME, VALUES = "temperature", [0.25, 0.5, 1, 2]  # the slider the notebook makes
SERVER_START_S = 30
KERNEL_MS = 40_000  # each: kernel start; cell run (import torch, 4 frames), on 2 busy cores
REDRAW_MS = 5_000

CELL = f"""\
import os
import sys

import torch
from attention_lib import attention_heatmap, explore

# the kernel is the repository's venv, not whatever python3 a user has installed
assert os.path.realpath(sys.prefix) == {str(VENV.resolve())!r}, sys.prefix

torch.manual_seed(0)
scores = 2 * torch.randn(16, 16)  # (Lq, Lk)
tokens = [f"t{{i}}" for i in range(16)]


def draw(temperature):
    weights = torch.softmax(scores / temperature, dim=-1)  # (Lq, Lk)
    return attention_heatmap(weights, tokens, tokens, title=f"temperature {{temperature}}")


explore({NAME!r}, {VALUES!r}, draw)
"""


@dataclass
class Lab:
    url: str  # http://127.0.0.1:PORT/
    log: Path

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _notebook() -> dict:
    return {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": "explorer",
                "metadata": {},
                "outputs": [],
                "source": CELL,
            }
        ],
        "metadata": {
            "kernelspec": {
                "name": KERNEL_NAME,
                "display_name": "attention_lib venv",
                "language": "python",
            }
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _server_info(runtime: Path, pid: int) -> dict | None:
    info = runtime / f"jpserver-{pid}.json"
    try:
        return json.loads(info.read_text())
    except (OSError, ValueError):  # not written yet, or half written
        return None


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}api/status?token={TOKEN}", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _our_kernels(runtime: Path) -> list[int]:
    """Pids of the kernels of this server: their command line names a connection file in
    this test's own runtime folder (a unique temporary path)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(runtime).encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:  # ended meanwhile
            pass
    return pids


def _stop(proc: subprocess.Popen, url: str | None, runtime: Path) -> None:
    """Ask the server to shut down (it stops its kernels); then end whatever is left."""
    if url and proc.poll() is None:
        try:
            req = urllib.request.Request(f"{url}api/shutdown?token={TOKEN}", method="POST")
            urllib.request.urlopen(req, timeout=5).close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):  # the server's process group, if still there
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=5)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait(timeout=5)
    # Kernels run in sessions of their own, out of reach of killpg; a server that had to be
    # killed could not stop them (they would notice their parent's end only later).
    for pid in _our_kernels(runtime):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def jupyterlab(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Lab]:
    """JupyterLab from the venv on 127.0.0.1, confined to tmp_path, with NOTEBOOK in it."""
    if not VENV_PYTHON.exists():
        pytest.fail(f"{VENV_PYTHON} is missing: create the venv first (`make` does)")
    root, home = tmp_path / "notebooks", tmp_path / "home"
    root.mkdir()
    (root / NOTEBOOK).write_text(json.dumps(_notebook(), indent=1))
    dirs = {
        name: home / name
        for name in (
            "jupyter-config",
            "jupyter-data",
            "jupyter-runtime",
            "ipython",
            "config",
            "cache",
        )
    }
    for d in dirs.values():
        d.mkdir(parents=True)
    # A kernelspec of our own, so no python3 spec from elsewhere can stand in for the venv.
    spec = dirs["jupyter-data"] / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [str(VENV_PYTHON), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "attention_lib venv",
                "language": "python",
            }
        )
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JUPYTER", "IPYTHON", "XDG_", "MPL"))
    }
    env.update(
        {
            # Nothing of the user's home is read or written: settings, workspaces, notebook
            # signatures, IPython history, matplotlib's font cache all go to the temporary home.
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(dirs["config"]),
            "XDG_CACHE_HOME": str(dirs["cache"]),
            "JUPYTER_CONFIG_DIR": str(dirs["jupyter-config"]),  # also lab settings and workspaces
            "JUPYTER_DATA_DIR": str(dirs["jupyter-data"]),  # our kernelspec, notebook signatures
            "JUPYTER_RUNTIME_DIR": str(dirs["jupyter-runtime"]),  # jpserver-PID.json, kernels
            "IPYTHONDIR": str(dirs["ipython"]),
            "JUPYTERLAB_DIR": str(VENV / "share" / "jupyter" / "lab"),  # the venv's built app
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
            "OMP_NUM_THREADS": "1",  # 2 cores, shared
            "MKL_NUM_THREADS": "1",
        }
    )
    log = tmp_path / "jupyterlab.log"
    cmd = [
        str(VENV_PYTHON),
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port=0",  # the OS picks a free port; read back from jpserver-PID.json
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={TOKEN}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.allow_root=True",  # CI machines run as root
        "--ServerApp.terminals_enabled=False",
        "--KernelSpecManager.ensure_native_kernel=False",
        "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: run the cell by command
        "--LabApp.news_url=None",  # no server-side requests to other hosts either
        "--LabApp.extension_manager=readonly",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    lab = Lab(url="", log=log)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not lab.url:
            info = _server_info(dirs["jupyter-runtime"], proc.pid)
            if info and _ready(f"http://127.0.0.1:{info['port']}/"):
                lab.url = f"http://127.0.0.1:{info['port']}/"
            elif proc.poll() is not None or time.monotonic() > deadline:
                state = (
                    f"exited with {proc.returncode}"
                    if proc.poll() is not None
                    else f"was not ready after {SERVER_START_S} s"
                )
                pytest.fail(f"JupyterLab {state}:\n{lab.log_tail()}")
            else:
                time.sleep(0.2)
        yield lab
    finally:
        _stop(proc, lab.url, dirs["jupyter-runtime"])
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(f"--- JupyterLab log (last lines) ---\n{lab.log_tail()}")


# The explorer's live form as the reader sees it. The image's bytes are read back from its
# (blob:) src, so that "redrawn" means new PNG bytes, not just a new URL for the same ones.
STATE_JS = """async (out) => {
    const live = out.querySelector('.afs-explorer-live');
    if (!live) return null;
    const img = live.querySelector('img');
    const label = live.querySelector(':scope > .widget-label');
    let digest = null, png = false;
    if (img && img.src) {
        const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
        png = [0x89, 0x50, 0x4e, 0x47].every((b, i) => bytes[i] === b);  // \x89PNG
        const hash = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
        digest = [...hash].map(b => b.toString(16).padStart(2, '0')).join('');
    }
    return {
        label: label ? label.textContent.trim() : null,
        src: img ? img.src : null,
        digest, png,
        decoded: img ? img.complete && img.naturalWidth > 0 : false,
    };
}"""

# Times (performance.now()) of the key press on the slider and of the image's and the
# label's next change, recorded in the page so that no round trip to Python is counted.
WATCH_JS = """(out) => {
    const live = out.querySelector('.afs-explorer-live');
    const img = live.querySelector('img');
    const label = live.querySelector(':scope > .widget-label');
    const t = {key: null, img: null, label: null};
    window.__afsTimes = t;
    live.addEventListener('keydown', () => { if (t.key === null) t.key = performance.now(); },
                          {capture: true});
    new MutationObserver(() => { if (t.img === null) t.img = performance.now(); })
        .observe(img, {attributes: true, attributeFilter: ['src']});
    new MutationObserver(() => { if (t.label === null) t.label = performance.now(); })
        .observe(label, {childList: true, characterData: true, subtree: true});
}"""


# True once the explorer's label reads `label` and its image shows a decoded src other than
# `old_src` (every live redraw gives the image a new blob: URL).
FRAME_SHOWN_JS = """([out, label, oldSrc]) => {
    const live = out.querySelector('.afs-explorer-live');
    const img = live.querySelector('img');
    return live.querySelector(':scope > .widget-label').textContent.trim() === label
        && img.src !== oldSrc && img.complete && img.naturalWidth > 0;
}"""


def _problems(tab: Tab) -> str:
    return (
        f"blocked requests: {tab.blocked}\nconsole errors: {tab.console_errors}\n"
        f"page errors: {tab.page_errors}"
    )


def _move(tab: Tab, out, key: str, label: str, old: dict) -> dict:
    """Press `key` on the focused slider; wait for `label` and a new image; the new state."""
    tab.page.keyboard.press(key)
    try:
        tab.page.wait_for_function(
            FRAME_SHOWN_JS, arg=[out.element_handle(), label, old["src"]], timeout=REDRAW_MS
        )
    except Exception as exc:
        raise AssertionError(
            f"{key} on the slider: no redraw to {label!r} within {REDRAW_MS} ms "
            f"(now {out.evaluate(STATE_JS)})\n{_problems(tab)}"
        ) from exc
    return out.evaluate(STATE_JS)


def test_jupyterlab_shows_only_the_live_slider_and_it_redraws(
    jupyterlab: Lab, tab_at: Callable[[str], Tab], capsys: pytest.CaptureFixture[str]
) -> None:
    t_start = time.perf_counter()
    tab = tab_at(jupyterlab.url)
    page = tab.page
    page.goto(f"{jupyterlab.url}lab/tree/{NOTEBOOK}?token={TOKEN}", wait_until="load")

    # The notebook is open and its kernel (our venv kernelspec) is idle: run its cell.
    page.wait_for_function(
        """(name) => {
            const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
            const kernel = w && w.sessionContext && w.sessionContext.session
                && w.sessionContext.session.kernel;
            return kernel && kernel.name === name && kernel.status === 'idle';
        }""",
        arg=KERNEL_NAME,
        timeout=KERNEL_MS,
    )
    t_open = time.perf_counter()
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    cell = page.locator(".jp-Notebook .jp-CodeCell").first
    page.wait_for_function(
        "(el) => /\\[\\d+\\]/.test(el.textContent)",  # "[1]:", not "[*]:"
        arg=cell.locator(".jp-InputArea-prompt").element_handle(),
        timeout=KERNEL_MS,
    )
    t_ran = time.perf_counter()
    bundles = page.evaluate("""() => window.jupyterapp.shell.currentWidget.content.widgets[0]
        .outputArea.model.toJSON().map(o => ({type: o.output_type, mimes: Object.keys(o.data || {}),
                                              error: o.traceback ? o.evalue : undefined}))""")
    assert not [b for b in bundles if b["type"] == "error"], f"the cell failed: {bundles}"

    # JupyterLab shows ONE output, rendered by the widget manager: the live explorer, and
    # neither the static slider nor the text/plain form beside or instead of it.
    outputs = cell.locator(".jp-OutputArea-output")
    # Every rendermime renderer but the widget manager's marks its node with data-mime-type
    # (a text/html or text/plain output's node is the .jp-OutputArea-output itself).
    other = cell.locator(
        ".jp-OutputArea-output[data-mime-type], .jp-OutputArea-output [data-mime-type]"
    )
    cell.locator(".jp-OutputArea-output .afs-explorer-live").or_(other).first.wait_for()
    assert other.count() == 0, (
        f"JupyterLab rendered {other.evaluate_all('els => els.map(e => e.dataset.mimeType)')} "
        f"instead of (or beside) the live widget\n{_problems(tab)}"
    )
    assert outputs.count() == 1, f"{outputs.count()} outputs shown for one explorer"
    out = outputs.first
    live = out.locator(".afs-explorer-live")
    live.wait_for(state="visible")
    assert page.locator(".afs-explorer").count() == 0, "a static slider (.afs-explorer) is shown"
    assert "SliderExplorer(" not in out.inner_text(), "the text/plain form is shown"
    # ...although the cell's one output carried both forms: the front end chose, as intended.
    assert [b["type"] for b in bundles] == ["execute_result"], f"the cell's outputs: {bundles}"
    assert {WIDGET_VIEW, "text/html"} <= set(bundles[0]["mimes"]), bundles

    # The live form: an ipywidgets slider, the "name = value" label and the first frame.
    assert "jupyter-widgets" in (live.get_attribute("class") or "").split()
    slider = live.locator(".widget-slider.widget-hslider")  # SelectionSlider (noUiSlider inside)
    assert slider.count() == 1, f"{slider.count()} ipywidgets sliders in the live explorer"
    assert slider.is_visible() and NAME in slider.inner_text(), "no visible slider named " + NAME
    handle = slider.locator(".noUi-handle")
    assert handle.count() == 1, "the slider has no handle a reader can move"
    first, second = (f"{NAME} = {v}" for v in VALUES[:2])
    start = out.evaluate(STATE_JS)
    assert start["label"] == first, start
    assert start["png"] and start["decoded"], f"the first frame is not a shown PNG: {start}"

    # One step right with the keyboard, like a reader: a new label and new PNG bytes...
    out.evaluate(WATCH_JS)
    handle.focus()
    moved = _move(tab, out, "ArrowRight", second, start)
    times = page.evaluate("() => window.__afsTimes")
    assert moved["label"] == second and moved["png"] and moved["decoded"], moved
    assert moved["digest"] != start["digest"], "the slider moved but the PNG bytes are the same"
    # ...and back: the first value's image again (the frame follows the value).
    back = _move(tab, out, "ArrowLeft", first, moved)
    assert back["digest"] == start["digest"], "moving back did not bring back the first frame"

    # Offline: the widget's JavaScript is the venv's, nothing came from another host.
    assert not tab.blocked and not tab.page_errors, _problems(tab)
    assert times["key"] is not None, "the key press did not reach the slider"
    with capsys.disabled():  # informational, not asserted: a busy machine is slower
        print(
            f"\nJupyterLab live slider: page + kernel start {t_open - t_start:.1f} s, cell "
            f"{t_ran - t_open:.1f} s, key -> new image {times['img'] - times['key']:.0f} ms, "
            f"key -> new label {times['label'] - times['key']:.0f} ms "
            f"(total {time.perf_counter() - t_start:.1f} s)"
        )
