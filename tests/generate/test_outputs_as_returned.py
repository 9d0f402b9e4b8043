"""A decoder's logits are compared as it returned them, at every step (issue 34, R1): a
port that changes them after its last recorded op (in place, a NaN, a bias on one token)
fails at that step, and the exit code, the result and the JSON agree."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import introspect
from introspect.cli.main import main

from .conftest import PROMPT


class EditsLogits(torch.nn.Module):
    """A copy of the reference whose returned logits are edited from step ``at`` on."""

    def __init__(self, reference: torch.nn.Module, at: int, edit: str):
        super().__init__()
        self.inner = copy.deepcopy(reference)
        self.at, self.edit, self.step = at, edit, -1

    def forward(self, input_ids, **keywords):
        out = self.inner(input_ids=input_ids, **keywords)
        self.step = 0 if input_ids.shape[-1] > 1 else self.step + 1
        if self.step >= self.at:
            if self.edit == "nan":
                out.logits[..., 3] = float("nan")
            else:
                out.logits[..., 7] += 1.0
        return out


@pytest.mark.parametrize("at, edit", [(0, "nan"), (2, "nan"), (2, "bias")])
def test_logits_edited_after_the_last_op_fail_at_their_step(gpt2, at, edit):
    result = introspect.diff(gpt2, EditsLogits(gpt2, at, edit), {"input_ids": PROMPT},
                             generate=4)
    assert not result.passed
    assert [row.passed for row in result.step_rows] == [step < at for step in range(4)]
    divergence = result.first_divergence
    assert divergence is not None and divergence.step == at
    assert "changed after the model's last recorded op" in divergence.detail


def test_a_copy_of_the_reference_passes(gpt2):
    result = introspect.diff(gpt2, EditsLogits(gpt2, 99, "nan"), {"input_ids": PROMPT},
                             generate=4)
    assert result.passed


def test_the_exit_code_and_the_json_agree(tmp_path, capsys):
    port = tmp_path / "nan_port.py"
    port.write_text(
        "import copy, torch\n"
        "class P(torch.nn.Module):\n"
        "    def __init__(self, m):\n"
        "        super().__init__(); self.m = copy.deepcopy(m); self.n = -1\n"
        "    def forward(self, input_ids, **kw):\n"
        "        out = self.m(input_ids=input_ids, **kw)\n"
        "        self.n = 0 if input_ids.shape[-1] > 1 else self.n + 1\n"
        "        if self.n >= 2:\n"
        "            out.logits[..., 3] = float('nan')\n"
        "        return out\n"
        "def build(reference):\n"
        "    return P(reference.model)\n")
    report = tmp_path / "r.json"
    code = main(["diff", "--model", "llama-tiny", "--head", "causal-lm", "--text",
                 "The cat sat on", "--candidate", f"{port}:build", "--generate", "3",
                 "--json", str(report), "--quiet"])
    capsys.readouterr()
    found = json.loads(report.read_text())
    assert code == 1 and found["passed"] is False
    assert found["first_divergence"]["step"] == 2
