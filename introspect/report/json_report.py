"""The diff as JSON: the contract of shared/DESIGN.md, versioned.

Schema (version 1)::

    {"schema_version": 1, "tool": "introspect 0.1.0",
     "passed": bool,
     "reference": str, "candidate": str,
     "first_divergence": null | {"reference_node", "candidate_node", "module", "layer",
                                 "op", "local_max_abs_err", "budget", "hints": [str]},
     "tolerance": {"atol": float|null, "rtol": float|null, "noise_budget": bool,
                   "defaults": {dtype: {"rtol", "atol"}}},
     "summary": {"pairs", "coverage", "max_abs_err", "ok", "drift", "fail",
                 "unmatched", "skipped"},
     "nodes": [every field of NodeDiff, per aligned pair or unmatched node],
     "layers": [every field of LayerDiff, and "status": pass, FAIL, drift or n/a;
                an n/a layer (nothing compared) has null errors],
     "outputs": [every field of OutputDiff: each output of the truth runs, per call],
     "modules": [every field of ModuleDiff: module evidence, per candidate module call],
     "coverage": [every field of Uncovered: a region op-level evidence did not cover,
                  why, and the module evidence that covered it],
     "rests_on_modules": bool (a PASS that module evidence carried somewhere),
     "notes": [str]}

Numbers that are not finite (an infinite relative error, a NaN) are written as the
strings "inf", "-inf" and "nan", so the file stays strict JSON.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from introspect.diff.records import STATUS_SKIPPED
from introspect.diff.status import WORD_NA, layer_statuses
from introspect.diff.tolerance import DEFAULTS
from introspect.report.generation import generation_json
from introspect.version import __version__

if TYPE_CHECKING:
    from introspect.diff.result import DiffResult

SCHEMA_VERSION = 1


def backward_dict(result: DiffResult) -> Any:
    from introspect.report.backward_report import backward_dict as section

    return section(result)


def report_dict(result: DiffResult) -> dict[str, Any]:
    """The report as plain Python values (what ``json_report`` serialises)."""
    d = result.first_divergence
    counts = result.counts()
    return _finite({
        "schema_version": SCHEMA_VERSION,
        "tool": f"introspect {__version__}",
        "passed": result.passed,
        "reference": result.reference_label,
        "candidate": result.candidate_label,
        "first_divergence": None if d is None else {**asdict(d), "hints": list(d.hints)},
        "tolerance": {"atol": result.tolerance.atol, "rtol": result.tolerance.rtol,
                      "noise_budget": result.noise_budget,
                      "defaults": {k: {"rtol": r, "atol": a} for k, (r, a) in DEFAULTS.items()}},
        "summary": {"pairs": counts["pairs"], "coverage": result.alignment.coverage,
                    **_dump_coverage(result.alignment),
                    "max_abs_err": result.max_abs_err,
                    **{k: v for k, v in counts.items() if k != "pairs"}},
        "nodes": [asdict(r) for r in result.rows if r.status != STATUS_SKIPPED],
        "layers": [_layer_dict(r, word)
                   for r, word in zip(result.layer_rows, layer_statuses(result), strict=True)],
        "outputs": [asdict(r) for r in getattr(result, "output_rows", [])],
        **_module_evidence(result),
        "notes": list(result.notes),
        **generation_json(result),  # steps, caches, generated: with --generate only
        **({"backward": backward_dict(result)} if result.backward is not None else {}),
    })


def _module_evidence(result: DiffResult) -> dict[str, Any]:
    """Module evidence's rows and the regions it covered (empty lists where none ran)."""
    evidence = getattr(result, "module_evidence", None)
    rows = [asdict(r) for r in evidence.rows] if evidence is not None else []
    uncovered = [asdict(u) for u in evidence.uncovered] if evidence is not None else []
    return {"modules": rows, "coverage": uncovered,
            "rests_on_modules": bool(getattr(result, "rests_on_modules", False))}


def _layer_dict(row: Any, word: str) -> dict[str, Any]:
    """A layer's fields and status word; with nothing compared (n/a) its errors are null,
    not 0."""
    layer = {**asdict(row), "status": word}
    if word == WORD_NA:
        layer.update(max_abs_err=None, local_max_abs_err=None)
    return layer


def _dump_coverage(alignment: Any) -> dict[str, Any]:
    """A dump diff's coverage both ways (reference nodes paired, dumped tensors paired)."""
    text = getattr(alignment, "coverage_text", None)
    if text is None:
        return {}
    return {"coverage_text": text, "reference_nodes": alignment.reference_nodes,
            "reference_nodes_paired": alignment.reference_paired,
            "dump_tensors": len(alignment.matches), "dump_tensors_paired": len(alignment.pairs)}


def json_report(result: DiffResult) -> str:
    """The report as indented, strict JSON text."""
    return json.dumps(report_dict(result), indent=1, allow_nan=False) + "\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
