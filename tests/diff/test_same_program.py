"""``modules.same_program``: a module's float32 and float64 runs held op by op, so that a
float64 run vouches only for the float32 program it reruns."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from introspect.diff.modules.precise import run_in_float64
from introspect.diff.modules.same_program import same_program


class Scaled(nn.Module):
    """A Linear whose output is scaled as ``how`` says (a port's dtype branch or not)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if self.how == "op_in_float32" and y.dtype == torch.float32:
            y = y * 1.00001
        if self.how == "number_by_dtype":
            y = y * (1.00001 if y.dtype == torch.float32 else 1.0)
        if self.how == "constant_by_dtype":
            y = y * torch.tensor(1.00001 if y.dtype == torch.float32 else 1.0)
        if self.how == "mask_by_finfo":
            y = y.masked_fill(y > 0.5, torch.finfo(y.dtype).min)
        if self.how == "constant":
            y = y * torch.tensor(0.1) + torch.full((8,), 0.3, dtype=y.dtype)
        if self.how == "weight_by_dtype":
            w = self.linear.weight
            w = w if y.dtype == torch.float32 else w.detach().clone()
            y = y @ w
        if self.how == "bfloat16_inside":  # (the same ops in both runs: float32's rounds)
            y = y.to(torch.bfloat16).to(y.dtype)
        return torch.softmax(y, dim=-1)


def _same(how: str) -> bool:
    torch.manual_seed(0)
    module = Scaled(how)
    x = torch.randn(3, 8)
    return same_program(module, [x], {}, False,
                        lambda run, given: run_in_float64(module, given, False, run))


@pytest.mark.parametrize("how", ["", "mask_by_finfo", "constant"])
def test_the_same_program_in_both_dtypes_is_the_same(how):
    assert _same(how)


@pytest.mark.parametrize("how", ["op_in_float32", "number_by_dtype", "constant_by_dtype",
                                 "weight_by_dtype", "bfloat16_inside"])
def test_a_program_that_branches_on_the_dtype_or_rounds_coarser_is_not(how):
    assert not _same(how)
