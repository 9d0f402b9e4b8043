"""Every example runs as it is, as a user would run it (a fresh Python process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=600)


def test_trace_to_table(tmp_path):
    done = run(str(EXAMPLES / "trace_to_table.py"), str(tmp_path / "nodes.csv"))
    assert done.returncode == 0, done.stderr
    assert "bert_encoder_layer_0_attention_self_query" in done.stdout
    assert "(2, 8, 12, 32)" in done.stdout  # the head split of MiniLM: 12 heads of 32
    assert (tmp_path / "nodes.csv").read_text().startswith("index,name,op,")


def test_draw_to_svg(tmp_path):
    done = run(str(EXAMPLES / "draw_to_svg.py"), str(tmp_path))
    assert done.returncode == 0, done.stderr
    overview = (tmp_path / "minilm_overview.svg").read_text()
    assert "×6" in overview and "[CLS]" in overview
    assert "×4" in (tmp_path / "minilm_layers_0_and_5.svg").read_text()


def test_diff_two_checkpoints_names_the_nudged_layer():
    done = run(str(EXAMPLES / "diff_two_checkpoints.py"))
    assert done.returncode == 1, done.stderr  # the nudged copy must fail parity
    assert "first divergence: encoder_layer_2_intermediate_dense" in done.stdout
    assert "encoder.layer.2.intermediate.dense.bias differs" in done.stdout


def test_assert_parity_in_a_users_suite():
    done = run("-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLES / "test_my_port.py"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


@pytest.mark.parametrize("recipe", ["github-actions.yml", "gitlab-ci.yml", "pre-commit-hooks.yaml"])
def test_ci_recipes_run_the_real_diff_command(recipe):
    text = (EXAMPLES / "ci" / recipe).read_text()
    assert "introspect diff" in text
    assert "torch==2.13.0" in text or recipe == "pre-commit-hooks.yaml"
