"""Joining ranks' values by value, on small tensors (no process is started)."""

from __future__ import annotations

import torch

from introspect.diff.parallel.join import (
    CONCATENATED,
    PER_RANK,
    REPLICATED,
    SUMMED,
    join_ranks,
)


def _reference():
    generator = torch.Generator().manual_seed(0)
    return {"hidden": torch.randn(2, 5, 8, generator=generator),
            "heads": torch.randn(2, 4, 5, 3, generator=generator)}


def test_each_way_of_holding_a_value_is_found():
    ref = _reference()
    part = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    ranks = [{"same": ref["hidden"].clone(), "cols": ref["hidden"][..., :4],
              "heads": ref["heads"][:, :2], "partial": part},
             {"same": ref["hidden"].clone(), "cols": ref["hidden"][..., 4:],
              "heads": ref["heads"][:, 2:], "partial": ref["hidden"] - part}]
    joined = join_ranks(ranks, ["same", "cols", "heads", "partial"], ref)
    kinds = {name: (j.kind, j.dim) for name, j in joined.joins.items()}
    assert kinds == {"same": (REPLICATED, None), "cols": (CONCATENATED, 2),
                     "heads": (CONCATENATED, 1), "partial": (SUMMED, None)}
    assert torch.equal(joined.dump.values["heads"], ref["heads"])


def test_placements_decide_where_a_dtensor_said_them():
    ref = _reference()
    ranks = [{"x": ref["hidden"][:1]}, {"x": ref["hidden"][1:]}]
    joined = join_ranks(ranks, ["x"], ref, placements={"x": ["Shard(0)"]})
    assert joined.joins["x"].kind == CONCATENATED and joined.joins["x"].dim == 0
    assert str(joined.joins["x"]).endswith("(DTensor Shard(0))")


def test_ranks_that_should_agree_but_do_not_are_kept_apart():
    ref = _reference()
    wrong = ref["hidden"].clone()
    wrong[0, 0, 0] += 1.0
    joined = join_ranks([{"x": ref["hidden"].clone()}, {"x": wrong}], ["x"], ref)
    assert sorted(joined.joins) == ["x@rank0", "x@rank1"]
    assert {j.kind for j in joined.joins.values()} == {PER_RANK}
    assert joined.joins["x@rank1"].rank == 1
