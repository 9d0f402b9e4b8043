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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.fx.node import map_arg

from introspect.diff.eager import mutates_in_place
from introspect.diff.records import ErrorStats, Pair
from introspect.diff.tolerance import Budget
from introspect.errors import InputError
from introspect.shapes import ValueShapeProp

_SAME = object()  # the substituted value is the candidate's own (bit-identical to the reference's)
_MAX_LAYOUT_DIMS = 5  # permutations tried when two paired values differ by layout


class Padding:
    """Which elements of a value sit at padded token positions, found from the shapes.

    A dimension after the first counts as a token axis when its size is the sequence
    length; when the last two dimensions both are (attention scores), both count. A
    value whose first dimension is not the batch has no padding positions.
    """

    def __init__(self, attention_mask: torch.Tensor | None) -> None:
        self.padded: torch.Tensor | None = None
        if attention_mask is not None and attention_mask.ndim >= 2:
            padded = attention_mask.reshape(-1, attention_mask.shape[-1]) == 0  # (N, S)
            self.padded = padded if bool(padded.any()) else None
        self._cache: dict[tuple[int, ...], torch.Tensor | None] = {}

    def mask_for(self, shape: Sequence[int]) -> torch.Tensor | None:
        """A boolean mask broadcastable to ``shape``, True at padding positions, or None."""
        shape = tuple(shape)
        if shape not in self._cache:
            self._cache[shape] = self._build(shape)
        return self._cache[shape]

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


def fit_layout(candidate: torch.Tensor, reference: torch.Tensor) -> _Layout | None:
    """The reshape + permute that brings ``candidate`` closest to ``reference``, if any."""
    cand_shape, ref_shape = tuple(candidate.shape), tuple(reference.shape)
    if candidate.numel() != reference.numel() or len(ref_shape) > _MAX_LAYOUT_DIMS:
        return None
    best: tuple[float, _Layout] | None = None
    for perm in itertools.permutations(range(len(ref_shape))):
        layout = _Layout(perm, cand_shape, ref_shape)
        moved = layout.to_reference(candidate)
        error = float((moved.double() - reference.double()).abs().mean()) if moved.numel() else 0.0
        if best is None or error < best[0]:
            best = (error, layout)
        if error == 0.0:
            break
    return best[1] if best else None


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
        return ErrorStats(0.0, 0.0, 0.0, 0, nonfinite, real_count, 0.0, 0, nonfinite), True
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
                           reference_nonfinite, _max(magnitude.nan_to_num(posinf=0.0)))
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
    )
    return stats, False


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
        exact = True
        indices = self.by_candidate.get(node.name, ())
        if indices:
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
            return ref_value.to(value.dtype) if ref_value.shape == value.shape else _SAME
        assembled = (local if isinstance(local, torch.Tensor) else value).clone()
        for i in indices:
            ref_value = ref_env.get(self.pair_ref_node[i])
            if ref_value is None:
                continue
            part = _narrow(assembled, self.pairs[i].candidate_region)
            if i in self.layouts:  # e.g. the candidate's rows flattened: (B*S, H) for (B, S, H)
                ref_value = self.layouts[i].to_candidate(ref_value)
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
        if pair.candidate_region is not None:
            value = _narrow(value, pair.candidate_region)
            if isinstance(local, torch.Tensor):
                local = _narrow(local, pair.candidate_region)
        if value.shape != reference.shape:
            layout = self.layouts.get(i) or fit_layout(value, reference)
            if layout is None:
                self.result.errors[i] = (f"shapes {tuple(value.shape)} and "
                                         f"{tuple(reference.shape)} hold different numbers "
                                         "of elements")
                return False
            self.layouts[i] = layout
            self.result.layouts[i] = str(layout)
            value = layout.to_reference(value)
            if isinstance(local, torch.Tensor):
                local = layout.to_reference(local)
        pad = self.padding.mask_for(reference.shape)
        budget = self.budgets[i]
        cand_node = self.cand_by_name[pair.candidate]
        known_finite = _moves_data(cand_node) and all(
            n.name in self.finite for n in cand_node.all_input_nodes if n.op != "get_attr")
        propagated, exact = measure(value, reference, budget, pad, known_finite=known_finite)
        if propagated.nonfinite == 0:
            self.finite.add(pair.candidate)
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
        inputs = tuple(self._local_input(n) for n in cand_node.all_input_nodes)
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


__all__ = ["Padding", "RunResult", "Snapshot", "fit_layout", "measure", "run_side_by_side"]
