"""What the backward diff returns: rows per node and per weight, the first divergence.

``BackwardResult`` is ``DiffResult.backward``: its ``nodes`` and ``parameters`` tables, a
summary for the terminal, the JSON report's part.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from introspect.diff.status import status_word

if TYPE_CHECKING:
    import pandas

STATUS_OK, STATUS_DRIFT, STATUS_FAIL = "ok", "drift", "fail"
STATUS_NOT_COMPARED = "not compared"


@dataclass(frozen=True)
class GradientDiff:
    """One row of ``BackwardResult.nodes``: an aligned pair's gradients."""

    reference_node: str
    candidate_node: str
    module: str
    layer: str
    op: str
    shape: str
    max_abs_err: float | None  # propagated: each side's own backward
    max_rel_err: float | None
    reference_max_abs: float | None  # the reference gradient's largest magnitude
    local_max_abs_err: float | None  # this node's backward on the reference's values
    pad_max_abs_err: float | None  # at padded positions (tokens axis known only)
    atol: float | None  # |cand - ref| <= atol + rtol * |ref|, atol already scaled
    rtol: float | None
    status: str
    hint: str
    reference_index: int


@dataclass(frozen=True)
class ParameterGradient:
    """One row of ``BackwardResult.parameters``: a weight's gradient on both sides."""

    reference: str  # parameter path in the reference
    candidate: str  # parameter path(s) in the candidate ("a + b" when several)
    relation: str  # same, transposed, slice, fused, ...
    shape: str
    max_abs_err: float | None
    max_rel_err: float | None
    reference_max_abs: float
    sgd_max_abs_err: float | None  # the weights after one SGD step (lr SGD_LR)
    status: str
    hint: str


@dataclass(frozen=True)
class BackwardDivergence:
    """The first node (from the outputs) whose local backward is over budget, or a weight."""

    reference_node: str
    candidate_node: str
    module: str
    layer: str
    op: str
    local_max_abs_err: float
    budget: str
    hints: tuple[str, ...]
    parameter: str = ""  # set when the divergence is a weight's gradient, not a node's
    candidate_module: str = ""  # the candidate's module (``module`` is the reference's)


@dataclass
class BackwardResult:
    """Gradient parity of a candidate against a reference (``DiffResult.backward``)."""

    passed: bool
    loss: str  # which loss ("masked-lm", "user", ...)
    reference_loss: float
    candidate_loss: float
    rows: list[GradientDiff]
    parameter_rows: list[ParameterGradient]
    first_divergence: BackwardDivergence | None
    sgd_max_abs_err: float
    notes: list[str] = field(default_factory=list)
    # a FAIL only by gradients over their budgets, which the reference's own rounding
    # noise may explain; False where it fails otherwise (a loss NaN or cut from the
    # weights, a gradient whose local backward could not run)
    by_budget: bool = True

    @property
    def nodes(self) -> pandas.DataFrame:
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.rows],
                            columns=list(GradientDiff.__dataclass_fields__))

    @property
    def parameters(self) -> pandas.DataFrame:
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.parameter_rows],
                            columns=list(ParameterGradient.__dataclass_fields__))

    def summary(self) -> str:
        verdict = "gradient parity holds" if self.passed else "gradient parity FAILS"
        failing = sum(r.status == STATUS_FAIL for r in self.parameter_rows)
        drifting = sum(r.status == STATUS_DRIFT for r in self.parameter_rows)
        drift = f", {drifting} drift" if drifting else ""
        lines = [f"backward ({self.loss} loss: reference {self.reference_loss:.6g}, candidate "
                 f"{self.candidate_loss:.6g}): {verdict}; {len(self.rows)} node gradients, "
                 f"{len(self.parameter_rows)} parameters ({failing} failing{drift}), one SGD "
                 f"step max abs error {self.sgd_max_abs_err:.3g}"]
        d = self.first_divergence
        if d is not None:
            theirs = f"; the candidate's {d.candidate_module}" \
                if d.candidate_module and d.candidate_module != d.module else ""
            where = f"parameter {d.parameter} (in {d.layer or d.module}{theirs})" \
                if d.parameter else (f"{d.reference_node} -> {d.candidate_node} "
                                     f"({d.op} in {d.module or d.layer}{theirs})")
            lines.append(f"first backward divergence: {where}, max abs error "
                         f"{d.local_max_abs_err:.3g} over budget {d.budget}")
            lines += [f"  hint: {h}" for h in d.hints]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def parameter_table(self, limit: int = 0) -> str:
        """The parameter rows as fixed-width text (failing first when ``limit`` cuts)."""
        rows = sorted(self.parameter_rows, key=lambda r: r.status != STATUS_FAIL) if limit \
            else self.parameter_rows
        lines = [f"{'parameter':<48} {'max_abs_err':>11} {'max_rel':>9} {'status':<12} "
                 "candidate"]
        for r in rows[:limit or None]:
            lines.append(f"{r.reference:<48} {_num(r.max_abs_err):>11} {_num(r.max_rel_err):>9} "
                         f"{status_word(r.status):<12} {r.candidate}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        d = self.first_divergence
        return {"passed": self.passed, "loss": self.loss, "reference_loss": self.reference_loss,
                "candidate_loss": self.candidate_loss, "sgd_max_abs_err": self.sgd_max_abs_err,
                "first_divergence": asdict(d) if d is not None else None,
                "nodes": [asdict(r) for r in self.rows],
                "parameters": [asdict(r) for r in self.parameter_rows], "notes": self.notes}


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}"


__all__ = ["STATUS_DRIFT", "STATUS_FAIL", "STATUS_NOT_COMPARED", "STATUS_OK",
           "BackwardDivergence", "BackwardResult", "GradientDiff", "ParameterGradient"]
