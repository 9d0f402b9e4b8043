"""Every rank's every output against the reference's, on values made here (no processes)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from introspect.diff.parallel.outputs import rank_output_rows
from introspect.diff.tolerance import Tolerance


def _ranks(*outputs, layouts=None):
    return [SimpleNamespace(rank=r, outputs=o, output_layouts=(layouts or {}))
            for r, o in enumerate(outputs)]


def test_replicated_outputs_are_compared_on_every_rank():
    whole = torch.randn(2, 4, 8)
    wrong = whole.clone()
    wrong[0, 0, 0] += 1.0
    rows, faults = rank_output_rows(_ranks({"h": whole}, {"h": wrong}), {"h": whole},
                                    Tolerance())
    assert [(r.candidate_output, r.status) for r in rows] == [("h@rank0", "ok"),
                                                              ("h@rank1", "fail")]
    assert faults == ["rank 1's output h differs from the reference's h: max abs error 1 "
                      f"over its limit {rows[1].limit:.3g}"]


def test_uneven_plain_shards_are_joined_not_blamed():
    """A vocabulary of 11 over 2 ranks: 6 and 5 columns."""
    logits = torch.randn(2, 3, 11)
    ranks = _ranks({"logits": logits[..., :6]}, {"logits": logits[..., 6:]})
    rows, faults = rank_output_rows(ranks, {"logits": logits}, Tolerance())
    assert faults == []
    assert [(r.candidate_output, r.status) for r in rows] == [("logits (joined)", "ok")]


def test_shards_that_make_no_whole_are_blamed_on_the_rank():
    logits = torch.randn(2, 3, 11)
    ranks = _ranks({"logits": logits[..., :6]}, {"logits": logits[..., 7:]})
    _, faults = rank_output_rows(ranks, {"logits": logits}, Tolerance())
    assert faults == ["rank 1's output logits is (2, 3, 4), rank 0's (2, 3, 6)"]


def test_an_output_only_one_rank_returns_is_blamed():
    h = torch.randn(2, 4, 8)
    _, faults = rank_output_rows(_ranks({"h": h}, {"h": h, "extra": h}), {"h": h}, Tolerance())
    assert faults == ["rank 1 returns an output extra, which rank 0 does not"]


def test_nan_on_one_rank_fails_unless_allowed_where_the_reference_has_it():
    h = torch.randn(2, 4, 8)
    nan = h.clone()
    nan[1, 2, 3] = torch.nan
    _, faults = rank_output_rows(_ranks({"h": h}, {"h": nan}), {"h": h}, Tolerance())
    assert faults == ["rank 1's output h differs from the reference's h: NaN or Inf in 1 "
                      "value(s)"]
    _, faults = rank_output_rows(_ranks({"h": nan}, {"h": nan}), {"h": nan}, Tolerance(),
                                 allow_nonfinite=True)
    assert faults == []
