"""Run two aligned graphs side by side and measure every pair, keeping summaries only.

The reference and the candidate run in lock-step, node by node: before the candidate
runs a node, the reference runs up to the nodes paired with it. Each pair is compared
as soon as both values exist, and a value is dropped as soon as no later node, pair or
substitution needs it, so memory stays close to that of the two forward passes.

Two errors per pair (shared/DESIGN.md, "Local vs propagated error"):

- **propagated**: the candidate's value when each model runs on its own inputs;
- **local**: the candidate's node run on the *reference's* values. Every candidate node
  has a "substituted" value: the reference's value for paired nodes (cast to the
  candidate's dtype, moved to its layout, fused parts put side by side) and, for the
  nodes in between, the candidate's own op run on substituted inputs. When all inputs
  of a node are bit-identical to the reference's, nothing is recomputed: local equals
  propagated. So a port that agrees exactly costs no extra work.

Errors at padding positions are measured apart from real tokens.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.fx
from torch.fx.node import map_arg

from introspect.diff.eager import mutates_in_place
from introspect.diff.histogram import error_histogram, exact_histogram
from introspect.diff.quantized import int8_noise, is_quantized
from introspect.diff.records import ErrorStats, Pair
from introspect.diff.tolerance import Budget, int8_budget
from introspect.errors import InputError
from introspect.trace.shapes import ValueShapeProp

_SAME = object()  # the substituted value is the candidate's own (bit-identical to the reference's)
_MAX_LAYOUT_DIMS = 5  # permutations tried when two paired values differ by layout
_FIT_RATIO = 0.01  # a layout other than the expected one must fit this much better
_MAX_ORDERS = 8  # feature orders a candidate node carries from permuted weights upstream


# Which axes of a reference value are the batch and the token axes, followed op by op.
BATCH, TOKENS, ROWS = "B", "S", "BS"  # ROWS: batch and tokens flattened together (B*S)
Labels = tuple  # one label (or None) per dimension  # noqa: UP006

_PERMUTES = {"transpose", "swapaxes", "permute", "t", "movedim"}
_RESHAPES = {"view", "reshape", "flatten", "unflatten", "view_as", "reshape_as", "squeeze",
             "unsqueeze", "contiguous", "clone"}


class TokenAxes:
    """Follows the batch and token axes of every reference value through the graph.

    The padding mask of a value is found from where its token axis went (a head split,
    a transpose, rows flattened to ``(B*S, F)``), never from which axis has the sequence
    length: with as many heads as tokens, ``(B, nh, S, hd)`` has two such axes.
    """

    def __init__(self, input_shape: tuple[int, ...] | None) -> None:
        self.input_shape = input_shape
        self.labels: dict[str, Any] = {}  # node name -> Labels, or a list of them (a tuple)
        self.shapes: dict[str, tuple[int, ...]] = {}

    def follow(self, node: torch.fx.Node, value: Any) -> None:
        if self.input_shape is None:
            return
        if isinstance(value, torch.Tensor):
            self.shapes[node.name] = tuple(value.shape)
        try:
            labels = self._infer(node, value)
        except Exception:  # an op this cannot follow: the value's axes stay unknown
            labels = None
        if labels is not None:
            self.labels[node.name] = labels

    def of(self, name: str) -> Labels | None:
        found = self.labels.get(name)
        return found if isinstance(found, tuple) else None

    def known(self, name: str) -> Labels | None:
        """The value's labels where they name a batch axis at least (else: not followed)."""
        found = self.of(name)
        return found if found is not None and any(found) else None

    def _arg(self, node: torch.fx.Node, i: int) -> Labels | None:
        arg = node.args[i] if i < len(node.args) else None
        return self.of(arg.name) if isinstance(arg, torch.fx.Node) else None

    def _infer(self, node: torch.fx.Node, value: Any) -> Any:
        if node.op == "get_attr":
            return _none(value)
        if node.op == "placeholder":
            if not isinstance(value, torch.Tensor):
                return None
            shape = tuple(value.shape)
            if shape == self.input_shape:
                return (None,) * (len(shape) - 2) + (BATCH, TOKENS) if len(shape) >= 2 else None
            return None
        name = _op_name(node)
        if isinstance(value, (tuple, list)):
            source = self._arg(node, 0)
            if source is None or name not in ("split", "chunk", "unbind", "split_with_sizes"):
                return None
            dim = _dim_arg(node, 2 if name != "unbind" else 1, 0 if name == "unbind" else -1)
            dim %= len(source)
            if name == "unbind":
                item = source[:dim] + source[dim + 1:]
            else:
                item = tuple(None if d == dim else label for d, label in enumerate(source))
            return [item for _ in value]
        if not isinstance(value, torch.Tensor):
            return None
        shape = tuple(value.shape)
        if name == "getitem":
            item_of = node.args[0]
            found = self.labels.get(item_of.name) if isinstance(item_of, torch.fx.Node) else None
            if isinstance(found, list) and isinstance(node.args[1], int):
                return found[node.args[1]]
            indexed = _indexed(self._arg(node, 0), node.args[1])
            if indexed is not None and len(indexed) == len(shape):
                return indexed
            return self._broadcast(node, shape, same_rank_only=True)
        if name in _PERMUTES:
            source = self._arg(node, 0)
            if source is None:
                return None
            ndim = len(source)
            if name == "t":
                return source[::-1]
            if name in ("transpose", "swapaxes"):
                a, b = (int(x) % ndim for x in _int_args(node, 1, 3))
                out = list(source)
                out[a], out[b] = out[b], out[a]
                return tuple(out)
            if name == "permute":
                dims = _int_args(node, 1, None)
                if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
                    dims = list(dims[0])
                return tuple(source[int(d) % ndim] for d in dims)
            return None
        if name in _RESHAPES or (node.op == "call_method" and name == "expand"):
            source_node = node.args[0] if node.args else None
            source = self._arg(node, 0)
            if source is None or not isinstance(source_node, torch.fx.Node):
                return None
            source_shape = self.shapes.get(source_node.name)
            if source_shape is None:
                return None
            if name == "expand":
                return _right_aligned([(source, source_shape)], shape)
            return _regroup(source, source_shape, shape)
        if name in ("linear", "Linear", "addmm", "matmul", "bmm", "baddbmm", "einsum"):
            if name == "addmm":
                data = self._arg(node, 1)
                return data[:-1] + (None,) if data is not None and len(data) == 2 else None
            if name in ("matmul", "bmm", "baddbmm"):
                first, second = (self._arg(node, 0), self._arg(node, 1)) if name != "baddbmm" \
                    else (self._arg(node, 1), self._arg(node, 2))
                if first is None or second is None or len(first) != len(shape):
                    return None
                return first[:-1] + (second[-1] if len(second) >= 2 else None,)
            if name == "einsum":
                return None
            data = self._arg(node, 0)
            return data[:-1] + (None,) if data is not None and len(data) == len(shape) else None
        if name in ("Embedding", "embedding"):  # the ids' axes, then the features
            ids = self._arg(node, 0)
            return ids + (None,) if ids is not None and len(ids) + 1 == len(shape) else None
        if name == "scaled_dot_product_attention":
            query = self._arg(node, 0)
            return query if query is not None and len(query) == len(shape) else None
        return self._broadcast(node, shape)

    def _broadcast(self, node: torch.fx.Node, shape: tuple[int, ...], *,
                   same_rank_only: bool = False) -> Labels | None:
        """Elementwise ops and the like: each axis keeps the label of an input axis of the
        same size at the same place from the right (broadcast axes of size 1 bring none)."""
        sources = []
        for n in node.all_input_nodes:
            labels, n_shape = self.of(n.name), self.shapes.get(n.name)
            if labels is None or n_shape is None or len(labels) != len(n_shape):
                continue
            if same_rank_only and len(n_shape) != len(shape):
                continue
            sources.append((labels, n_shape))
        if not sources:
            return None
        return _right_aligned(sources, shape)


def _indexed(source: Labels | None, index: Any) -> Labels | None:
    """Labels after ``x[index]`` for slices, None (a new axis), integers and Ellipsis."""
    if source is None:
        return None
    items = index if isinstance(index, tuple) else (index,)
    if any(not (isinstance(i, (slice, int)) or i is None or i is Ellipsis) for i in items):
        return None
    out: list[str | None] = []
    d = 0
    for k, item in enumerate(items):
        if item is Ellipsis:
            rest = sum(1 for i in items[k + 1:] if i is not None)
            keep = len(source) - d - rest
            out += source[d:d + keep]
            d += keep
        elif item is None:
            out.append(None)
        elif isinstance(item, int):
            d += 1
        else:
            out.append(source[d] if d < len(source) else None)
            d += 1
    return tuple(out) + tuple(source[d:])


def _right_aligned(sources: list[tuple[Labels, tuple[int, ...]]],
                   shape: tuple[int, ...]) -> Labels:
    out: list[str | None] = []
    for d in range(len(shape)):
        label = None
        for labels, s_shape in sources:
            k = d - len(shape) + len(s_shape)
            if 0 <= k < len(s_shape) and s_shape[k] == shape[d] and labels[k] is not None:
                label = labels[k]
                break
        out.append(label)
    return tuple(out)


def _regroup(source: Labels, source_shape: tuple[int, ...], shape: tuple[int, ...]) -> Labels:
    """Labels across a reshape: dimensions grouped where the products of sizes agree."""
    out: list[str | None] = [None] * len(shape)
    i = j = 0
    while i < len(source_shape) and j < len(shape):
        i_end, j_end = i + 1, j + 1
        a, b = source_shape[i], shape[j]
        while a != b:
            if a < b and i_end < len(source_shape):
                a *= source_shape[i_end]
                i_end += 1
            elif b < a and j_end < len(shape):
                b *= shape[j_end]
                j_end += 1
            else:
                return tuple(out)
        inside = [(source[k], source_shape[k]) for k in range(i, i_end) if source_shape[k] != 1]
        targets = [k for k in range(j, j_end) if shape[k] != 1]
        if len(inside) == 1 and len(targets) == 1:
            out[targets[0]] = inside[0][0]
        elif len(targets) == 1 and [label for label, _ in inside] == [BATCH, TOKENS]:
            out[targets[0]] = ROWS
        elif len(inside) == 1 and inside[0][0] == ROWS and len(targets) == 2:
            out[targets[0]], out[targets[1]] = BATCH, TOKENS
        i, j = i_end, j_end
    return tuple(out)


def _none(value: Any) -> Labels | None:
    return (None,) * value.ndim if isinstance(value, torch.Tensor) else None


def _op_name(node: torch.fx.Node) -> str:
    if node.op == "call_module":
        owner = node.graph.owning_module
        return type(owner.get_submodule(str(node.target))).__name__ if owner is not None else ""
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _int_args(node: torch.fx.Node, start: int, stop: int | None) -> list[Any]:
    return list(node.args[start:stop])


def _dim_arg(node: torch.fx.Node, position: int, default: int) -> int:
    given: Any = node.kwargs["dim"] if "dim" in node.kwargs else \
        node.args[position] if len(node.args) > position else default
    return int(given)


class Padding:
    """Which elements of a value sit at padded token positions.

    Where the value's axes are known (``TokenAxes``, followed from the inputs through
    every op), the mask is put on its batch and token axes, or on its rows when batch and
    tokens are flattened together ``(B*S, F)``. Otherwise, from the shape alone: a
    dimension after the first counts as a token axis when its size is the sequence
    length; when the last two dimensions both are (attention scores), both count.
    """

    def __init__(self, attention_mask: torch.Tensor | None) -> None:
        self.padded: torch.Tensor | None = None
        self.input_shape: tuple[int, ...] | None = None
        if attention_mask is not None and attention_mask.ndim >= 2:
            padded = attention_mask.reshape(-1, attention_mask.shape[-1]) == 0  # (N, S)
            self.padded = padded if bool(padded.any()) else None
            self.input_shape = tuple(attention_mask.shape)
        self._cache: dict[tuple[Any, ...], torch.Tensor | None] = {}

    def mask_for(self, shape: Sequence[int], labels: tuple[str | None, ...] | None = None,
                 ) -> torch.Tensor | None:
        """A boolean mask broadcastable to ``shape``, True at padding positions, or None.

        ``labels`` (from ``TokenAxes``) says which axis is the batch, the tokens, or both
        flattened; without it the axes are guessed from the sizes.
        """
        shape = tuple(shape)
        key = (shape, labels)
        if key not in self._cache:
            self._cache[key] = self._build(shape) if labels is None or len(labels) != len(
                shape) else self._from_labels(shape, labels)
        return self._cache[key]

    def _from_labels(self, shape: tuple[int, ...],
                     labels: tuple[str | None, ...]) -> torch.Tensor | None:
        if self.padded is None:
            return None
        rows, seq = self.padded.shape
        mask = None
        batch = [d for d, label in enumerate(labels) if label == BATCH and shape[d] == rows]
        for axis in (d for d, label in enumerate(labels) if label == TOKENS and shape[d] == seq):
            if len(batch) != 1:
                break
            view = [1] * len(shape)
            view[batch[0]], view[axis] = rows, seq
            part = self.padded.reshape(view)
            mask = part if mask is None else (mask | part)
        for axis in (d for d, label in enumerate(labels)
                     if label == ROWS and shape[d] == rows * seq):
            view = [1] * len(shape)
            view[axis] = rows * seq
            part = self.padded.reshape(view)
            mask = part if mask is None else (mask | part)
        return mask

    def _build(self, shape: tuple[int, ...]) -> torch.Tensor | None:
        if self.padded is None or len(shape) < 2 or shape[0] != self.padded.shape[0]:
            return None
        rows, seq = self.padded.shape
        axes = [d for d in range(1, len(shape)) if shape[d] == seq]
        if not axes:
            return None
        if not (len(axes) >= 2 and axes[-2:] == [len(shape) - 2, len(shape) - 1]):
            axes = axes[:1]
        else:
            axes = axes[-2:]
        mask = None
        for axis in axes:
            view = [1] * len(shape)
            view[0], view[axis] = rows, seq
            part = self.padded.reshape(view)
            mask = part if mask is None else (mask | part)
        return mask


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


class _Layout:
    """Maps a candidate value to the reference's layout (reshape then permute) and back."""

    def __init__(self, perm: tuple[int, ...], cand_shape: tuple[int, ...],
                 ref_shape: tuple[int, ...]) -> None:
        self.perm = perm
        self.inverse = tuple(sorted(range(len(perm)), key=perm.__getitem__))
        self.cand_shape, self.ref_shape = cand_shape, ref_shape
        self.shaped = [ref_shape[p] for p in perm]

    def to_reference(self, value: torch.Tensor) -> torch.Tensor:
        return value.reshape(self.shaped).permute(self.inverse)

    def to_candidate(self, value: torch.Tensor) -> torch.Tensor:
        return value.permute(self.perm).reshape(self.cand_shape)

    def __str__(self) -> str:
        identity = self.perm == tuple(range(len(self.perm)))
        return "reshape" if identity else f"reshape and permute {self.perm}"


def fit_layouts(candidate: torch.Tensor, reference: torch.Tensor,
                pad: torch.Tensor | None = None, *,
                permutes_only: bool = False) -> list[tuple[float, _Layout]]:
    """Every reshape + permute of ``candidate`` to ``reference``'s shape, best fit first.

    The fit is the mean absolute difference over real tokens (``pad`` True at padding);
    ties keep the order of ``itertools.permutations``, the identity first.
    ``permutes_only``: only the layouts that permute whole axes (for two values of one
    shape: only axes of equal sizes can have traded places).
    """
    cand_shape, ref_shape = tuple(candidate.shape), tuple(reference.shape)
    if candidate.numel() != reference.numel() or len(ref_shape) > _MAX_LAYOUT_DIMS:
        return []
    fits: list[tuple[float, _Layout]] = []
    target = reference.double()
    for perm in itertools.permutations(range(len(ref_shape))):
        layout = _Layout(perm, cand_shape, ref_shape)
        if permutes_only and tuple(layout.shaped) != cand_shape:
            continue
        d = (layout.to_reference(candidate).double() - target).abs()
        if pad is not None:
            d = d.masked_fill(pad, 0.0)
        error = float(d.mean()) if d.numel() else 0.0
        fits.append((0.0 if math.isnan(error) else error, layout))
        if error == 0.0:
            break
    return sorted(fits, key=lambda fit: fit[0])


def fit_layout(candidate: torch.Tensor, reference: torch.Tensor) -> _Layout | None:
    """The reshape + permute that brings ``candidate`` closest to ``reference``, if any."""
    fits = fit_layouts(candidate, reference)
    return fits[0][1] if fits else None


def _may_trade(perm: tuple[int, ...], labels: tuple[str | None, ...] | None) -> bool:
    """Whether two values of one shape may differ by ``perm``: never by trading two token
    axes (queries and keys of attention scores: a transposed score matrix is a bug, q and k
    swapped), nor, where the axes are unknown, the last two axes of a square value."""
    if labels is None or len(labels) != len(perm):
        n = len(perm)
        return n < 2 or not (perm[n - 1] == n - 2 and perm[n - 2] == n - 1)
    return all(not (labels[k] == TOKENS and labels[p] == TOKENS) or p == k
               for k, p in enumerate(perm))


def _inverse(order: torch.Tensor) -> torch.Tensor:
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return inverse


def _block_orders(order: tuple[int, ...]) -> set[tuple[int, ...]]:
    """``order`` and, where it permutes each block of ``b`` features the same way, the
    order within one block (a head's features after the head split)."""
    found = {order}
    n = len(order)
    for block in range(2, n):
        if n % block or any(order[j] // block != j // block for j in range(n)):
            continue
        inner = tuple(order[j] % block for j in range(block))
        if all(order[j] % block == inner[j % block] for j in range(n)):
            found.add(inner)
    return found


def measure(candidate: torch.Tensor, reference: torch.Tensor, budget: Budget,
            pad: torch.Tensor | None, *, known_finite: bool = False) -> tuple[ErrorStats, bool]:
    """Errors of ``candidate`` against ``reference`` (same shape), and whether they are equal.

    A mismatch is an element with ``|cand - ref| > atol + rtol * |ref|``, or a NaN on one
    side only; relative errors skip elements where the reference is 0. ``known_finite``
    spares the NaN/Inf count when the caller knows the value holds none.
    """
    real_count = _real_count(reference.shape, pad)
    if candidate.dtype == reference.dtype and torch.equal(candidate, reference):
        nonfinite = 0 if known_finite else _nonfinite(candidate)
        return ErrorStats(0.0, 0.0, 0.0, 0, nonfinite, real_count, 0.0, 0, nonfinite,
                          histogram=exact_histogram(real_count)), True
    reference_nonfinite = _nonfinite(reference)
    dtype = torch.promote_types(candidate.dtype, reference.dtype)
    if not dtype.is_floating_point:
        dtype = torch.float64
    a, b = candidate.to(dtype), reference.to(dtype)
    d = (a - b).abs()
    if bool(d.isnan().any()):
        d = d.masked_fill((a == b) | (a.isnan() & b.isnan()), 0.0).nan_to_num(nan=float("inf"))
    magnitude = b.abs()
    over = d > (budget.atol + budget.rtol * magnitude)
    rel = d / magnitude.masked_fill(magnitude == 0, float("inf"))
    if pad is None:
        stats = ErrorStats(_max(d), float(d.double().mean()) if d.numel() else 0.0, _max(rel),
                           int(over.sum()), _nonfinite(candidate), real_count, 0.0, 0,
                           reference_nonfinite, _max(magnitude.nan_to_num(posinf=0.0)),
                           error_histogram(d, None), _sqnr_db(b, d))
        return stats, False
    d_real = d.masked_fill(pad, 0.0)
    stats = ErrorStats(
        max_abs=_max(d_real),
        mean_abs=float(d_real.double().sum()) / real_count if real_count else 0.0,
        max_rel=_max(rel.masked_fill(pad, 0.0)),
        mismatched=int((over & ~pad).sum()),
        nonfinite=_nonfinite(candidate),
        elements=real_count,
        pad_max_abs=_max(d.masked_fill(~pad, 0.0)),
        pad_mismatched=int((over & pad).sum()),
        reference_nonfinite=reference_nonfinite,
        reference_max_abs=_max(magnitude.nan_to_num(posinf=0.0).masked_fill(pad, 0.0)),
        histogram=error_histogram(d, pad),
        sqnr_db=_sqnr_db(b.masked_fill(pad, 0.0), d_real),
    )
    return stats, False


def _sqnr_db(reference: torch.Tensor, error: torch.Tensor) -> float:
    """Signal to quantization noise in dB, as Numeric Suite reports it:
    ``10 log10(sum ref^2 / sum (cand - ref)^2)``; inf for no error, -inf for no signal."""
    noise = float(error.double().square().sum())
    if noise == 0.0:
        return math.inf
    signal = float(reference.double().nan_to_num(posinf=0.0, neginf=0.0).square().sum())
    if signal == 0.0 or math.isinf(noise) or math.isnan(noise):
        return -math.inf
    return 10 * math.log10(signal / noise)


def _max(t: torch.Tensor) -> float:
    return float(t.max()) if t.numel() else 0.0


def _nonfinite(t: torch.Tensor) -> int:
    # One reduction answers for almost every tensor: the sum is finite when all values are
    # (a sum that overflows is rechecked element by element).
    if not t.is_floating_point() or t.numel() == 0 or bool(torch.isfinite(t.sum())):
        return 0
    return int((~torch.isfinite(t)).sum())


def _real_count(shape: Sequence[int], pad: torch.Tensor | None) -> int:
    total = 1
    for s in shape:
        total *= s
    if pad is None:
        return total
    # Each element of the broadcast mask stands for total / pad.numel() elements.
    return total - int(pad.sum()) * (total // pad.numel())


def _narrow(value: torch.Tensor, region: Any) -> torch.Tensor:
    return value.narrow(region.dim, region.start, region.stop - region.start)


class _Replay(ValueShapeProp):
    """Runs a recorded graph: a leaf module's node is its ``forward`` alone.

    A recorded graph already holds what the module's hooks did, as nodes of their own;
    calling the module would run its hooks a second time.
    """

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        return self.fetch_attr(target).forward(*args, **kwargs)


class _Runner:
    def __init__(self, reference: torch.fx.GraphModule, candidate: torch.fx.GraphModule,
                 pairs: Sequence[Pair], budgets: Sequence[Budget], padding: Padding,
                 snapshots: int) -> None:
        # ValueShapeProp records each node's real shape in node.meta as it runs.
        self.ref_interp = _Replay(reference)
        self.cand_interp = _Replay(candidate)
        self.ref_nodes = [n for n in reference.graph.nodes if n.op != "output"]
        self.cand_nodes = [n for n in candidate.graph.nodes if n.op != "output"]
        ref_by_name = {n.name: n for n in self.ref_nodes}
        self.ref_index = {n.name: i for i, n in enumerate(self.ref_nodes)}
        self.cand_by_name = {n.name: n for n in self.cand_nodes}
        self.pairs = list(pairs)
        self.budgets = list(budgets)
        self.padding = padding
        self.snapshot_limit = snapshots
        self.result = RunResult()
        self.by_candidate: dict[str, list[int]] = {}
        self.ref_pending: dict[str, int] = {}
        for i, p in enumerate(self.pairs):
            self.by_candidate.setdefault(p.candidate, []).append(i)
            self.ref_pending[p.reference] = self.ref_pending.get(p.reference, 0) + 1
        self.pair_ref_node = [ref_by_name[p.reference] for p in self.pairs]
        # The outputs are kept to the end: the diff proves the replay against the model's run.
        self.ref_uses = {n.name: len(n.users) for n in self.ref_nodes}
        self.cand_uses = {n.name: len(n.users) for n in self.cand_nodes}
        self.ref_output = next(n for n in reference.graph.nodes if n.op == "output")
        self.cand_output = next(n for n in candidate.graph.nodes if n.op == "output")
        self.substituted: dict[str, Any] = {}
        self.layouts: dict[int, _Layout] = {}
        self.finite: set[str] = set()  # candidate nodes whose value holds no NaN or Inf
        self.axes = TokenAxes(padding.input_shape if padding.padded is not None else None)
        # Layouts that made a pair agree, by (candidate shape, reference shape, reference
        # axes): preferred
        # for the pairs of the same shapes that do not agree under any layout.
        self.proven: dict[tuple[Any, ...], tuple[int, ...]] = {}
        # Feature orders: pair index -> candidate feature j is reference feature order[j];
        # and the orders each candidate node may carry (from a permuted weight upstream).
        self.orders: dict[int, torch.Tensor] = {}
        self.carried: dict[str, frozenset[tuple[int, ...]]] = {}
        self.pair_orders = {i: p.feature_order for i, p in enumerate(self.pairs)
                            if p.feature_order is not None}
        self.quantized: dict[str, torch.nn.Module | None] = {}  # module path -> int8 module

    # -- driving ----------------------------------------------------------------------
    def run(self, ref_inputs: Mapping[str, torch.Tensor], cand_inputs: Mapping[str, torch.Tensor],
            ) -> RunResult:
        position = 0
        with torch.no_grad():
            for node in self.cand_nodes:
                needed = max((self.ref_index[self.pairs[i].reference]
                              for i in self.by_candidate.get(node.name, ())), default=-1)
                while position <= needed:
                    self._run_reference(self.ref_nodes[position], ref_inputs)
                    position += 1
                self._run_candidate(node, cand_inputs)
            while position < len(self.ref_nodes):
                self._run_reference(self.ref_nodes[position], ref_inputs)
                position += 1
        self.result.outputs = {
            "reference": map_arg(self.ref_output.args[0], self.ref_interp.env.__getitem__),
            "candidate": map_arg(self.cand_output.args[0], self.cand_interp.env.__getitem__)}
        return self.result

    def _run_reference(self, node: torch.fx.Node, inputs: Mapping[str, torch.Tensor]) -> None:
        env = self.ref_interp.env
        env[node] = _run(self.ref_interp, node, inputs, "reference")
        self.axes.follow(node, env[node])
        for n in node.all_input_nodes:
            self.ref_uses[n.name] -= 1
            self._free_reference(n)
        self._free_reference(node)

    def _free_reference(self, node: torch.fx.Node) -> None:
        if self.ref_uses[node.name] <= 0 and self.ref_pending.get(node.name, 0) <= 0:
            self.ref_interp.env.pop(node, None)

    def _run_candidate(self, node: torch.fx.Node, inputs: Mapping[str, torch.Tensor]) -> None:
        env = self.cand_interp.env
        value = env[node] = _run(self.cand_interp, node, inputs, "candidate")
        local = self._local(node)
        self._carry_orders(node)
        exact = True
        indices = self.by_candidate.get(node.name, ())
        if indices:
            self._int8_budgets(node, indices)
            with _one_thread():
                for i in indices:
                    exact &= self._compare(i, value, local)
        # The substitution reads the paired reference values: free them only afterwards.
        self.substituted[node.name] = self._substitute(node, value, local, exact)
        for i in indices:
            ref_node = self.pair_ref_node[i]
            self.ref_pending[ref_node.name] -= 1
            self._free_reference(ref_node)
        for n in node.all_input_nodes:
            self.cand_uses[n.name] -= 1
            if self.cand_uses[n.name] <= 0:
                env.pop(n, None)
                self.substituted.pop(n.name, None)
        if self.cand_uses[node.name] <= 0:
            env.pop(node, None)
            self.substituted.pop(node.name, None)

    def _int8_budgets(self, node: torch.fx.Node, indices: Sequence[int]) -> None:
        """The pairs of an int8 quantized Linear get the budget its rounding explains on
        the input it runs on in local mode (the reference's value, where paired)."""
        if node.op != "call_module":
            return
        target = str(node.target)
        if target not in self.quantized:
            found = self.cand_interp.module.get_submodule(target)
            self.quantized[target] = found if is_quantized(found) else None
        int8 = self.quantized[target]
        data = node.args[0] if node.args else None
        if int8 is None or not isinstance(data, torch.fx.Node):
            return
        noise = int8_noise(int8, self._local_input(data))
        if noise is None:
            return
        for i in indices:
            self.budgets[i] = self.result.budgets[i] = int8_budget(self.budgets[i], noise)

    # -- local values -----------------------------------------------------------------
    def _local(self, node: torch.fx.Node) -> Any:
        """The node run on substituted inputs, or _SAME when they all are its own inputs."""
        if node.op in ("placeholder", "get_attr"):
            return _SAME
        if all(self.substituted.get(n.name, _SAME) is _SAME for n in node.all_input_nodes):
            return _SAME
        args = map_arg(node.args, self._local_input)
        kwargs = map_arg(node.kwargs, self._local_input)
        if mutates_in_place(node) and args and isinstance(args[0], torch.Tensor):
            # ``scores -= 10000 * (1 - mask)`` run on the reference's scores would change
            # the reference's own value: the candidate's op gets a copy
            args = (args[0].clone(), *args[1:])
        try:
            return getattr(self.cand_interp, node.op)(node.target, args, kwargs)
        except Exception:  # a substituted input the op cannot take: no local value
            return None

    def _local_input(self, node: torch.fx.Node) -> Any:
        substituted = self.substituted.get(node.name, _SAME)
        return self.cand_interp.env.get(node) if substituted is _SAME else substituted

    def _substitute(self, node: torch.fx.Node, value: Any, local: Any, exact: bool) -> Any:
        """The value later candidate nodes see in local mode: the reference's, where paired."""
        indices = self.by_candidate.get(node.name, [])
        if not indices or not isinstance(value, torch.Tensor):
            return local if local is not None else _SAME
        if exact:
            return _SAME
        ref_env = self.ref_interp.env
        whole = [i for i in indices if self.pairs[i].candidate_region is None]
        if whole:
            i = whole[0]
            ref_value = ref_env.get(self.pair_ref_node[i])
            if ref_value is None:
                return _SAME
            if self.pairs[i].reference_region is not None:
                ref_value = _narrow(ref_value, self.pairs[i].reference_region)
            if i in self.layouts:
                ref_value = self.layouts[i].to_candidate(ref_value)
            if i in self.orders and ref_value.ndim:
                ref_value = ref_value.index_select(-1, self.orders[i])
            # onto the candidate's device: its node runs there (introspect.diff.devices)
            return ref_value.to(value.device, value.dtype) \
                if ref_value.shape == value.shape else _SAME
        assembled = (local if isinstance(local, torch.Tensor) else value).clone()
        for i in indices:
            ref_value = ref_env.get(self.pair_ref_node[i])
            if ref_value is None:
                continue
            part = _narrow(assembled, self.pairs[i].candidate_region)
            if i in self.layouts:  # e.g. the candidate's rows flattened: (B*S, H) for (B, S, H)
                ref_value = self.layouts[i].to_candidate(ref_value)
            if i in self.orders and ref_value.ndim:
                ref_value = ref_value.index_select(-1, self.orders[i])
            if ref_value.shape == part.shape:
                part.copy_(ref_value)
        return assembled

    # -- comparing --------------------------------------------------------------------
    def _compare(self, i: int, value: Any, local: Any) -> bool:
        """Measure pair ``i``; True when the candidate's value is bit-identical."""
        pair = self.pairs[i]
        reference = self.ref_interp.env.get(self.pair_ref_node[i])
        if not isinstance(value, torch.Tensor) or not isinstance(reference, torch.Tensor):
            self.result.errors[i] = "not a tensor on both sides"
            return False
        if pair.reference_region is not None:
            reference = _narrow(reference, pair.reference_region)
        # Values meet on the reference's device, moved there one pair at a time: a GPU
        # never holds a second copy of the graph (introspect.diff.devices).
        value, local = _onto(value, reference.device), _onto(local, reference.device)
        if pair.candidate_region is not None:
            value = _narrow(value, pair.candidate_region)
            if isinstance(local, torch.Tensor):
                local = _narrow(local, pair.candidate_region)
        labels = self.axes.known(pair.reference)
        pad = _onto(self.padding.mask_for(reference.shape, labels), reference.device)
        budget = self.budgets[i]
        order = self._order_for(i, value, local, reference, budget, pad)
        if order is not None:
            self.orders[i] = order
            value = value.index_select(-1, _inverse(order))
            if isinstance(local, torch.Tensor) and local.ndim:
                local = local.index_select(-1, _inverse(order))
        layout = self._layout_for(i, value, local, reference, budget, pad)
        if layout is False:
            self.result.errors[i] = (f"shapes {tuple(value.shape)} and "
                                     f"{tuple(reference.shape)} hold different numbers "
                                     "of elements")
            return False
        if layout is not None:
            value = layout.to_reference(value)
            if isinstance(local, torch.Tensor) and local.numel() == value.numel():
                local = layout.to_reference(local)
        cand_node = self.cand_by_name[pair.candidate]
        known_finite = _moves_data(cand_node) and all(
            n.name in self.finite for n in cand_node.all_input_nodes if n.op != "get_attr")
        propagated, exact = measure(value, reference, budget, pad, known_finite=known_finite)
        if propagated.nonfinite == 0:
            self.finite.add(pair.candidate)
        if layout is not None and not propagated.mismatched:
            self.proven[(layout.cand_shape, layout.ref_shape, labels)] = layout.perm
        self.result.propagated[i] = propagated
        if local is _SAME:
            self.result.local[i] = propagated
        elif isinstance(local, torch.Tensor) and local.shape == reference.shape:
            self.result.local[i], _ = measure(local, reference, budget, pad)
        else:
            self.result.errors[i] = "the candidate's node cannot run on the reference's inputs"
        stats = self.result.local.get(i)
        if stats is not None and (stats.mismatched or stats.nonfinite) and self._room_for(i):
            self._snapshot(i, value if local is _SAME else local, reference, pad)
        return exact

    def _layout_for(self, i: int, value: torch.Tensor, local: Any, reference: torch.Tensor,
                    budget: Budget, pad: torch.Tensor | None) -> _Layout | None | Literal[False]:
        """The layout pair ``i`` is compared in: None for the value as it is, False when
        none fits (different numbers of elements).

        Tried for equal shapes too, where the identity does not agree: ``(B, S, nh, hd)``
        against ``(B, nh, S, hd)`` when there are as many heads as tokens. The values
        choose, but a layout other than the identity (or than one proven on another pair
        of the same shapes) is taken only where it fits far better: for a pair that
        differs under every layout, a permutation that merely lowers the error would
        scramble the comparison. The fit is judged on the local value where there is one
        (the candidate's op on the reference's inputs: right in the right layout even
        downstream of a bug).
        """
        if i in self.layouts:
            return self.layouts[i]
        same_shape = value.shape == reference.shape
        if same_shape:
            if reference.ndim < 2 or torch.equal(value, reference) or not measure(
                    value, reference, budget, pad)[0].mismatched:
                return None
        elif value.numel() != reference.numel():
            return False
        labels = self.axes.known(self.pairs[i].reference)
        key = (tuple(value.shape), tuple(reference.shape), labels)
        judged = local if isinstance(local, torch.Tensor) and local.shape == value.shape \
            else value
        fits = fit_layouts(judged, reference, pad, permutes_only=same_shape)
        if same_shape:
            fits = [(e, lay) for e, lay in fits if _may_trade(lay.perm, labels)]
        if not fits:
            return False if not same_shape else None
        identity = tuple(range(reference.ndim))
        expected = [perm for perm in (self.proven.get(key), identity if same_shape else None)
                    if perm is not None]
        best_error, best = fits[0]
        chosen: _Layout | None = best
        if expected and best.perm not in expected:
            fallback = min(((e, lay) for e, lay in fits if lay.perm in expected),
                           key=lambda fit: fit[0], default=None)
            if fallback is not None and not best_error <= _FIT_RATIO * fallback[0]:
                chosen = fallback[1]
        if chosen is None or (same_shape and chosen.perm == identity):
            return None
        self.layouts[i] = chosen
        self.result.layouts[i] = str(chosen)
        return chosen

    def _order_for(self, i: int, value: torch.Tensor, local: Any, reference: torch.Tensor,
                   budget: Budget, pad: torch.Tensor | None) -> torch.Tensor | None:
        """The candidate's feature order for pair ``i``: the pair's own (a permuted weight),
        or one carried from a permuted weight upstream that makes the values agree (its
        own, or the local value: the candidate's op on the reference's inputs)."""
        if i in self.orders:
            return self.orders[i]
        own = self.pair_orders.get(i)
        if own is not None:
            return torch.tensor(own, device=value.device) \
                if value.ndim and value.shape[-1] == len(own) else None
        carried = [o for o in self.carried.get(self.pairs[i].candidate, ())
                   if value.ndim and len(o) == value.shape[-1]]
        if not carried or value.shape != reference.shape or torch.equal(value, reference):
            return None
        if not measure(value, reference, budget, pad)[0].mismatched:
            return None
        tried = [value]
        if isinstance(local, torch.Tensor) and local.shape == value.shape:
            tried.append(local)
        for order in carried:
            index = _inverse(torch.tensor(order, device=value.device))
            if any(not measure(t.index_select(-1, index), reference, budget, pad)[0].mismatched
                   for t in tried):
                return torch.tensor(order, device=value.device)
        return None

    def _carry_orders(self, node: torch.fx.Node) -> None:
        """The feature orders a candidate node may carry: its pairs' own, its inputs'."""
        carried: set[tuple[int, ...]] = set()
        for i in self.by_candidate.get(node.name, ()):
            order = self.pair_orders.get(i)
            if order is not None:
                carried |= _block_orders(order)
        for n in node.all_input_nodes:
            carried |= self.carried.get(n.name, frozenset())
        if carried:
            self.carried[node.name] = frozenset(list(carried)[:_MAX_ORDERS])

    def _room_for(self, i: int) -> bool:
        """Whether pair ``i`` gets a snapshot: the first over-budget pairs in the
        *reference's* order keep theirs (the first divergence is found in that order,
        and a candidate that runs its layers in another order reaches them later)."""
        snapshots = self.result.snapshots
        if len(snapshots) < self.snapshot_limit:
            return True
        order = self.ref_index
        latest = max(snapshots, key=lambda j: order[self.pairs[j].reference])
        if order[self.pairs[latest].reference] <= order[self.pairs[i].reference]:
            return False
        del snapshots[latest]
        return True

    def _snapshot(self, i: int, local: torch.Tensor, reference: torch.Tensor,
                  pad: torch.Tensor | None) -> None:
        cand_node = self.cand_by_name[self.pairs[i].candidate]
        inputs = tuple(_onto(self._local_input(n), reference.device)
                       for n in cand_node.all_input_nodes)
        d = (local.double() - reference.double()).abs()
        if pad is not None:
            d = d.masked_fill(pad, 0.0)
        rows = tuple(float(x) for x in d.reshape(d.shape[0], -1).amax(dim=1)) if d.ndim else ()
        self.result.snapshots[i] = Snapshot(i, inputs, local, reference, rows)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Comparisons read memory once and compute little: threads only wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _onto(value: Any, device: torch.device) -> Any:
    """A tensor on ``device`` (the same tensor when it is there); anything else as it is."""
    return value.to(device) if isinstance(value, torch.Tensor) else value


# Ops that only move values (no arithmetic, no cast): finite inputs give a finite output.
_DATA_MOVES = {"view", "reshape", "transpose", "permute", "contiguous", "flatten", "unflatten",
               "squeeze", "unsqueeze", "expand", "expand_as", "t", "clone", "split", "chunk",
               "getitem", "narrow", "cat", "stack", "view_as", "reshape_as"}


def _moves_data(node: torch.fx.Node) -> bool:
    if node.op == "call_module":
        return False  # Dropout would qualify; modules are few, checking them is cheap
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return name in _DATA_MOVES


def _run(interpreter: torch.fx.Interpreter, node: torch.fx.Node,
         inputs: Mapping[str, torch.Tensor], side: str) -> Any:
    if node.op == "placeholder":  # through run_node, so its shape is recorded too
        interpreter.args_iter = iter([inputs[str(node.target)]])
    try:
        return interpreter.run_node(node)
    except Exception as e:
        raise InputError(
            f"the {side} failed at node {node.name} ({node.format_node()}): {e}") from e


def run_side_by_side(reference: torch.fx.GraphModule, candidate: torch.fx.GraphModule,
                     pairs: Sequence[Pair], budgets: Sequence[Budget],
                     ref_inputs: Mapping[str, torch.Tensor],
                     cand_inputs: Mapping[str, torch.Tensor],
                     *, padding: Padding | None = None, snapshots: int = 4) -> RunResult:
    """Run both graphs in lock-step and measure every pair against its budget.

    Args:
        reference, candidate: the traced GraphModules.
        pairs: the alignment's pairs; ``budgets[i]`` is pair ``i``'s budget.
        ref_inputs, cand_inputs: each graph's inputs by placeholder name.
        padding: which positions are padding (default: none).
        snapshots: keep the inputs and outputs of this many over-budget pairs, for hints.

    Returns:
        A ``RunResult`` with propagated and local ``ErrorStats`` per pair index.

    Raises:
        InputError: one of the models failed on the inputs (names the node).
    """
    runner = _Runner(reference, candidate, pairs, budgets, padding or Padding(None), snapshots)
    return runner.run(ref_inputs, cand_inputs)


__all__ = ["Padding", "RunResult", "Snapshot", "TokenAxes", "fit_layout", "fit_layouts", "measure",
           "run_side_by_side"]
