"""A rank's replay: each kept node's value as this rank holds it, read without a collective.

``introspect.dump.capture.record_values`` keeps a node's value as ``value.detach().clone()``.
On a DTensor that is an op of its own, which DTensor dispatches: for a pending
``Partial`` placement it may first redistribute. A vocab-parallel embedding
(``RowwiseParallel`` on an ``nn.Embedding``) leaves its output as ``_MaskPartial``, whose
mask of the ids outside this rank's rows lives in a buffer that the first reduction
releases; the clone was that reduction, so the replay's own all-reduce a node later found
the buffer empty (``AssertionError`` in ``_MaskPartial._reduce_value``, exit 2).

Here a DTensor's local shard is copied instead (``_local_tensor``: no dispatch, no
collective), and a pending mask is applied to the copy (zeros where the ids fall in another
rank's rows, as the reduction will do), so that the ranks' copies sum to the whole lookup.
The placements are kept beside the values, for the join.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


class _LocalRecorder(torch.fx.Interpreter):
    """Runs a recorded graph once; keeps the chosen nodes' local values and placements.

    A leaf module's node runs its ``forward`` alone: the graph already holds what the
    module's hooks did (DTensor's conversions among them), as nodes of their own.
    """

    def __init__(self, gm: torch.fx.GraphModule, keep: set[str]) -> None:
        super().__init__(gm)
        self.keep = keep
        self.kept: dict[str, torch.Tensor] = {}
        self.placements: dict[str, list[str] | None] = {}

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        return self.fetch_attr(target).forward(*args, **kwargs)

    def run_node(self, n: torch.fx.Node) -> Any:
        value = super().run_node(n)
        if n.name in self.keep and isinstance(value, torch.Tensor):
            self.kept[n.name] = local_copy(value)
            self.placements[n.name] = placements(value)
        return value


def record_local_values(gm: torch.fx.GraphModule, input_names: Sequence[str],
                        inputs: Mapping[str, torch.Tensor], keep: set[str]
                        ) -> tuple[dict[str, torch.Tensor], dict[str, list[str] | None]]:
    """Run ``gm`` on ``inputs``: the kept nodes' local values, and their placements."""
    recorder = _LocalRecorder(gm, keep)
    with torch.no_grad():
        recorder.run(*[inputs[n] for n in input_names])
    return recorder.kept, recorder.placements


def local_copy(value: torch.Tensor) -> torch.Tensor:
    """A copy of this rank's part of ``value``, as a plain tensor, made without dispatch."""
    local = getattr(value, "_local_tensor", None)
    if not isinstance(local, torch.Tensor):
        return value.detach().clone()
    copy = local.detach().clone()
    for placement in getattr(value, "placements", ()):
        buffer = getattr(placement, "mask_buffer", None)
        if buffer is not None and getattr(buffer, "data", None) is not None:
            buffer.apply_mask(copy)  # the ids in other ranks' rows: zero here
    return copy


def placements(value: Any) -> list[str] | None:
    """A DTensor's placements on its (1-D) mesh: ``Shard(d)``, ``Partial``, ``Replicate``."""
    found = getattr(value, "placements", None)
    if found is None:
        return None
    shown = []
    for p in found:
        if p.is_shard():
            shown.append(f"Shard({p.dim})")
        elif p.is_partial():
            shown.append("Partial")
        else:
            shown.append("Replicate")
    return shown
