"""The URLs a built page should carry, derived from `_config.yml` only.

Every launch, edit, issue, repository and download URL of the book comes from the single
`repository: {url, branch, path_to_book}` setting (plus the launch-button hosts). The
browser suite checks the built book against these; tests/book/test_config_urls.py checks that
changing the setting re-points them all. Not a test module: a helper both of them import.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import yaml

ROOT = Path(__file__).resolve().parents[2]


def load_config(path: Path = ROOT / "_config.yml") -> dict:
    return yaml.safe_load(path.read_text())


def toc_entries(path: Path = ROOT / "_toc.yml") -> list[str]:
    """Every document of `_toc.yml` (root first), e.g. ``book/01_qkv``, in reading order."""
    toc = yaml.safe_load(path.read_text())
    entries = [toc["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                entries.append(node["file"])
            for key in ("parts", "chapters", "sections"):
                walk(node.get(key, []))
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    return entries


def owner_and_repo(repository_url: str) -> tuple[str, str]:
    """``https://github.com/OWNER/REPO`` (optionally ``.git`` or ``/``) -> (OWNER, REPO)."""
    parsed = urlparse(repository_url)
    parts = parsed.path.strip("/").removesuffix(".git").split("/")
    if parsed.netloc != "github.com" or len(parts) != 2 or not all(parts):
        raise ValueError(
            f"repository.url must be https://github.com/OWNER/REPO, got {repository_url!r}"
        )
    return parts[0], parts[1]


@dataclass(frozen=True)
class PageUrls:
    repository: str
    edit: str
    issues_prefix: str
    download: str  # relative to the built HTML root
    binder: str | None  # notebooks only
    colab: str | None  # notebooks only


def expected_urls(config: dict, docname: str, suffix: str) -> PageUrls:
    """The URLs the page built from ``docname + suffix`` (e.g. ``book/01_qkv``, ``.ipynb``) should carry."""
    repo = config["repository"]
    url = repo["url"].rstrip("/").removesuffix(".git")
    branch = repo["branch"]
    owner, name = owner_and_repo(url)
    # The path of the source file inside the repository.
    path = posixpath.normpath(posixpath.join(repo.get("path_to_book") or ".", docname + suffix))
    launch = config.get("launch_buttons", {})
    notebook = suffix == ".ipynb"
    binder = colab = None
    if notebook and launch.get("binderhub_url"):
        ui = {"jupyterlab": "lab/tree", "classic": "tree"}[
            launch.get("notebook_interface", "classic")
        ]
        binder = f"{launch['binderhub_url'].rstrip('/')}/v2/gh/{owner}/{name}/{branch}?urlpath={ui}/{path}"
    if notebook and launch.get("colab_url"):
        colab = f"{launch['colab_url'].rstrip('/')}/github/{owner}/{name}/blob/{branch}/{path}"
    return PageUrls(
        repository=url,
        edit=f"{url}/edit/{branch}/{path}",
        issues_prefix=f"{url}/issues/new?title=Issue%20on%20page%20%2F{docname}.html",
        download=f"_sources/{docname}{suffix}",
        binder=binder,
        colab=colab,
    )


def source_suffix(docname: str, root: Path = ROOT) -> str:
    for suffix in (".ipynb", ".md"):
        if (root / f"{docname}{suffix}").exists():
            return suffix
    raise FileNotFoundError(f"_toc.yml lists {docname}, which has no .ipynb or .md source")
