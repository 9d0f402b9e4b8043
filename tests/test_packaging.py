"""Packaging a user can install: a free distribution name, a licence, a tested transformers
range, an sdist whose own tests run, and --version that says what a bug report needs."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_distribution_name_license_and_classifiers():
    assert PROJECT["name"] == "introspect-bert"  # "introspect" on PyPI is another project
    assert PROJECT["scripts"] == {"introspect": "introspect.cli.main:main"}
    assert PROJECT["license"] == "MIT"
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License") and "the introspect authors" in licence
    classifiers = set(PROJECT["classifiers"])
    assert {"Typing :: Typed", "Programming Language :: Python :: 3.11",
            "Intended Audience :: Developers"} <= classifiers


def test_transformers_range_is_bounded_and_both_ends_have_a_tox_env():
    spec = next(d for d in PROJECT["dependencies"] if d.startswith("transformers"))
    low = re.search(r">=([\d.]+)", spec)
    high = re.search(r"<([\d.]+)", spec)
    assert low and high, spec
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    assert f"transformers=={low.group(1)}.*" in tox["testenv:oldest"]["commands_pre"]
    assert f"transformers>=5,<{high.group(1)}" in tox["testenv:newest"]["commands_pre"]
    assert {"oldest", "newest"} <= set(tox["tox"]["envlist"].replace(" ", "").split(","))


def test_version_lists_the_dependencies_a_bug_report_needs():
    done = subprocess.run([sys.executable, "-m", "introspect", "--version"], capture_output=True,
                          text=True, check=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = done.stdout.splitlines()
    assert lines[0].startswith("introspect 0.") and "(introspect-bert)" in lines[0]
    assert lines[1].startswith("Python 3.")
    assert re.match(r"torch \d", lines[2]) and re.match(r"transformers \d", lines[3])
    assert lines[4].startswith("Graphviz dot ")
    if shutil.which("dot"):
        assert re.match(r"Graphviz dot \d+\.\d+", lines[4])


@pytest.mark.slow
def test_sdist_carries_its_tests_and_they_run(tmp_path):
    pytest.importorskip("build")
    source = tmp_path / "source"  # build from a copy: the build leaves egg-info behind
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".tox", "*.egg-info", "__pycache__", ".*_cache", "reports"))
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir",
                    str(tmp_path / "dist"), str(source)], check=True, capture_output=True,
                   timeout=600)
    (archive,) = (tmp_path / "dist").glob("introspect_bert-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        tar.extractall(tmp_path / "unpacked", filter="data")
    assert {"LICENSE", "tests/conftest.py", "tests/fixtures/candidates.py",
            "tests/diff/golden/bert_tiny_scratch.md", "examples/ci/my_port.py",
            "introspect/py.typed"} <= names
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/cli/test_ports.py::test_port_file_spec_passes",
         "tests/diff/test_reports.py::test_markdown_of_a_passing_bert_tiny_diff_is_stable",
         "tests/test_packaging.py::test_distribution_name_license_and_classifiers"],
        cwd=unpacked, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(unpacked)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
