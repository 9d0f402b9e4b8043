"""``DiffResult``: what ``introspect.diff`` returns, as tables, text and HTML.

The result holds records only (``introspect.diff.records``); pandas frames are built on
demand, at the edge.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from introspect.diff.ops.align import Alignment
from introspect.diff.records import (
    PROVEN_STRUCTURE,
    STATUS_DRIFT,
    STATUS_FAIL,
    STATUS_OK,
    STATUS_SKIPPED,
    STATUS_UNCONFIRMED,
    STATUS_UNMATCHED,
    Divergence,
    LayerDiff,
    NodeDiff,
    OutputDiff,
    error_words,
)
from introspect.diff.status import (
    STATUS_LEGEND,
    WORD_FAIL,
    WORD_NA,
    layer_statuses,
    status_legend,
    status_word,
)
from introspect.diff.tolerance import Tolerance
from introspect.graph import IntrospectGraph

if TYPE_CHECKING:
    import pandas

_FAIL_STYLE = "background-color:#f8d7da"
_DRIFT_STYLE = "background-color:#fff3cd"
_UNMATCHED_STYLE = "color:#777"


class PairsSummary(Protocol):
    """What tables and reports read of an alignment: its pairs and its coverage."""

    @property
    def pairs(self) -> Sequence[object]: ...

    @property
    def coverage(self) -> float: ...


def divergence_where(d: Any) -> str:
    """Where a divergence is, in words: its op in the reference's module (its layer when no
    module is known), with the candidate's module beside it where that is named otherwise:
    ``Linear in encoder.layer.1.intermediate.dense; the candidate's layers.1.up``."""
    where = f"{d.op} in {d.module or d.layer}"
    theirs = getattr(d, "candidate_module", "")
    if theirs and theirs != (d.module or d.layer):
        where += f"; the candidate's {theirs}"
    return where


def backward_divergence(d: Any) -> Divergence:
    """A ``BackwardDivergence`` as the result's ``first_divergence`` (``phase`` "backward"),
    for a diff whose forward holds: the divergence that decided the verdict."""
    return Divergence(d.reference_node, d.candidate_node, d.module, d.layer, d.op,
                      d.local_max_abs_err, d.budget, tuple(d.hints),
                      f"the gradient of parameter {d.parameter}" if d.parameter else "",
                      phase="backward", candidate_module=getattr(d, "candidate_module", ""))


@dataclass
class DiffResult:
    """Node-by-node comparison of a candidate against a reference.

    Attributes:
        passed: no aligned node's local error is over budget.
        first_divergence: the divergence that decided the verdict: the first node, in the
            reference's graph order, whose local error is over budget, with hints at known
            causes; where only the gradients differ (backward), the backward's first
            divergence (``phase`` "backward"); None when parity holds.
        rows: one ``NodeDiff`` per aligned pair and per node without counterpart, in the
            reference's graph order (candidate-only nodes after the node they feed), then
            the skipped nodes (shape bookkeeping, constants).
        layer_rows: one ``LayerDiff`` per layer of the reference.
        alignment: the pairs and the reasons, as ``align_graphs`` found them (for a dump,
            where each dumped tensor went: ``introspect.dump.dump_diff.DumpAlignment``).
        reference, candidate: the traced graphs (with the shapes of this run); None for
            a side that is a file of activations rather than a model.
        notes: what a user should know (dtype, inputs a model does not take, ...).
    """

    passed: bool
    first_divergence: Divergence | None
    rows: list[NodeDiff]
    layer_rows: list[LayerDiff]
    alignment: Alignment | PairsSummary
    reference: IntrospectGraph | None  # None where a side is a file (introspect.dump)
    candidate: IntrospectGraph | None
    tolerance: Tolerance
    notes: list[str] = field(default_factory=list)
    reference_label: str = "reference"
    candidate_label: str = "candidate"
    noise_budget: bool = False
    # With generate (``introspect.diff.generation``): rows are the divergent step's (else
    # the prefill's); one StepDiff per step, one CacheDiff per layer's keys/values per step.
    step_rows: list[Any] = field(default_factory=list)
    cache_rows: list[Any] = field(default_factory=list)
    generated: Any = None  # a generation.records.Generated

    @property
    def steps(self) -> pandas.DataFrame:
        """One row per decoding step (empty without generate): tokens, logits error, the
        step's first divergent node, its cache finding and hints."""
        from introspect.diff.generation.tables import steps_frame

        return steps_frame(self.step_rows)

    @property
    def caches(self) -> pandas.DataFrame:
        """Each layer's cached keys and values after each step, compared by value."""
        from introspect.diff.generation.tables import caches_frame

        return caches_frame(self.cache_rows)

    # Gradient parity (``diff(..., backward=True)``): an ``introspect.diff.backward.
    # BackwardResult``, None when only the forward was compared.
    backward: Any = None
    # The truth runs (``introspect.run.truth``): each output of both models' plain calls,
    # with autograd on and under no_grad (``introspect.diff.outputs``); what decides.
    output_rows: list[OutputDiff] = field(default_factory=list)

    @property
    def outputs(self) -> pandas.DataFrame:
        """One row per output and call of the truth runs: the values that decide the
        verdict (``reference_output``, ``candidate_output``, ``call``, ``max_abs_err``,
        ``limit``, ``status``)."""
        import pandas as pd

        from introspect.report.notebook import highlighted

        return highlighted(pd.DataFrame([asdict(r) for r in self.output_rows],
                                        columns=list(OutputDiff.__dataclass_fields__)))
    # A tensor-parallel candidate (``introspect.diff.parallel``): a ``ParallelRun``.
    parallel: Any = None
    # (reference node, candidate node) -> elements per decade of the local and of the
    # propagated |cand - ref| (``introspect.diff.histogram``): diff.html draws them.
    histograms: dict[tuple[str, str], tuple[tuple[int, ...], tuple[int, ...]]] = \
        field(default_factory=dict)
    # What a replay of the two recordings needs (``introspect.diff.repro.ReplaySource``):
    # the inputs, budgets and padding; None where the diff ran no recordings side by side.
    replay: Any = field(default=None, repr=False)
    # Module evidence (tier 2, ``introspect.diff.modules.ModuleEvidence``): each candidate
    # module of the plain calls on the reference's inputs to it; None where none was taken.
    module_evidence: Any = field(default=None, repr=False)
    # False: a PASS the outputs and module evidence proved, nothing recorded or replayed
    # (``diff(..., nodes=False)``): no node rows, the layers from the module rows.
    op_level: bool = True
    # The reference's module op-level evidence was taken inside alone (a FAIL module
    # evidence proved, ``diff(..., nodes=False)``: ``flow.inside``); "": both whole models.
    inside: str = ""

    @property
    def modules(self) -> pandas.DataFrame:
        """One row per candidate module call that module evidence paired: its reference
        module and layer, its local error, noise and budget, its status
        (``introspect.diff.modules.ModuleDiff``)."""
        from introspect.diff.modules import ModuleEvidence

        return (self.module_evidence or ModuleEvidence()).frame()

    @property
    def coverage(self) -> pandas.DataFrame:
        """Each region of the candidate's plain call that op-level evidence did not cover,
        why (compiled, TorchScript, a worker thread, vmap, a grad-mode branch, outside
        autograd, a recording that does not reproduce the call), and the module whose
        evidence covered it (``covered_by``, ``status``; "" where none did)."""
        from introspect.diff.modules import ModuleEvidence

        return (self.module_evidence or ModuleEvidence()).coverage_frame()

    @property
    def rests_on_modules(self) -> bool:
        """A PASS that module evidence carried somewhere the recording could not see."""
        evidence = self.module_evidence
        return bool(self.passed and evidence is not None and evidence.leaned_on)

    def write_repro(self, folder: Any) -> list[Any]:
        """After a FAIL, write ``repro.py`` and ``inputs.safetensors`` into ``folder``: a
        script that needs torch and safetensors only, runs both sides' ops at the first
        divergence on the values recorded there, prints each one's error and exits 1
        when they part (``introspect.diff.repro``). Returns the paths written.

        Raises:
            NothingToReproduce: parity holds, or the failure is not at a node.
            InputError: ``folder`` cannot be written (nothing is).
        """
        from introspect.diff.repro import write_repro

        return write_repro(self, folder)

    @property
    def parameters(self) -> pandas.DataFrame:
        """With ``backward=True``: one row per weight, its gradient on both sides."""
        if self.backward is None:
            raise AttributeError("parameters: run introspect.diff(..., backward=True)")
        return self.backward.parameters

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
        """One row per layer: its output's error, its worst node, its status (pass, FAIL,
        drift or n/a: ``STATUS_LEGEND``)."""
        import pandas as pd

        from introspect.report.notebook import highlighted

        frame = pd.DataFrame([asdict(r) for r in self.layer_rows],
                             columns=list(LayerDiff.__dataclass_fields__))
        frame["status"] = layer_statuses(self)
        # a layer with nothing compared has no error, not an error of 0 (blank in CSV)
        frame.loc[frame["status"] == WORD_NA, ["max_abs_err", "local_max_abs_err"]] = math.nan
        return highlighted(frame)

    def draw(self, depth: Any = None, **options: Any) -> Any:
        """The reference's drawing coloured by local error (a graphviz.Digraph; shows itself
        in Jupyter). Options as ``introspect.render.draw_graph``."""
        from introspect.report.overlay import overlay_digraph

        return overlay_digraph(self, depth=depth, **options)

    @property
    def failing(self) -> list[NodeDiff]:
        return [r for r in self.rows if r.status == STATUS_FAIL]

    @property
    def replay_reproduced(self) -> bool:
        """Each side's replay computed what its recording did (else its node values, and
        anything else traced from the model, decide nothing: ``ops.explain``)."""
        from introspect.diff.ops.explain import UNREPRODUCED

        return not any(UNREPRODUCED in note for note in self.notes)

    @property
    def max_abs_err(self) -> float:
        """The largest propagated error over all aligned pairs (real tokens) and the
        outputs of the truth runs; a guessed pair's whose values disagree is left out
        unless it fails, confirmed (it may hold another quantity: the view of a product
        compared less its bias)."""
        rows: list[Any] = [*self.rows, *self.output_rows]
        errors = [r.max_abs_err for r in rows
                  if r.max_abs_err is not None and r.status != STATUS_UNCONFIRMED
                  and (getattr(r, "provenance", "") != PROVEN_STRUCTURE
                       or r.status == STATUS_FAIL)]
        return max(errors, default=0.0)

    def counts(self) -> dict[str, int]:
        """Rows per status, and pairs."""
        counts = {s: 0 for s in (STATUS_OK, STATUS_DRIFT, STATUS_FAIL, STATUS_UNCONFIRMED,
                                 STATUS_UNMATCHED, STATUS_SKIPPED)}
        for r in self.rows:
            counts[r.status] += 1
        counts["pairs"] = len(self.alignment.pairs)
        return counts

    def summary(self) -> str:
        """A few lines of plain text: verdict, first divergence and hints, coverage."""
        coverage = getattr(self.alignment, "coverage_text", None) or \
            f"{self.alignment.coverage:.0%} of the reference's tensor nodes aligned"
        compared = f"{len(self.alignment.pairs)} pairs, {coverage}"
        if self.inside:
            compared = (f"{len(self.alignment.pairs)} pairs inside {self.inside} alone, the "
                        "smallest module over its budget")
        if not self.op_level:
            judged = sum(r.status == STATUS_OK for r in self.module_evidence.rows)
            compared = (f"{judged} module pairs within budget; outputs and module evidence, "
                        "no op-level recording")
        lines = [f"{self.candidate_label} vs {self.reference_label}: {self.verdict} "
                 f"({'the forward holds: ' if self.failed_in == 'backward' else ''}"
                 f"max abs error {self.max_abs_err:.3g}; {compared})"]
        d = self.first_divergence
        if d is not None and d.phase == "forward":  # the backward's says it below
            lines.append(f"first divergence: {d.reference_node} -> {d.candidate_node} "
                         f"({divergence_where(d)}), {error_words(d)} "
                         f"{d.local_max_abs_err:.3g} over budget {d.budget}")
            if d.detail:
                lines.append(f"  detail: {d.detail}")
            lines += [f"  hint: {h}" for h in d.hints]
        if self.step_rows:
            from introspect.diff.generation.tables import step_summary

            lines[1:1] = step_summary(self)
        lines += [f"note: {n}" for n in self.notes]
        if self.backward is not None:
            lines.append(self.backward.summary())
        return "\n".join(lines)

    @property
    def failed_in(self) -> str:
        """What failed: "" when parity holds, else "forward", "backward" or "step K"."""
        if self.passed:
            return ""
        d = self.first_divergence
        if d is not None and d.phase == "backward":
            return "backward"
        step = d.step if d is not None else next(
            (r.step for r in self.step_rows if not r.passed), None)
        if self.step_rows and step is not None:
            return f"step {step}"
        forward_holds = d is None and not self.failing and not any(
            r.status == STATUS_FAIL for r in self.output_rows)
        if forward_holds and self.backward is not None and not self.backward.passed:
            return "backward"
        return "forward"

    @property
    def verdict(self) -> str:
        """``parity holds``, or ``parity FAILS in the forward`` (``in the backward``,
        ``at step K`` of a generation): the headline's words."""
        where = self.failed_in
        if not where:
            return "parity holds"
        return f"parity FAILS {'at' if where.startswith('step') else 'in the'} {where}"

    def layer_table(self) -> str:
        """The per-layer table as fixed-width text (for terminals and assertion messages)."""
        header = f"{'layer':<18} {'max_abs_err':>11} {'local_max':>11} {'nodes':>5} " \
                 f"{'fail':>4}  {'status':<6} worst node"
        lines = [header]
        for r, word in zip(self.layer_rows, layer_statuses(self), strict=True):
            errors = (f"{r.max_abs_err:>11.3g} {r.local_max_abs_err:>11.3g}" if word != WORD_NA
                      else f"{WORD_NA:>11} {WORD_NA:>11}")  # nothing compared: no error
            lines.append(f"{r.layer:<18} {errors} {r.nodes:>5} {r.failing:>4}  {word:<6} "
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
        parts.append(html_table(self.layers))
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
        style = (_FAIL_STYLE if status in (STATUS_FAIL, WORD_FAIL, False) else
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


__all__ = ["STATUS_LEGEND", "DiffResult", "backward_divergence", "divergence_where", "html_table",
           "layer_statuses", "status_legend", "status_word"]
