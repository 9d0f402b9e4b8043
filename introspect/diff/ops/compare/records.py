"""What the side-by-side replay returns: per-pair errors, layouts and snapshots."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from introspect.diff.records import ErrorStats
from introspect.diff.tolerance import Budget


@dataclass(frozen=True)
class Snapshot:
    """What hints need about an over-budget pair: its inputs and both outputs."""

    pair_index: int
    inputs: tuple[Any, ...]  # what the candidate's node ran on in local mode (reference values)
    local_output: torch.Tensor  # the candidate's node on the reference's inputs (ref layout)
    reference_output: torch.Tensor
    row_errors: tuple[float, ...]  # local max abs error per batch row (real tokens)


@dataclass
class RunResult:
    """Per-pair errors, where layouts were adjusted, and snapshots of failing pairs."""

    propagated: dict[int, ErrorStats] = field(default_factory=dict)
    local: dict[int, ErrorStats] = field(default_factory=dict)
    layouts: dict[int, str] = field(default_factory=dict)  # pair index -> "permute (0, 2, 1, 3)"
    errors: dict[int, str] = field(default_factory=dict)  # pair index -> why it was not compared
    snapshots: dict[int, Snapshot] = field(default_factory=dict)
    # pair index -> its budget where the run set it: an int8 Linear's, from its input
    budgets: dict[int, Budget] = field(default_factory=dict)
    # Each side's outputs as replayed ("reference", "candidate"): the only values kept.
    outputs: dict[str, Any] = field(default_factory=dict)
    # pair index -> the feature order the run found or carried for it (candidate feature j
    # is reference feature order[j]: ``Pair.feature_order``), where its pair named none
    orders: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # pair index -> its candidate's rows or tokens in another order (``Pair.axis_order``)
    axis_orders: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = \
        field(default_factory=dict)
