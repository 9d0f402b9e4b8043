"""The tests' numeric bounds (tests/bounds.py), their margin log, and make test's second pass."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import bounds
from tests.bounds import above, below, close, longest_reduction, rounding_bound

ROOT = Path(__file__).resolve().parent.parent


def test_the_bound_grows_with_the_reduction_the_scale_and_the_dtype():
    assert rounding_bound("float64", 1, 1.0, safety=1) == 2.0**-53
    assert rounding_bound("float64", 30522, 2.0) == pytest.approx(10 * 30522 * 2.0**-53 * 2)
    assert rounding_bound("float32", 100, 1.0) / rounding_bound("float64", 100, 1.0) == 2.0**29


def test_the_longest_reduction_of_bert_tiny_is_its_vocabulary():
    class Config:
        vocab_size, intermediate_size, hidden_size = 30522, 512, 128

    assert longest_reduction(Config(), tokens=16) == 30522
    assert longest_reduction(object(), tokens=16) == 16  # no sizes known: the tokens


def test_each_bound_is_logged_with_its_margin(tmp_path, monkeypatch):
    import torch

    log = tmp_path / "bounds.jsonl"
    monkeypatch.setenv(bounds.LOG, str(log))
    assert below(1e-7, 1e-5, "upper") and not below(2e-5, 1e-5)
    assert above(torch.tensor(1e-3, dtype=torch.float64), 1e-4, "fault")  # a tensor too
    ref = torch.tensor([1.0, 100.0], dtype=torch.float64)
    assert close(ref + torch.tensor([0.0, 5e-5]), ref, rtol=1e-6, atol=0.0, what="allclose")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["what"] for r in rows] == ["upper", "", "fault", "allclose"]
    assert [r["margin"] for r in rows[:3]] == pytest.approx([100.0, 0.5, 10.0])
    assert rows[3]["margin"] == pytest.approx(2.0, rel=1e-3)  # 1e-4 budget, 5e-5 used
    assert rows[0]["test"].endswith("test_each_bound_is_logged_with_its_margin")


def test_nothing_is_logged_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(bounds.LOG, raising=False)
    monkeypatch.chdir(tmp_path)
    assert below(1.0, 2.0)
    assert list(tmp_path.iterdir()) == []


def test_make_test_runs_the_numeric_tests_again_on_another_cpu_path():
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^test: setup\n((?:\t.*\n)+)", makefile, re.M).group(1)
    path = re.search(r"^NUMERIC_CPU_PATH := (.*)$", makefile, re.M).group(1).split()
    assert "ATEN_CPU_CAPABILITY=default" in path
    assert "env $(NUMERIC_CPU_PATH) $(BIN)/python -m pytest -m numeric -q" in recipe
    assert recipe.count("-eq 5 ]") == 2  # no test collected fails either pass
    # the variable really changes ATen's kernels (an unknown value would be ignored)
    env = dict(os.environ, **dict(p.split("=", 1) for p in path))
    done = subprocess.run([sys.executable, "-c", "import torch; print("
                           "torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())"],
                          capture_output=True, text=True, env=env, check=True)
    assert done.stdout.split() == ["DEFAULT", "1"]
