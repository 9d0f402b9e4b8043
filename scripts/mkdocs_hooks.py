"""MkDocs hooks for the documentation site (mkdocs.yml names this file).

- Every ``docs/*.md`` that ``nav`` does not list is added under "More", so a page written
  later (``docs/devices.md``, say) is in the site without an edit here, and ``--strict``
  still fails on a page ``nav`` names that does not exist.
- ``README.md`` becomes the home page ``index.md`` (its links into ``docs/`` made relative,
  links to other files of the repository left as their text), and ``CHANGELOG.md`` the
  page ``changelog.md``: one text for GitHub and the site.
- The pictures and reports under ``reports/`` become files of the site at
  ``reports/...``, so pages show the same files the README does, with no copy to drift;
  a page links them as ``../reports/...`` (right on GitHub), rewritten for the site.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
REPORT_FILES = ("*.svg", "*.png")


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


def home_page(readme: str) -> str:
    """The README as the site's home page: links resolved from ``docs/``."""
    def link(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if target.startswith(("http://", "https://", "#")):
            return match.group(0)
        if target.startswith("docs/"):
            return f"[{text}]({target.removeprefix('docs/') or 'index.md'})"
        if target == "CHANGELOG.md":
            return f"[{text}](changelog.md)"
        return text  # a file of the repository: not part of the site
    return re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", link, readme)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """A link to ``../reports/x.svg`` (from docs/, as GitHub reads it) is to the site's
    ``reports/x.svg``; raw HTML (``<img src="../reports/...">``) is right as it is, since
    each page is served from a folder of its own."""
    return markdown.replace("](../reports/", "](reports/")


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "index.md",
                                content=home_page((ROOT / "README.md").read_text("utf-8"))))
    files.append(File.generated(config, "changelog.md",
                                content=(ROOT / "CHANGELOG.md").read_text(encoding="utf-8")))
    for pattern in REPORT_FILES:
        for path in sorted((ROOT / "reports").glob(pattern)):
            files.append(File.generated(config, f"reports/{path.name}", abs_src_path=str(path)))
    return files
