"""The documentation site builds with warnings as errors (a broken link, a missing page, a
docstring the API page cannot read), and it holds every page of docs/."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mkdocs")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings")


def _hooks():
    spec = importlib.util.spec_from_file_location("mkdocs_hooks",
                                                  ROOT / "scripts" / "mkdocs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_strict_with_every_page(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(site)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1",
                               "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-4000:]
    pages = {p.stem for p in (ROOT / "docs").glob("*.md")} - {"PYPI"}
    for page in pages | {"changelog"}:
        assert (site / page / "index.html").is_file(), page
    home = (site / "index.html").read_text()
    assert "Quick start" in home and 'href="install/' in home  # the README, links resolved
    cli = (site / "cli" / "index.html").read_text()
    assert "introspect examples" in cli and "NO_COLOR" in cli
    api = (site / "api" / "index.html").read_text()
    for name in ("models.load.load_model", "graph.IntrospectGraph", "diff.result.DiffResult",
                 "testing.assert_parity", "attention.heads.compare_heads",
                 "dump.diff_dump"):
        assert f'id="introspect.{name}"' in api, name
    assert (site / "reports" / "minilm.png").is_file()


def test_a_page_not_in_the_navigation_is_added_under_more(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("index.md", "install.md", "devices.md", "PYPI.md"):
        (docs / name).write_text(f"# {name}\n")

    class Excluded:
        def match_file(self, name: str) -> bool:
            return name == "PYPI.md"

    config = {"docs_dir": str(docs), "nav": [{"Home": "index.md"},
                                             {"Recipes": [{"Install": "install.md"}]}],
              "exclude_docs": Excluded()}
    nav = _hooks().on_config(config)["nav"]
    assert nav[-1] == {"More": ["devices.md"]}


def test_links_are_written_for_github_and_made_right_for_the_site():
    hooks = _hooks()
    repo = hooks.repository()
    assert repo.startswith("https://")
    home = hooks.home_page("[Install](docs/install.md), [docs](docs/), [log](CHANGELOG.md), "
                           "[LICENSE](LICENSE), [x](examples/ci/my_port.py), "
                           "[site](https://example.org/x.md), [pic](reports/minilm.svg)")
    assert home == ("[Install](install.md), [docs](index.md), [log](changelog.md), "
                    f"[LICENSE]({repo}/blob/main/LICENSE), "
                    f"[x]({repo}/blob/main/examples/ci/my_port.py), "
                    "[site](https://example.org/x.md), [pic](reports/minilm.svg)")
    page = hooks._rewrite("[a](verdict.md#drift), [b](../examples/ci/), "
                          "[c](../reports/minilm.svg), [d](../README.md)", "docs")
    assert page == (f"[a](verdict.md#drift), [b]({repo}/tree/main/examples/ci), "
                    "[c](reports/minilm.svg), [d](index.md)")
