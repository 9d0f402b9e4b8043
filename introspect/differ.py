"""``introspect.diff``: node-by-node parity between two implementations of one model.

The flow (shared/DESIGN.md): trace both models, align their graphs (``align``), run them
side by side measuring every pair (``compare``), and turn the measurements into tables,
the first divergence and its likely cause (``hints``). Reports are written by
``introspect.report``; this module only returns values.

Example::

    >>> import introspect
    >>> loaded = introspect.load_model("bert-tiny")
    >>> port = introspect.scratch.BertModel.from_hf(loaded.model)
    >>> result = introspect.diff(loaded.model, port, introspect.tokenize(loaded.tokenizer))
    >>> result.passed, result.first_divergence
    (True, None)
    >>> result.layers[["layer", "max_abs_err", "passed"]].head(3)
            layer  max_abs_err  passed
    0      inputs          0.0    True
    1  embeddings          0.0    True
    2        mask          0.0    True
"""

from __future__ import annotations

import copy
import html
import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from introspect.align import Alignment, align_graphs
from introspect.compare import Padding, RunResult, run_side_by_side
from introspect.diff_records import (
    STATUS_DRIFT,
    STATUS_FAIL,
    STATUS_OK,
    STATUS_SKIPPED,
    STATUS_UNMATCHED,
    Divergence,
    LayerDiff,
    NodeDiff,
)
from introspect.errors import InputError
from introspect.graph import MASK_NOTE, IntrospectGraph
from introspect.hints import explain
from introspect.load import TokenizedInputs
from introspect.records import NodeRecord
from introspect.shapes import node_records
from introspect.tolerance import Budget, Tolerance, compare_dtype
from introspect.tracer import trace_module

if TYPE_CHECKING:
    import pandas

_FAIL_STYLE = "background-color:#f8d7da"
_DRIFT_STYLE = "background-color:#fff3cd"
_UNMATCHED_STYLE = "color:#777"


@dataclass
class DiffResult:
    """Node-by-node comparison of a candidate against a reference.

    Attributes:
        passed: no aligned node's local error is over budget.
        first_divergence: the first node, in the reference's graph order, whose local
            error is over budget, with hints at known causes; None when parity holds.
        rows: one ``NodeDiff`` per aligned pair and per node without counterpart, in the
            reference's graph order (candidate-only nodes after the node they feed), then
            the skipped nodes (shape bookkeeping, constants).
        layer_rows: one ``LayerDiff`` per layer of the reference.
        alignment: the pairs and the reasons, as ``align_graphs`` found them.
        reference, candidate: the traced graphs (with the shapes of this run).
        notes: what a user should know (dtype, inputs a model does not take, ...).
    """

    passed: bool
    first_divergence: Divergence | None
    rows: list[NodeDiff]
    layer_rows: list[LayerDiff]
    alignment: Alignment
    reference: IntrospectGraph
    candidate: IntrospectGraph
    tolerance: Tolerance
    notes: list[str] = field(default_factory=list)
    reference_label: str = "reference"
    candidate_label: str = "candidate"
    noise_budget: bool = False

    @property
    def nodes(self) -> pandas.DataFrame:
        """Aligned pairs and unmatched nodes, in graph order (skipped nodes left out)."""
        import pandas as pd

        from introspect.report.notebook import highlighted

        rows = [asdict(r) for r in self.rows if r.status != STATUS_SKIPPED]
        return highlighted(pd.DataFrame(rows, columns=list(NodeDiff.__dataclass_fields__)))

    @property
    def skipped(self) -> pandas.DataFrame:
        """Nodes not compared: shape bookkeeping (ints, sizes) and constants."""
        import pandas as pd

        rows = [asdict(r) for r in self.rows if r.status == STATUS_SKIPPED]
        return pd.DataFrame(rows, columns=list(NodeDiff.__dataclass_fields__))

    @property
    def layers(self) -> pandas.DataFrame:
        """One row per layer: its output's error, its worst node, pass or fail."""
        import pandas as pd

        from introspect.report.notebook import highlighted

        return highlighted(pd.DataFrame([asdict(r) for r in self.layer_rows],
                                        columns=list(LayerDiff.__dataclass_fields__)))

    def draw(self, depth: Any = None, **options: Any) -> Any:
        """The reference's drawing coloured by local error (a graphviz.Digraph; shows itself
        in Jupyter). Options as ``introspect.render.draw_graph``."""
        from introspect.report.overlay import overlay_digraph

        return overlay_digraph(self, depth=depth, **options)

    @property
    def failing(self) -> list[NodeDiff]:
        return [r for r in self.rows if r.status == STATUS_FAIL]

    @property
    def max_abs_err(self) -> float:
        """The largest propagated error over all aligned pairs (real tokens)."""
        return max((r.max_abs_err for r in self.rows if r.max_abs_err is not None), default=0.0)

    def counts(self) -> dict[str, int]:
        """Rows per status, and pairs."""
        counts = {s: 0 for s in (STATUS_OK, STATUS_DRIFT, STATUS_FAIL, STATUS_UNMATCHED,
                                 STATUS_SKIPPED)}
        for r in self.rows:
            counts[r.status] += 1
        counts["pairs"] = len(self.alignment.pairs)
        return counts

    def summary(self) -> str:
        """A few lines of plain text: verdict, first divergence and hints, coverage."""
        verdict = "parity holds" if self.passed else "parity FAILS"
        lines = [f"{self.candidate_label} vs {self.reference_label}: {verdict} "
                 f"(max abs error {self.max_abs_err:.3g}; {len(self.alignment.pairs)} pairs, "
                 f"{self.alignment.coverage:.0%} of the reference's tensor nodes aligned)"]
        d = self.first_divergence
        if d is not None:
            lines.append(f"first divergence: {d.reference_node} -> {d.candidate_node} "
                         f"({d.op} in {d.module or d.layer}), local max abs error "
                         f"{d.local_max_abs_err:.3g} over budget {d.budget}")
            lines += [f"  hint: {h}" for h in d.hints]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def layer_table(self) -> str:
        """The per-layer table as fixed-width text (for terminals and assertion messages)."""
        header = f"{'layer':<18} {'max_abs_err':>11} {'local_max':>11} {'nodes':>5} " \
                 f"{'fail':>4}  {'status':<6} worst node"
        lines = [header]
        for r in self.layer_rows:
            lines.append(f"{r.layer:<18} {r.max_abs_err:>11.3g} {r.local_max_abs_err:>11.3g} "
                         f"{r.nodes:>5} {r.failing:>4}  {'pass' if r.passed else 'FAIL':<6} "
                         f"{r.worst_node}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        verdict = ("<b style='color:#1a7f37'>parity holds</b>" if self.passed
                   else "<b style='color:#cf222e'>parity fails</b>")
        parts = [f"<p>{html.escape(self.candidate_label)} vs "
                 f"{html.escape(self.reference_label)}: {verdict}</p>"]
        d = self.first_divergence
        if d is not None:
            parts.append(f"<p>First divergence: <code>{html.escape(d.reference_node)}</code> "
                         f"({html.escape(d.op)} in {html.escape(d.module or d.layer)}), local "
                         f"max abs error {d.local_max_abs_err:.3g}</p>")
            parts += [f"<p>&rarr; {html.escape(h)}</p>" for h in d.hints]
        parts.append(html_table(self.layers, status_column="passed"))
        shown = self.nodes
        shown = shown[shown["status"].isin([STATUS_FAIL, STATUS_DRIFT])] if not self.passed \
            else shown.head(0)
        if len(shown):
            parts.append(f"<p>{len(shown)} node(s) over budget:</p>")
            parts.append(html_table(shown[_BRIEF_COLUMNS]))
        return "\n".join(parts)

    def __repr__(self) -> str:
        return f"DiffResult({self.summary().splitlines()[0]})"


_BRIEF_COLUMNS = ["reference_node", "candidate_node", "module", "layer", "op", "shape",
                  "max_abs_err", "local_max_abs_err", "atol", "rtol", "status", "note"]


def html_table(frame: pandas.DataFrame, *, status_column: str = "status") -> str:
    """A DataFrame as an HTML table, failing rows highlighted (no jinja2 needed)."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = []
    for _, row in frame.iterrows():
        status = row.get(status_column)
        style = (_FAIL_STYLE if status in (STATUS_FAIL, False) else
                 _DRIFT_STYLE if status == STATUS_DRIFT else
                 _UNMATCHED_STYLE if status in (STATUS_UNMATCHED, STATUS_SKIPPED) else "")
        cells = "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row)
        body.append(f"<tr style='{style}'>{cells}</tr>" if style else f"<tr>{cells}</tr>")
    return (f"<table class='introspect-diff'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


# ---------------------------------------------------------------------------------------
# Tracing for a diff


def _accepted_inputs(model: torch.nn.Module,
                     tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inputs ``model.forward`` takes by name (all of them when it takes ``**kwargs``)."""
    parameters = inspect.signature(model.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(tensors)
    return {name: t for name, t in tensors.items() if name in parameters}


def trace_for_diff(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor],
                   title: str) -> tuple[IntrospectGraph, dict[str, torch.Tensor]]:
    """Trace ``model``; its records hold the shapes seen while tracing (no run needed)."""
    accepted = _accepted_inputs(model, tensors)
    if not accepted:
        raise InputError(f"{type(model).__name__}.forward takes none of the inputs "
                         f"{', '.join(tensors)}")
    result = trace_module(model, accepted)
    records = node_records(result.gm)  # the shapes seen while tracing; the run refreshes them
    graph = IntrospectGraph(result.gm, records, result.input_names, result.output_names,
                            decisions=result.decisions, title=title)
    return graph, accepted


# ---------------------------------------------------------------------------------------
# The diff


def diff(reference: torch.nn.Module, candidate: torch.nn.Module,
         inputs: TokenizedInputs | Mapping[str, torch.Tensor], *,
         atol: float | None = None, rtol: float | None = None, noise_budget: bool = False,
         noise_factor: float = 4.0, name_map: Mapping[str, str] | None = None,
         reference_label: str = "", candidate_label: str = "") -> DiffResult:
    """Compare ``candidate`` with ``reference`` node by node on ``inputs``.

    Both models are traced with torch.fx, their graphs aligned on the weights they read
    (no name map needed), and run side by side; every aligned pair gets its propagated
    error (each model on its own) and its local error (the candidate's node fed the
    reference's values). Only per-node summaries are kept.

    Args:
        reference: the implementation trusted (HF ``BertFor*``, any ``nn.Module``).
        candidate: the implementation checked: any module holding the reference's weights
            (loaded through a key mapping, fused, transposed or cast), or another
            checkpoint of the same architecture.
        inputs: ``introspect.tokenize(...)`` output or a mapping of tensors by input name;
            each model gets the inputs its ``forward`` takes.
        atol, rtol: override the per-dtype budgets (``introspect.tolerance.DEFAULTS``).
        noise_budget: also run the reference in float64; each node's budget becomes
            ``noise_factor`` times its own noise in the candidate's dtype (its local error
            when the reference runs in that dtype, against float64), at least ``atol``.
        name_map: help for alignment: candidate node name -> reference node name, or
            candidate parameter path prefix -> reference prefix.
        reference_label, candidate_label: names for tables and reports.

    Returns:
        A ``DiffResult``.

    Raises:
        InputError: a tolerance that is negative or not a number; inputs a model cannot
            take; two models of different architectures or sizes.
        TraceError: a model torch.fx cannot trace.

    Example::

        >>> result = introspect.diff(hf_model, my_port, inputs)
        >>> result.first_divergence.layer
        'encoder.layer.3'
    """
    tolerance = Tolerance(atol=atol, rtol=rtol, noise_factor=noise_factor)
    tensors = _tensors(inputs)
    reference_label = reference_label or type(reference).__name__
    candidate_label = candidate_label or type(candidate).__name__
    modes = (reference.training, candidate.training)
    reference.eval()
    candidate.eval()
    try:
        noise: dict[str, float] | None = None
        notes: list[str] = []
        if noise_budget:
            reference, noise = _measure_noise(reference, candidate, tensors)
            notes.append("the reference ran in float64; each node's budget is at least "
                         f"{tolerance.noise_factor:g}x its own noise in the candidate's dtype")
        ref_graph, ref_inputs = trace_for_diff(reference, tensors, reference_label)
        cand_graph, cand_inputs = trace_for_diff(candidate, tensors, candidate_label)
        notes += _input_notes(tensors, ref_inputs, cand_inputs)
        alignment = align_graphs(ref_graph, cand_graph, name_map=name_map)
        budgets = _budgets(alignment, ref_graph, cand_graph, tolerance, noise)
        padding = Padding(tensors.get("attention_mask"))
        run = run_side_by_side(ref_graph.gm, cand_graph.gm, alignment.pairs, budgets,
                               ref_inputs, cand_inputs, padding=padding)
    finally:
        reference.train(modes[0])
        candidate.train(modes[1])
    ref_graph.records = node_records(ref_graph.gm)  # the shapes of this run, not the probe's
    cand_graph.records = node_records(cand_graph.gm)
    if any(r.layer == "mask" for r in ref_graph.records):
        ref_graph.notes.append(MASK_NOTE)
    notes += alignment.notes
    rows = _rows(alignment, run, budgets, ref_graph, cand_graph)
    layers = _layers(rows, ref_graph.records)
    divergence = _first_divergence(rows, alignment, run, ref_graph, cand_graph, padding,
                                   budgets)
    passed = divergence is None and not any(r.status == STATUS_FAIL for r in rows)
    return DiffResult(passed, divergence, rows, layers, alignment, ref_graph, cand_graph,
                      tolerance, notes, reference_label, candidate_label, noise_budget)


def _tensors(inputs: TokenizedInputs | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if isinstance(inputs, TokenizedInputs):
        return dict(inputs.tensors)
    if not isinstance(inputs, Mapping) or not inputs:
        raise InputError("diff needs inputs: introspect.tokenize(...) output or a non-empty "
                         f"mapping of input names to tensors, got {type(inputs).__name__}")
    bad = [k for k, v in inputs.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise InputError(f"inputs must be tensors; {', '.join(map(str, bad))} is not")
    return dict(inputs)


def _input_notes(tensors: Mapping[str, Any], ref_inputs: Mapping[str, Any],
                 cand_inputs: Mapping[str, Any]) -> list[str]:
    notes = []
    for side, taken in (("reference", ref_inputs), ("candidate", cand_inputs)):
        left = [n for n in tensors if n not in taken]
        if left:
            notes.append(f"the {side}'s forward takes no {', '.join(left)}; it ran without")
    return notes


def _measure_noise(reference: torch.nn.Module, candidate: torch.nn.Module,
                   tensors: Mapping[str, torch.Tensor]) -> tuple[torch.nn.Module, dict[str, float]]:
    """The reference in float64, and each of its nodes' noise in the candidate's dtype."""
    dtype = next((p.dtype for p in candidate.parameters() if p.is_floating_point()), torch.float32)
    exact = copy.deepcopy(reference).to(torch.float64).eval()
    rounded = copy.deepcopy(reference).to(dtype).eval()
    ref_graph, ref_inputs = trace_for_diff(exact, tensors, "float64")
    low_graph, low_inputs = trace_for_diff(rounded, tensors, str(dtype))
    alignment = align_graphs(ref_graph, low_graph)
    unlimited = [Budget(math.inf, 0.0)] * len(alignment.pairs)
    run = run_side_by_side(ref_graph.gm, low_graph.gm, alignment.pairs, unlimited,
                           ref_inputs, low_inputs, snapshots=0)
    noise: dict[str, float] = {}
    for i, pair in enumerate(alignment.pairs):
        stats = run.local.get(i)
        if stats is not None:
            noise[pair.reference] = max(noise.get(pair.reference, 0.0), stats.max_abs)
    return exact, noise


def _budgets(alignment: Alignment, reference: IntrospectGraph, candidate: IntrospectGraph,
             tolerance: Tolerance, noise: Mapping[str, float] | None) -> list[Budget]:
    ref_records = {r.name: r for r in reference.records}
    cand_records = {r.name: r for r in candidate.records}
    budgets = []
    for pair in alignment.pairs:
        dtype = compare_dtype(ref_records[pair.reference].dtype, cand_records[pair.candidate].dtype)
        if noise is not None and dtype == "float64":  # the candidate's dtype sets the noise
            dtype = cand_records[pair.candidate].dtype or dtype
        budgets.append(tolerance.budget(dtype, noise.get(pair.reference, 0.0)
                                        if noise is not None else None))
    return budgets


# ---------------------------------------------------------------------------------------
# Tables


def _shape_text(record: NodeRecord) -> str:
    return record.shapes or record.value


def _rows(alignment: Alignment, run: RunResult, budgets: Sequence[Budget],
          reference: IntrospectGraph, candidate: IntrospectGraph) -> list[NodeDiff]:
    ref_records = {r.name: r for r in reference.records}
    cand_records = {r.name: r for r in candidate.records}
    keyed: list[tuple[tuple[float, int, int], NodeDiff]] = []
    for i, pair in enumerate(alignment.pairs):
        ref, cand = ref_records[pair.reference], cand_records[pair.candidate]
        propagated, local = run.propagated.get(i), run.local.get(i)
        note = "; ".join(n for n in (pair.note, _region_note(pair), run.layouts.get(i, ""),
                                     run.errors.get(i, "")) if n)
        if propagated is None or local is None:
            status = STATUS_UNMATCHED
        elif local.mismatched:
            status = STATUS_FAIL
        elif propagated.mismatched:
            status = STATUS_DRIFT
        else:
            status = STATUS_OK
        shape = _shape_text(ref)
        if pair.reference_region is not None:
            shape = f"{shape}{pair.reference_region}"
        dtype = ref.dtype if ref.dtype == cand.dtype else f"{ref.dtype}/{cand.dtype}"
        row = NodeDiff(
            reference_node=ref.name, candidate_node=cand.name, module=ref.module,
            layer=ref.layer, op=ref.op_type, shape=shape, dtype=dtype,
            max_abs_err=propagated.max_abs if propagated else None,
            mean_abs_err=propagated.mean_abs if propagated else None,
            max_rel_err=propagated.max_rel if propagated else None,
            mismatched=propagated.mismatched if propagated else None,
            nonfinite=propagated.nonfinite if propagated else None,
            local_max_abs_err=local.max_abs if local else None,
            local_mean_abs_err=local.mean_abs if local else None,
            local_max_rel_err=local.max_rel if local else None,
            local_mismatched=local.mismatched if local else None,
            pad_max_abs_err=propagated.pad_max_abs if propagated else None,
            atol=budgets[i].atol, rtol=budgets[i].rtol, status=status,
            matched_by=pair.matched_by, note=note,
            reference_index=ref.index, candidate_index=cand.index,
        )
        keyed.append(((ref.index, 0, cand.index), row))
    cand_anchor = _candidate_positions(alignment, ref_records, cand_records, candidate)
    for u in [*alignment.unmatched, *alignment.skipped]:
        records = ref_records if u.graph == "reference" else cand_records
        record = records[u.node]
        row = NodeDiff(
            reference_node=u.node if u.graph == "reference" else "",
            candidate_node=u.node if u.graph == "candidate" else "",
            module=record.module, layer=record.layer, op=record.op_type,
            shape=_shape_text(record), dtype=record.dtype,
            max_abs_err=None, mean_abs_err=None, max_rel_err=None, mismatched=None,
            nonfinite=None, local_max_abs_err=None, local_mean_abs_err=None,
            local_max_rel_err=None, local_mismatched=None, pad_max_abs_err=None,
            atol=None, rtol=None, status=u.status, matched_by="", note=u.reason,
            reference_index=record.index if u.graph == "reference" else -1,
            candidate_index=record.index if u.graph == "candidate" else -1,
        )
        position = record.index if u.graph == "reference" else cand_anchor.get(u.node, math.inf)
        keyed.append(((position, 1 if u.graph == "candidate" else 0, record.index), row))
    keyed.sort(key=lambda item: (item[1].status == STATUS_SKIPPED, item[0]))
    return [row for _, row in keyed]


def _region_note(pair: Any) -> str:
    if pair.reference_region is not None:
        return f"compared with the reference's {pair.reference_region}"
    if pair.candidate_region is not None:
        return f"the candidate's {pair.candidate_region} compared"
    return ""


def _candidate_positions(alignment: Alignment, ref_records: Mapping[str, NodeRecord],
                         cand_records: Mapping[str, NodeRecord],
                         candidate: IntrospectGraph) -> dict[str, float]:
    """Where a candidate-only node sits in the reference's order: just before the next pair."""
    paired = sorted((cand_records[p.candidate].index, ref_records[p.reference].index)
                     for p in alignment.pairs)
    positions: dict[str, float] = {}
    for u in [*alignment.unmatched, *alignment.skipped]:
        if u.graph != "candidate":
            continue
        index = cand_records[u.node].index
        later = [ref for cand, ref in paired if cand > index]
        positions[u.node] = (min(later) - 0.5) if later else math.inf
    return positions


def _layers(rows: Sequence[NodeDiff], records: Sequence[NodeRecord]) -> list[LayerDiff]:
    order: dict[str, int] = {}
    for r in records:
        order.setdefault(r.layer, r.index)
    groups: dict[str, list[NodeDiff]] = {}
    unmatched: dict[str, int] = {}
    for row in rows:
        if row.status == STATUS_SKIPPED:
            continue
        if row.status == STATUS_UNMATCHED and not row.candidate_node:
            unmatched[row.layer] = unmatched.get(row.layer, 0) + 1
        if row.reference_node and row.candidate_node and row.local_max_abs_err is not None:
            groups.setdefault(row.layer, []).append(row)
    layers = []
    for layer in sorted(set(groups) | set(unmatched), key=lambda name: order.get(name, 1 << 30)):
        members = groups.get(layer, [])
        tensors = [m for m in members if m.max_abs_err is not None]
        output = max(tensors, key=lambda m: (m.reference_index, m.candidate_index), default=None)
        failing = [m for m in members if m.status == STATUS_FAIL]
        erring = [m for m in members if m.local_max_abs_err]
        worst = max(failing or erring, key=lambda m: (_over(m), m.local_max_abs_err or 0.0),
                    default=None)
        layers.append(LayerDiff(
            layer=layer,
            output_node=output.reference_node if output else "",
            max_abs_err=max((m.max_abs_err or 0.0 for m in tensors
                             if m.reference_index == output.reference_index), default=0.0)
            if output else 0.0,
            local_max_abs_err=max((m.local_max_abs_err or 0.0 for m in members), default=0.0),
            worst_node=worst.reference_node if worst else "",
            nodes=len(members), failing=len(failing), unmatched=unmatched.get(layer, 0),
            passed=not failing,
        ))
    return layers


def _over(row: NodeDiff) -> float:
    """How many times over budget a row's local error is (roughly, at its largest error)."""
    if row.local_max_abs_err is None or row.atol is None:
        return 0.0
    return row.local_max_abs_err / row.atol if row.atol > 0 else (
        math.inf if row.local_max_abs_err > 0 else 0.0)


def _first_divergence(rows: Sequence[NodeDiff], alignment: Alignment, run: RunResult,
                      reference: IntrospectGraph, candidate: IntrospectGraph,
                      padding: Padding, budgets: Sequence[Budget]) -> Divergence | None:
    first = next((r for r in rows if r.status == STATUS_FAIL), None)
    if first is None:
        return None
    index = next(i for i, p in enumerate(alignment.pairs)
                 if p.reference == first.reference_node and p.candidate == first.candidate_node)
    pair = alignment.pairs[index]
    padded_rows = tuple(bool(x) for x in padding.padded.any(dim=1)) \
        if padding.padded is not None else ()
    hints = explain(pair, reference, candidate, alignment.relations, run.snapshots.get(index),
                    padded_rows)
    return Divergence(first.reference_node, first.candidate_node, first.module, first.layer,
                      first.op, float(first.local_max_abs_err or 0.0), str(budgets[index]), hints)


__all__ = ["DiffResult", "diff", "html_table", "trace_for_diff"]
