"""The layer table of a PASS that module evidence proved with no op-level recording.

Without a recording there are no node rows; each reference layer's row then comes from the
module rows judged in it (``evidence.ModuleDiff``): how many module calls were compared,
the worst local error among them and which module it was. The propagated error of a
layer's output was not measured (NaN); the outputs' errors are in ``DiffResult.outputs``.
"""

from __future__ import annotations

import dataclasses
import math

from introspect.diff.modules.evidence import ModuleDiff, ModuleEvidence
from introspect.diff.ops.align import Alignment
from introspect.diff.records import STATUS_FAIL, STATUS_OK, LayerDiff


@dataclasses.dataclass(frozen=True)
class ModulesOnly:
    """What stands for the node-level part of a result that has none."""

    layers: list[LayerDiff]
    alignment: Alignment  # empty: nothing was recorded or aligned


def modules_only(evidence: ModuleEvidence) -> ModulesOnly:
    """One layer row per reference layer that module evidence judged, in the order met."""
    by_layer: dict[str, list[ModuleDiff]] = {}
    for row in evidence.rows:
        if row.status in (STATUS_OK, STATUS_FAIL) and row.max_abs_err is not None:
            by_layer.setdefault(row.layer, []).append(row)
    layers = []
    for layer, rows in by_layer.items():
        worst = max(rows, key=lambda r: (r.max_abs_err or 0.0) / (r.limit or math.inf))
        failing = sum(r.status == STATUS_FAIL for r in rows)
        layers.append(LayerDiff(
            layer, worst.reference_module, math.nan,
            max(r.max_abs_err or 0.0 for r in rows),
            f"{worst.candidate_module or 'the model'} ({worst.reference_module})",
            len(rows), failing, 0, not failing))
    return ModulesOnly(layers, Alignment([], [], [], []))


__all__ = ["ModulesOnly", "modules_only"]
