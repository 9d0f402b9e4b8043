"""Each aligned pair's own backward, on each side, by the autograd functions its forward
recorded, fed the reference's output gradient and stopped at the nearest aligned nodes.

It runs only for a failing backward (``parity.backward_diff``): walking from the outputs,
the first pair whose own backward is over budget is the first divergence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx

from introspect.diff.backward.hints import gradient_hints
from introspect.diff.backward.measure import FLOOR, _budget, _Comparer, _errors
from introspect.diff.backward.record import GradientRecording
from introspect.diff.backward.results import (
    STATUS_FAIL,
    STATUS_NOT_COMPARED,
    STATUS_OK,
    GradientDiff,
)
from introspect.diff.records import Pair

_MAX_REGION = 64  # nodes walked back from a pair to the aligned nodes it reads


class _LocalBackward:
    """Each pair's backward on the reference's values and output gradient."""

    def __init__(self, ref_gm: torch.fx.GraphModule, cand_gm: torch.fx.GraphModule,
                 ref: GradientRecording, cand: GradientRecording, alignment: Any,
                 comparer: _Comparer, forward_status: Mapping[str, str]) -> None:
        self.forward_status = forward_status
        self.ref, self.cand = ref, cand
        self.comparer = comparer
        plain = [p for p in alignment.pairs if comparer.plain(p)]
        counts: dict[str, int] = {}
        for p in alignment.pairs:
            counts[p.candidate] = counts.get(p.candidate, 0) + 1
            counts["\x00" + p.reference] = counts.get("\x00" + p.reference, 0) + 1
        # Pairs one to one: the frontier of a local backward.
        self.by_cand = {p.candidate: p for p in plain if counts[p.candidate] == 1}
        self.by_ref = {p.reference: p for p in plain if counts["\x00" + p.reference] == 1
                       and p.candidate in self.by_cand}
        self.ref_nodes = {n.name: n for n in ref_gm.graph.nodes}
        self.cand_nodes = {n.name: n for n in cand_gm.graph.nodes}

    def apply(self, rows: list[GradientDiff]) -> list[GradientDiff]:
        """Each pair's local backward, walking from the outputs toward the inputs, up to
        the first one over budget: that pair is the divergence (``_first_divergence``
        takes the failing pair nearest the outputs), the pairs behind it keep their
        propagated status. A pair whose forward inputs already differ cannot decide
        (its backward runs on its own saved values) and is passed by."""
        out = list(rows)
        for i in sorted(range(len(rows)), key=lambda i: rows[i].reference_index, reverse=True):
            row = rows[i]
            pair = self.by_ref.get(row.reference_node)
            if pair is None or row.status == STATUS_NOT_COMPARED \
                    or pair.candidate != row.candidate_node or not self.decisive(pair):
                continue
            try:
                found = self.local(pair)
            except Exception as e:  # an op that cannot run again in isolation
                out[i] = _replace(row, hint=(row.hint + "; " if row.hint else "")
                                  + f"local backward not run ({type(e).__name__}: {e})")
                continue
            if found is None:
                continue
            err, over, hints, _, cut = found
            at = self._cut_row(rows, cut) if over and cut else None
            if at is not None:
                # Every gradient it hands back over budget reached no value of the
                # candidate's at all: its backward ran, and what it handed back was let go
                # (a detach, a hook returning zeros, between the value and this pair). The
                # first wrong gradient is the cut value's: it and the weights behind it are
                # what the port does not train, so that value is named.
                out[at] = _replace(rows[at], local_max_abs_err=err, status=STATUS_FAIL,
                                   hint="; ".join(hints))
                break
            out[i] = _replace(row, local_max_abs_err=err,
                              status=STATUS_FAIL if over else row.status,
                              hint="; ".join(hints) if over else row.hint)
            if over:
                break
        return out

    @staticmethod
    def _cut_row(rows: Sequence[GradientDiff], cut: Sequence[str]) -> int | None:
        """The row of the cut value nearest the outputs (``cut``: the reference's names of
        the values no gradient reached), None where none has a row."""
        wanted = set(cut)
        found = [i for i, row in enumerate(rows) if row.reference_node in wanted]
        return max(found, key=lambda i: rows[i].reference_index) if found else None

    def decisive(self, pair: Pair) -> bool:
        """The forward diff found every aligned value the pair's backward reads equal: the
        candidate's backward runs on its own saved values, so only then does it decide."""
        node = self.ref_nodes.get(pair.reference)
        if node is None:
            return False
        frontier = self._frontier(node, lambda n: n in self.by_ref)
        return frontier is not None and all(
            self.forward_status.get(name, STATUS_OK) == STATUS_OK
            for name in frontier if name in self.ref.tensors)

    def local(self, pair: Pair) -> tuple[float, bool, list[str], list[str], list[str]] \
            | None:
        """The pair's own backward on each side: its worst error, whether it is over
        budget, the hints, the values it reads, and, where every value whose gradient
        is over budget got none at all from the candidate's (the graph cut there),
        those values (else empty)."""
        g_out = self.ref.grads.get(pair.reference)
        if g_out is None:
            return None
        ref_node, cand_node = self.ref_nodes.get(pair.reference), \
            self.cand_nodes.get(pair.candidate)
        if ref_node is None or cand_node is None or ref_node.op in ("placeholder", "output") \
                or cand_node.op in ("placeholder", "output"):
            return None
        if pair.reference in self.ref.recomputed or pair.candidate in self.cand.recomputed:
            # made again in the backward (a reentrant checkpoint): its functions ran once
            # and are gone; the gradients autograd handed each side are what is compared
            return None
        if not self._same_frontier(ref_node, cand_node):
            return None
        ref_grads = self._vjp(ref_node, self.ref, g_out,
                              lambda n: n in self.by_ref)
        g_cand = self.comparer.to_candidate(pair, g_out)
        if g_cand is None or ref_grads is None:
            return None
        cand_grads = self._vjp(cand_node, self.cand, g_cand,
                               lambda n: n in self.by_cand)
        if cand_grads is None:
            return None
        worst, over, hints, cut, uncut = 0.0, False, [], [], False
        frontier = {**{self.by_cand[c].reference: g for c, g in cand_grads.items()}}
        for name in dict.fromkeys([*ref_grads, *frontier]):
            front_pair = self.by_ref.get(name)
            if front_pair is None:
                continue
            g_ref = ref_grads.get(name)
            g_c = frontier.get(name)
            value = self.ref.values[name]
            g_ref = torch.zeros_like(value) if g_ref is None else g_ref
            if g_c is None:
                g_c_ref = torch.zeros_like(value)
            else:
                mapped = self.comparer.to_reference(front_pair, g_c)
                if mapped is None or mapped.shape != g_ref.shape:
                    continue
                g_c_ref = mapped
            scale = max(float(g_ref.abs().max()) if g_ref.numel() else 0.0,
                        FLOOR * float(g_out.abs().max()))
            # (with the reference's rounding noise measured: at least its noise there)
            budget = _budget(self.comparer.tolerance, g_ref.dtype, scale,
                             self.comparer.noise.get(name))
            err, _, bad, _ = _errors(g_c_ref, g_ref, budget,
                                     allow_nonfinite=self.comparer.allow_nonfinite)
            worst = max(worst, err)
            if bad:
                over = True
                if g_c is None:
                    cut.append(name)
                else:
                    uncut = True
                pad = self.comparer.pad_for(g_ref.shape)
                hints += gradient_hints(g_c_ref, g_ref, pad, cut=g_c is None,
                                        where=f"the gradient into {name}")
        return worst, over, list(dict.fromkeys(hints)), list(ref_grads), \
            [] if uncut else cut

    def _same_frontier(self, ref_node: torch.fx.Node, cand_node: torch.fx.Node) -> bool:
        """Whether the two nodes read the same aligned values in their forward graphs: a
        Linear that a norm's gain was folded into reads the norm's output before its gain
        (paired with nothing), the reference's reads it after (paired with the candidate's
        residual), so their backwards stop at different nodes and compare nothing. (A
        gradient cut by ``detach`` or a hook leaves the graphs alike: it is still found.)"""
        ref_front = self._frontier(ref_node, lambda n: n in self.by_ref)
        cand_front = self._frontier(cand_node, lambda n: n in self.by_cand)
        return ref_front is not None and cand_front is not None \
            and set(ref_front) == {self.by_cand[c].reference for c in cand_front}

    @staticmethod
    def _frontier(node: torch.fx.Node, is_frontier: Any) -> list[str] | None:
        """The aligned nodes ``node`` reads, through the nodes with no counterpart."""
        frontier: list[str] = []
        seen: set[str] = set()
        stack = list(node.all_input_nodes)
        while stack:
            n = stack.pop()
            if n.name in seen:
                continue
            seen.add(n.name)
            if is_frontier(n.name):
                frontier.append(n.name)
            elif n.op not in ("placeholder", "get_attr"):
                if len(seen) > _MAX_REGION:
                    return None
                stack.extend(n.all_input_nodes)
        return frontier

    def _vjp(self, node: torch.fx.Node, side: GradientRecording, g_out: torch.Tensor,
             is_frontier: Any) -> dict[str, torch.Tensor | None] | None:
        """``node``'s own backward, run by autograd's recorded functions, back to the
        aligned nodes it reads (``_run_backward``)."""
        frontier = self._frontier(node, is_frontier)
        out = side.tensors.get(node.name)
        root = side.edges.get(node.name)
        if frontier is None or out is None or root is None:
            return None
        stops = {side.edges[name]: name for name in frontier if name in side.edges}
        found = _run_backward(root, g_out.to(out.dtype), stops)
        if found is None:
            return None
        return {name: found.get(name) for name in frontier if name in side.tensors}


_MAX_FUNCTIONS = 400  # autograd functions one local backward may run


def _run_backward(start: tuple[Any, int], g_out: torch.Tensor,
                  stops: Mapping[tuple[Any, int], str]) -> dict[str, torch.Tensor] | None:
    """Run autograd's functions from ``start`` (a value's edge) back to ``stops``, no further.

    ``torch.autograd.grad`` would give total derivatives: a gradient reaching an aligned
    node through another aligned node (a residual add reads x and f(x)) would carry f's
    backward too, and a bug in f would show at the add. Here each function of the graph
    kept by the recording is called directly (with the saved tensors of the real forward,
    custom ``Function.backward``s and all), stopping at the aligned nodes' edges, so the
    gradient into each of them is the local one. Returns None where the region between
    is too large (the stops do not cut ``out`` from the rest of the graph).
    """
    if start in stops:
        # The node's value is the very value of an aligned node it reads (dropout in eval,
        # ``contiguous`` of a contiguous tensor return their input): its backward is the
        # identity. Walking on from here would run the input's own backward instead, and
        # everything behind it, and collect nothing.
        return {stops[start]: g_out}
    root, root_nr = start
    stop_nodes = {node for node, _ in stops}
    region: dict[Any, int] = {}  # autograd node -> inputs from within the region
    order = [root]
    region[root] = 0
    i = 0
    while i < len(order):
        fn = order[i]
        i += 1
        for next_fn, _ in fn.next_functions:
            if next_fn is None or next_fn in stop_nodes or _is_sink(next_fn):
                continue
            if next_fn not in region:
                if len(region) >= _MAX_FUNCTIONS:
                    return None
                region[next_fn] = 0
                order.append(next_fn)
            region[next_fn] += 1
    pending: dict[Any, list[torch.Tensor | None]] = {root: [None] * root_nr + [g_out]}
    ready = [root]
    collected: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        while ready:
            fn = ready.pop()
            grads = pending.pop(fn, [])
            n_edges = len(fn.next_functions)
            results = _call(fn, grads) if any(g is not None for g in grads) \
                else (None,) * n_edges
            for (next_fn, nr), g in zip(fn.next_functions, results, strict=False):
                if next_fn is None:
                    continue
                if g is not None:
                    g = _as_input(next_fn, nr, g)
                if (next_fn, nr) in stops:
                    if g is not None:
                        name = stops[(next_fn, nr)]
                        collected[name] = g if name not in collected else collected[name] + g
                    continue
                if next_fn in stop_nodes or _is_sink(next_fn) or next_fn not in region:
                    continue
                if g is not None:
                    slots = pending.setdefault(next_fn, [])
                    while len(slots) <= nr:
                        slots.append(None)
                    slots[nr] = g if slots[nr] is None else slots[nr] + g
                region[next_fn] -= 1
                if region[next_fn] == 0:
                    ready.append(next_fn)
    return collected


def _as_input(fn: Any, nr: int, g: torch.Tensor) -> torch.Tensor:
    """What autograd's engine does between two functions: sum a broadcast gradient back
    to the input's shape, cast it to the input's dtype."""
    metadata = getattr(fn, "_input_metadata", None)
    if not metadata or nr >= len(metadata):
        return g
    shape, dtype = tuple(metadata[nr].shape), metadata[nr].dtype
    if tuple(g.shape) != shape:
        g = g.sum_to_size(shape)
    return g if g.dtype == dtype else g.to(dtype)


def _is_sink(fn: Any) -> bool:
    """A parameter's or input's gradient accumulator: never called (it writes .grad)."""
    return type(fn).__name__ == "AccumulateGrad"


def _call(fn: Any, grads: list[torch.Tensor | None]) -> Sequence[torch.Tensor | None]:
    """One autograd function's backward on ``grads`` (missing ones as zeros of no shape)."""
    outputs = fn.apply(*grads) if hasattr(fn, "_forward_cls") else fn(*grads)
    if isinstance(outputs, torch.Tensor) or outputs is None:
        return (outputs,)
    return tuple(outputs)


def _replace(row: GradientDiff, **changes: Any) -> GradientDiff:
    from dataclasses import replace

    return replace(row, **changes)


__all__: list[str] = []
