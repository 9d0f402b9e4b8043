"""MkDocs hooks for the documentation site (mkdocs.yml names this file).

- Every ``docs/*.md`` that ``nav`` does not list is added under "More", so a page written
  later (``docs/devices.md``, say) is in the site without an edit here, and ``--strict``
  still fails on a page ``nav`` names that does not exist.
- ``README.md`` becomes the home page ``index.md`` and ``CHANGELOG.md`` the page
  ``changelog.md``: one text for GitHub and the site.
- Links are written as GitHub reads them and rewritten for the site: from the README,
  ``docs/x.md`` is ``x.md``; from a page, ``../reports/x.svg`` is the site's own copy of
  the picture; a link to any other file of the repository (``../examples/ci/my_port.py``,
  ``LICENSE``) goes to that file in the repository (``[project.urls] Homepage``).
- The pictures under ``reports/`` become files of the site at ``reports/...``, so pages
  show the same files the README does, with no copy to drift.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
REPORT_FILES = ("*.svg", "*.png")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def repository() -> str:
    """The repository's address, from pyproject.toml's ``[project.urls] Homepage``."""
    found = re.search(r'^Homepage = "([^"]+)"', (ROOT / "pyproject.toml").read_text("utf-8"),
                      re.M)
    assert found is not None, "pyproject.toml has no [project.urls] Homepage"
    return found.group(1).rstrip("/")


def site_link(target: str, folder: str) -> str | None:
    """The site's link for ``target`` as written in a file of ``folder`` ("" for the
    repository's root, "docs" for a page), or None to leave it as it is."""
    if target.startswith(("http://", "https://", "#", "mailto:")):
        return None
    path, _, anchor = target.partition("#")
    resolved = posixpath.normpath(posixpath.join(folder, path)) if path else folder
    suffix = f"#{anchor}" if anchor else ""
    if resolved == "docs":
        return f"index.md{suffix}"
    if resolved.startswith("docs/"):
        return None if folder == "docs" else resolved.removeprefix("docs/") + suffix
    if resolved == "CHANGELOG.md":
        return f"changelog.md{suffix}"
    if resolved == "README.md":
        return f"index.md{suffix}"
    if resolved.startswith("reports/") and resolved.endswith((".svg", ".png")):
        return resolved + suffix if folder == "" else None  # a page's ../reports: below
    kind = "tree" if (ROOT / resolved).is_dir() else "blob"
    return f"{repository()}/{kind}/main/{resolved}{suffix}"


def _rewrite(markdown: str, folder: str) -> str:
    def link(match: re.Match[str]) -> str:
        target = site_link(match.group(2), folder)
        return match.group(0) if target is None else f"[{match.group(1)}]({target})"
    text = _LINK.sub(link, markdown)
    return text.replace("](../reports/", "](reports/") if folder == "docs" else text


def home_page(readme: str) -> str:
    """The README as the site's home page, its links resolved from the repository's root."""
    return _rewrite(readme, "")


def _listed(nav: Any) -> set[str]:
    """The page paths ``nav`` names, at any depth."""
    found: set[str] = set()
    if isinstance(nav, str):
        found.add(nav)
    elif isinstance(nav, dict):
        for value in nav.values():
            found |= _listed(value)
    elif isinstance(nav, list):
        for item in nav:
            found |= _listed(item)
    return found


def on_config(config: Any) -> Any:
    docs = Path(config["docs_dir"])
    excluded = config.get("exclude_docs")
    listed = _listed(config["nav"])
    more = [page.name for page in sorted(docs.glob("*.md")) if page.name not in listed
            and not (excluded is not None and excluded.match_file(page.name))]
    if more:
        config["nav"].append({"More": more})
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """A page's links as GitHub reads them, made right for the site (see above). Raw HTML
    (``<img src="../reports/...">``) is right as it is: each page is served from a folder
    of its own."""
    if page.file.src_uri in ("index.md", "changelog.md"):
        return markdown  # generated below, from the repository's root
    return _rewrite(markdown, "docs")


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "index.md",
                                content=home_page((ROOT / "README.md").read_text("utf-8"))))
    changelog = _rewrite((ROOT / "CHANGELOG.md").read_text("utf-8"), "")
    files.append(File.generated(config, "changelog.md", content=changelog))
    for pattern in REPORT_FILES:
        for path in sorted((ROOT / "reports").glob(pattern)):
            files.append(File.generated(config, f"reports/{path.name}", abs_src_path=str(path)))
    return files
