"""Records of a diff: the frozen rows that alignment, the side-by-side run and the reports share.

Alignment produces ``Pair`` and ``Unmatched``; the run turns each pair into a ``NodeDiff``
row; the layers are summarised in ``LayerDiff`` rows; the first over-budget node becomes
the ``Divergence``. Tables, reports and the CLI read these records and nothing else.
Imports nothing internal.
"""

from __future__ import annotations

from dataclasses import dataclass

from introspect.run.truth import AUTOGRAD, INFERENCE_MODE, NO_GRAD

# Node statuses, in the ``status`` column of ``DiffResult.nodes``.
STATUS_OK = "ok"  # local and propagated error within budget
STATUS_DRIFT = "drift"  # local error within budget, propagated error over: accumulated noise
STATUS_FAIL = "fail"  # local error over budget: this node computes something else
# Local error over budget, but neither the node's own value nor anything it feeds differs:
# two intermediates that are not the same quantity (regrouped terms), not a bug.
STATUS_UNCONFIRMED = "unconfirmed"
STATUS_UNMATCHED = "unmatched"  # no counterpart in the other graph; ``reason`` says why
STATUS_SKIPPED = "skipped"  # shape bookkeeping or a constant: not compared

# How a pair was found, in the ``matched_by`` column.
BY_INPUT = "input"  # placeholders with the same name
BY_OUTPUT = "output"  # graph outputs with the same key
BY_WEIGHTS = "weights"  # both nodes read the same weights (or a slice / transpose / fusion)
BY_STRUCTURE = "structure"  # same op kind and shape, reading matched inputs
BY_CONSUMER = "consumer"  # feeds the same argument of a matched pair
BY_VALUE = "value"  # a guessed pair's reference value found at another candidate node

# What proves that a pair's two nodes hold one quantity, in the ``provenance`` column.
# Only a proven pair (weights, name, value) can fail a diff; a guess (structure) that
# disagrees is ``unconfirmed`` unless an output or a proven pair confirms it.
PROVEN_WEIGHTS = "weights"  # both read the same weights, and no other node reads them alike
PROVEN_NAME = "name"  # the graphs' own inputs and outputs, or the user's name map
PROVEN_VALUE = "value"  # the candidate's own value agrees with the reference's
PROVEN_STRUCTURE = "structure"  # same op and shape on paired inputs, an argument of a
# pair, or one of several nodes reading equal weights picked by position: a guess
_PROVENANCE = {BY_WEIGHTS: PROVEN_WEIGHTS, BY_INPUT: PROVEN_NAME, BY_OUTPUT: PROVEN_NAME,
               BY_VALUE: PROVEN_VALUE, BY_STRUCTURE: PROVEN_STRUCTURE,
               BY_CONSUMER: PROVEN_STRUCTURE}

# The words that open the dropout hypothesis's hint for a forward that edits its own
# weights; the divergence reads them to tell moved weights from weights never loaded.
WEIGHT_EDIT = "the candidate's forward edits its own weights"


@dataclass(frozen=True)
class Region:
    """A slice ``[start, stop)`` of one dimension of a node's output."""

    dim: int  # negative counts from the end: -1 is the feature dimension
    start: int
    stop: int

    def __str__(self) -> str:
        return f"[dim {self.dim}: {self.start}:{self.stop}]"


@dataclass(frozen=True)
class WeightRelation:
    """How a weight the candidate reads relates to one of the reference's weights."""

    candidate: str  # parameter path (or expression) in the candidate
    reference: str  # parameter path in the reference
    kind: str  # "same", "transposed", "slice", "fused", "quantized", "folded", "by-name"
    region: Region | None  # rows of the larger of the two that the smaller one is
    max_abs_diff: float  # 0.0 when the values agree (after casting to the lower dtype)
    # "permuted": candidate row j is reference row order[j] (rows permuted within heads)
    order: tuple[int, ...] | None = None
    # "folded": the reference's 1-D weight each column of the candidate's is scaled by
    # (a norm's gain folded into the Linear that reads it: W' = W diag(g))
    scaled_by: str = ""


@dataclass(frozen=True)
class Pair:
    """A reference node and the candidate node that computes the same values.

    ``reference_region`` slices the reference's output before comparing (the candidate
    computes one head of it); ``candidate_region`` slices the candidate's (a fused QKV
    projection holds q, k and v side by side).
    """

    reference: str  # fx node name in the reference graph
    candidate: str  # fx node name in the candidate graph
    matched_by: str  # one of the BY_* constants
    note: str = ""  # e.g. "weights: transposed", "q part of a fused projection"
    reference_region: Region | None = None
    candidate_region: Region | None = None
    # The candidate's last dimension is the reference's permuted: feature j of the
    # candidate is feature feature_order[j] of the reference (wq rows permuted per head).
    feature_order: tuple[int, ...] | None = None
    # One of the PROVEN_* words; "" takes the one ``matched_by`` implies (a name map: name)
    provenance: str = ""
    # A Linear's bias (its parameter path in the reference) that the candidate's node does
    # not add (``(x + b) + x @ W.T``, a bias added per head): the reference's value less
    # it is what the candidate's node holds, and what it is compared with
    reference_bias: str = ""
    # With ``reference_bias``, where the candidate folded a norm's shift into that bias
    # (``b + W @ shift``): (the reference's matrix W, the shift), subtracted too
    reference_shift: tuple[str, str] | None = None
    # The candidate's batch rows or tokens in another order, as the forward's replay found
    # them: (axes, order), index k along each axis (of the value in the reference's
    # layout) holds the reference's index order[k] (a sequence run back to front)
    axis_order: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    def __post_init__(self) -> None:
        if not self.provenance:
            object.__setattr__(self, "provenance",
                               _PROVENANCE.get(self.matched_by, PROVEN_NAME))


@dataclass(frozen=True)
class Unmatched:
    """A node of one graph with no counterpart in the other, and why."""

    graph: str  # "reference" or "candidate"
    node: str
    reason: str
    status: str = STATUS_UNMATCHED  # or STATUS_SKIPPED for bookkeeping and constants


@dataclass(frozen=True)
class ErrorStats:
    """Errors of one comparison: real tokens and padding positions apart."""

    max_abs: float  # over real-token positions
    mean_abs: float
    max_rel: float  # |cand - ref| / |ref| where ref != 0
    mismatched: int  # elements over atol + rtol * |ref| (or NaN on one side only)
    nonfinite: int  # NaN or Inf in the candidate's value
    elements: int  # real-token elements compared
    pad_max_abs: float  # over padding positions (0.0 when nothing is padded)
    pad_mismatched: int
    reference_nonfinite: int = 0  # NaN or Inf in the reference's value
    reference_max_abs: float = 0.0  # the reference's largest magnitude (real tokens)
    # elements per decade of |cand - ref| over real tokens (``introspect.diff.histogram``)
    histogram: tuple[int, ...] = ()
    # signal to quantization noise, in dB, over real tokens (inf when equal)
    sqnr_db: float = float("inf")


@dataclass(frozen=True)
class NodeDiff:
    """One row of ``DiffResult.nodes``: an aligned pair, or a node with no counterpart."""

    reference_node: str  # "" for a candidate node with no counterpart
    candidate_node: str  # "" for a reference node with no counterpart
    module: str  # the reference's module path (the candidate's when unmatched there)
    layer: str  # embeddings, mask, encoder.layer.N, pooler, head, inputs, outputs
    op: str  # op type: Linear, LayerNorm, scaled_dot_product_attention, view, ...
    shape: str  # shape compared, "(2, 9, 384)"
    dtype: str  # "float32" or "float32/bfloat16" when the two differ
    max_abs_err: float | None  # propagated: each model on its own inputs
    mean_abs_err: float | None
    max_rel_err: float | None
    mismatched: int | None
    nonfinite: int | None  # NaN or Inf in either side's value (the larger count)
    local_max_abs_err: float | None  # local: the candidate's node fed the reference's inputs
    local_mean_abs_err: float | None
    local_max_rel_err: float | None
    local_mismatched: int | None
    pad_max_abs_err: float | None  # propagated, at padding positions only
    atol: float | None  # the budget: |cand - ref| <= atol + rtol * |ref|
    rtol: float | None
    status: str  # one of the STATUS_* constants
    matched_by: str  # how the pair was found ("" when unmatched)
    note: str  # how the pair relates (region, layout) or why the node has no counterpart
    reference_index: int  # position in the reference graph (-1 when unmatched there)
    candidate_index: int  # position in the candidate graph (-1 when unmatched there)
    # 10 log10(sum ref^2 / sum (cand - ref)^2) over real tokens, as PyTorch's Numeric Suite:
    # propagated and local; inf when the two are equal
    sqnr_db: float | None = None
    local_sqnr_db: float | None = None
    # what proves the pair (PROVEN_*: weights, name, value, structure); "" when unmatched
    # ("" given: the one ``matched_by`` implies)
    provenance: str = ""

    def __post_init__(self) -> None:
        if not self.provenance and self.reference_node and self.candidate_node:
            object.__setattr__(self, "provenance", _PROVENANCE.get(self.matched_by, ""))


@dataclass(frozen=True)
class LayerDiff:
    """One row of ``DiffResult.layers``: a block of the reference and how it compares."""

    layer: str
    output_node: str  # the layer's last compared tensor node in the reference
    max_abs_err: float  # propagated error of the layer's output
    local_max_abs_err: float  # worst local error of any node in the layer
    worst_node: str  # the node with the highest local error over budget ratio
    nodes: int  # aligned pairs in the layer
    failing: int  # pairs whose local error is over budget
    unmatched: int  # reference nodes of the layer with no counterpart
    passed: bool
    sqnr_db: float | None = None  # SQNR of the layer's output (propagated), in dB


@dataclass(frozen=True)
class Divergence:
    """The first node, in the reference's graph order, whose local error is over budget."""

    reference_node: str
    candidate_node: str
    module: str
    layer: str
    op: str
    local_max_abs_err: float
    budget: str  # "atol 1e-05 + rtol 1.3e-06 * |ref|"
    hints: tuple[str, ...]  # known causes that match, in order of confidence
    detail: str = ""  # where the values first differ when that is a layout op, NaN, ...
    step: int | None = None  # with generate: the decoding step (0: the prefill)
    phase: str = "forward"  # "backward": only the gradients differ (backward=True)
    # the candidate's module that holds the divergence (``layer`` and ``module`` are
    # always the reference's): "" where it is not known
    candidate_module: str = ""


# How a divergence's budget begins where its figure is a mean gap, not the largest (a float64
# check failed on the mean: ``modules.precise``); ``error_words`` reads it.
AVERAGE = "on average"


def error_words(d: Divergence) -> str:
    """What a divergence's ``local_max_abs_err`` measures, in words: its largest local
    error, or where its budget says so, its mean."""
    return "local mean abs error" if d.budget.split(" ", 1)[-1].startswith(AVERAGE) \
        else "local max abs error"


# Calls of the truth runs, in the ``call`` column of ``DiffResult.outputs``: the modes
# ``introspect.run.truth`` calls a model in. CALL_AUTOGRAD: model(**x), autograd on, as a
# user writes it; CALL_NO_GRAD: under torch.no_grad() (inference code, PyTorch's fast
# paths); CALL_INFERENCE: under torch.inference_mode() (the candidate only).
CALL_AUTOGRAD, CALL_NO_GRAD, CALL_INFERENCE = AUTOGRAD, NO_GRAD, INFERENCE_MODE


@dataclass(frozen=True)
class OutputDiff:
    """One row of ``DiffResult.outputs``: an output of the truth runs and its counterpart."""

    reference_output: str  # dotted name in the reference's outputs: "pooler_output"
    candidate_output: str  # the candidate's ("output_1"); "" when it has none
    call: str  # CALL_AUTOGRAD, CALL_NO_GRAD or CALL_INFERENCE
    shape: str
    dtype: str  # "float32" or "float32/bfloat16" when the two differ
    max_abs_err: float | None
    limit: float | None  # what rounding explains for this output (drift model + atol)
    nonfinite: int | None  # NaN or Inf in either side's value (the larger count)
    status: str  # STATUS_OK, STATUS_FAIL or STATUS_UNMATCHED
    note: str = ""
