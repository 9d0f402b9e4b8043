"""Budgets per dtype, overrides, bad values, and how errors are measured."""

from __future__ import annotations

import math

import pytest
import torch

import introspect
from introspect.diff.ops.compare.padding import Padding
from introspect.diff.ops.compare.stats import measure
from introspect.diff.tolerance import Budget, Tolerance, compare_dtype, parse_tolerance
from introspect.errors import InputError


def test_defaults_follow_assert_close():
    assert Tolerance().budget("float32") == Budget(1e-5, 1.3e-6)
    assert Tolerance().budget("bfloat16") == Budget(1e-5, 1.6e-2)
    assert Tolerance().budget("float16") == Budget(1e-5, 1e-3)
    assert Tolerance().budget("int64") == Budget(0.0, 0.0)
    assert Tolerance(atol=1e-3).budget("float32") == Budget(1e-3, 1.3e-6)
    assert Tolerance().budget("float32", noise=1e-4) == Budget(4e-4, 1.3e-6)


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf, "1e-5", True])
def test_bad_tolerances_are_refused(value):
    with pytest.raises(InputError, match="atol must be"):
        Tolerance(atol=value)


@pytest.mark.parametrize("text", ["-1", "nan", "abc", "inf"])
def test_bad_tolerance_text_is_refused(text):
    with pytest.raises(InputError, match="--rtol must be"):
        parse_tolerance("--rtol", text)


def test_diff_refuses_a_negative_tolerance_before_any_work(tiny, port, inputs):
    with pytest.raises(InputError, match="rtol must be a finite number >= 0"):
        introspect.diff(tiny, port, inputs, rtol=-1e-3)


def test_compare_dtype_is_the_lower_precision():
    assert compare_dtype("float32", "bfloat16") == "bfloat16"
    assert compare_dtype("float64", "float32") == "float32"
    assert compare_dtype("int64", "int64") == "int64"


def test_measure_counts_mismatches_nans_and_relative_errors():
    ref = torch.tensor([[1.0, 2.0, 0.0, 4.0]])
    cand = torch.tensor([[1.0, 2.5, 1e-6, math.nan]])
    stats, exact = measure(cand, ref, Budget(1e-5, 0.0), None)
    assert not exact
    assert stats.max_abs == math.inf and stats.mismatched == 2 and stats.nonfinite == 1
    assert stats.max_rel == math.inf  # the NaN
    same, exact = measure(ref, ref.clone(), Budget(0.0, 0.0), None)
    assert exact and same.max_abs == 0.0 and same.mismatched == 0


def test_measure_splits_padding_from_real_tokens():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    padding = Padding(mask)
    ref = torch.zeros(2, 3, 4)
    cand = ref.clone()
    cand[1, 2] = 5.0  # error at the padded position only
    cand[0, 0, 0] = 1e-3
    stats, _ = measure(cand, ref, Budget(1e-5, 0.0), padding.mask_for(ref.shape))
    assert stats.max_abs == pytest.approx(1e-3) and stats.mismatched == 1
    assert stats.pad_max_abs == 5.0 and stats.pad_mismatched == 4
    assert stats.elements == 20
    scores = padding.mask_for((2, 4, 3, 3))  # (B, nh, S, S): both token axes
    assert scores.shape == (2, 1, 3, 3) and bool(scores[1, 0, 2, 0]) and bool(scores[1, 0, 0, 2])
    assert padding.mask_for((2, 4)) is None  # pooled: no token axis
    assert Padding(torch.ones(2, 3)).mask_for((2, 3, 4)) is None  # nothing padded
