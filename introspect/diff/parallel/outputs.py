"""Every rank's every output, compared: across the ranks, and with the reference's.

The joined diff compares the nodes that rank 0 computed; a value only another rank
returns, or returns in another shape, has no partner there and would never fail it
(a rank 1 that returns ``last_hidden_state[:, :-1]`` passed). So the outputs of each
rank's first truth run are checked on their own:

- every rank returns the same outputs, of the same (whole) shapes, as rank 0: otherwise
  the rank that differs is named;
- each rank's whole output is compared with the reference's (paired by name, then by
  shape, as the truth runs pair them: ``introspect.diff.outputs``), within the outputs'
  budget: NaN or Inf on one rank fails, naming it. An output each rank holds a part of
  (a DTensor ``Shard``/``Partial``, or a plain shard) is joined first and compared once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from introspect.diff.outputs import _compare, pair_outputs
from introspect.diff.records import CALL_AUTOGRAD, STATUS_FAIL, OutputDiff
from introspect.diff.tolerance import Tolerance


def rank_output_rows(ranks: Sequence[Any], reference: Mapping[str, torch.Tensor],
                     tolerance: Tolerance, *, allow_nonfinite: bool = False,
                     attention_mask: torch.Tensor | None = None
                     ) -> tuple[list[OutputDiff], list[str]]:
    """One row per rank and output paired with the reference's; the faults, each a
    sentence naming its rank.

    Args:
        ranks: the ``RankResult`` of every rank, in rank order.
        reference: the reference's outputs by name (one plain call).
    """
    shapes = {tuple(v.shape) for v in reference.values()}
    sharded = {name: dim for name in ranks[0].outputs
               if (dim := _shard_dim(name, ranks, shapes)) is not None}
    faults = _shape_faults(ranks, sharded)
    shared = [*_consistent(ranks), *sharded]
    joined = {name: value for name in shared
              if (value := _joined(name, ranks, shapes, sharded.get(name))) is not None}
    rows: list[OutputDiff] = []
    for result in ranks:
        # a joined output is compared once, with rank 0's; a whole one on every rank
        whole = {name: joined[name] if name in joined else result.outputs[name]
                 for name in shared if name not in joined or result.rank == 0}
        for ref_name, cand_name in pair_outputs(reference, whole):
            if not cand_name:
                continue
            shown = f"{cand_name} (joined)" if cand_name in joined else \
                f"{cand_name}@rank{result.rank}"
            row = _compare(CALL_AUTOGRAD, ref_name, reference[ref_name], shown,
                           whole[cand_name], tolerance, (), allow_nonfinite, attention_mask)
            rows.append(row)
            if row.status == STATUS_FAIL:
                who = f"the {len(ranks)} ranks' joined" if cand_name in joined else \
                    f"rank {result.rank}'s"
                why = row.note or (f"max abs error {row.max_abs_err:.3g} over its limit "
                                   f"{row.limit:.3g}")
                faults.append(f"{who} output {cand_name} differs from the reference's "
                              f"{ref_name}: {why}")
    return rows, faults


def _shape_faults(ranks: Sequence[Any], sharded: Mapping[str, int]) -> list[str]:
    """Outputs one rank returns and rank 0 does not (or the reverse), or in another shape
    (but for plain shards of uneven sizes, ``sharded``)."""
    first = ranks[0]
    faults = []
    for result in ranks[1:]:
        r = result.rank
        for name in first.outputs:
            if name not in result.outputs:
                faults.append(f"rank {r} returns no output {name}, which rank 0 returns")
        for name in result.outputs:
            if name not in first.outputs:
                faults.append(f"rank {r} returns an output {name}, which rank 0 does not")
            elif _shape(result, name) != _shape(first, name) and name not in sharded:
                faults.append(f"rank {r}'s output {name} is {_shape(result, name)}, "
                              f"rank 0's {_shape(first, name)}")
    return faults


def _consistent(ranks: Sequence[Any]) -> list[str]:
    """The outputs every rank returns in one shape (the others are faults already)."""
    first = ranks[0]
    return [name for name in first.outputs
            if all(name in r.outputs and _shape(r, name) == _shape(first, name) for r in ranks)]


def _shape(result: Any, name: str) -> tuple[int, ...]:
    """The output's whole shape: a DTensor's global one, else the local tensor's."""
    layout = result.output_layouts.get(name) or {}
    if layout.get("placements") and layout.get("shape") is not None:
        return tuple(layout["shape"])
    return tuple(result.outputs[name].shape)


def _shard_dim(name: str, ranks: Sequence[Any], shapes: set[tuple[int, ...]]) -> int | None:
    """The dim along which plain tensors of uneven sizes (a vocabulary that does not divide
    by the ranks) concatenate into a reference output's shape; None for anything else."""
    if any(name not in r.outputs or (r.output_layouts.get(name) or {}).get("placements")
           for r in ranks):
        return None
    held = [tuple(r.outputs[name].shape) for r in ranks]
    if len(set(held)) == 1 or len({len(h) for h in held}) != 1:
        return None
    differing = [d for d in range(len(held[0])) if len({h[d] for h in held}) > 1]
    if len(differing) != 1:
        return None
    dim = differing[0]
    whole = list(held[0])
    whole[dim] = sum(h[dim] for h in held)
    return dim if tuple(whole) in shapes else None


def _joined(name: str, ranks: Sequence[Any], shapes: set[tuple[int, ...]],
            dim: int | None = None) -> torch.Tensor | None:
    """The ranks' parts of an output joined into the whole, where each rank holds a part:
    by its DTensor placement, or plain shards (along ``dim`` when uneven) whose
    concatenation has the shape of a reference output that no rank's own value has. None
    where each rank holds the whole."""
    first = ranks[0].outputs[name]
    placement = ((ranks[0].output_layouts.get(name) or {}).get("placements") or [""])[0]
    parts = [r.outputs[name] for r in ranks]
    if dim is not None:
        return torch.cat(parts, dim=dim)
    if placement.startswith("Shard("):
        return torch.cat(parts, dim=int(placement[len("Shard("):-1]) % max(first.dim(), 1))
    if placement == "Partial":
        return torch.stack(parts).sum(0)
    if placement or tuple(first.shape) in shapes:
        return None
    for d in range(first.dim()):
        shape = list(first.shape)
        shape[d] *= len(ranks)
        if tuple(shape) in shapes:
            return torch.cat(parts, dim=d)
    return None
