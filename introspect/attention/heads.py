"""Head-by-head parity: which attention head of which layer parts from the reference.

Parity is local, as the diff's is: each head of the candidate is computed from the
*reference's* inputs to that layer's attention (the hidden states, and the position
tables where the attention takes them), so an error carried in from an earlier layer
does not show as a divergent head. A port with a tanh GELU in layer 3 has every head
within budget (its attention is right); a port with the query rows of two heads of
layer 1 swapped parts exactly at the first of those heads. The attention probabilities
of every head are compared on the real tokens; a head diverges when some weight is off
by more than the budget of the dtype they are compared in
(``|cand - ref| <= atol + rtol * |ref|``).

Where the reference's inputs cannot be put in (a layer whose attention takes its input
in another layout, or the candidate's first layer receives something else than the
reference's), the models are compared each on its own run, and ``HeadParity.note`` and
the summary say so.

Example::

    >>> parity = introspect.attention.compare_heads(hf_model, port, inputs)
    >>> parity.first_divergence
    (1, 3)
    >>> parity.frame().head(3)          # layer, head, max_abs_err, passed
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.fx

from introspect.attention.maps import (
    AttentionMaps,
    _accepted,
    _module_of,
    _unpack,
    attention,
    attention_nodes,
    probabilities_of,
    returning,
)
from introspect.attention.views import parity_svg
from introspect.diff.tolerance import Budget, Tolerance, compare_dtype
from introspect.errors import InputError, TraceError
from introspect.models.load import TokenizedInputs
from introspect.run.modes import set_mode

if TYPE_CHECKING:
    import pandas


@dataclass
class HeadParity:
    """The attention of a candidate compared with a reference's, head by head.

    Attributes:
        reference, candidate: the two models' attention maps.
        max_abs_err: ``(layers, heads)`` largest |difference| over real tokens.
        passed: ``(layers, heads)`` bool, every weight within ``budget``.
        budget: the error budget of the dtype the maps are compared in.
        local: the candidate's maps were computed from the reference's inputs to each
            layer (False: each model on its own run, see ``note``).
        note: why the comparison is not local, or "".
    """

    reference: AttentionMaps
    candidate: AttentionMaps
    max_abs_err: torch.Tensor
    passed: torch.Tensor
    budget: Budget
    local: bool = False
    note: str = ""
    reordered: tuple[int, ...] = ()  # layers whose heads the candidate holds in another order

    @property
    def first_divergence(self) -> tuple[int, int] | None:
        """(layer, head) of the first head over budget, in layer then head order."""
        failing = (~self.passed).nonzero()
        if not len(failing):
            return None
        layer, head = failing[0].tolist()
        return int(layer), int(head)

    @property
    def all_passed(self) -> bool:
        return bool(self.passed.all())

    def worst_row(self, layer: int, head: int) -> int:
        """The batch row where head (layer, head) differs most (the one to draw)."""
        diff = (self.candidate.probs[layer, :, head] - self.reference.probs[layer, :, head]).abs()
        real = self.reference.keep[:, :, None] & self.reference.keep[:, None, :]
        return int((diff * real).amax(dim=(1, 2)).argmax())

    def frame(self) -> pandas.DataFrame:
        """One row per (layer, head): max_abs_err and passed."""
        import pandas as pd

        L, nh = self.max_abs_err.shape
        return pd.DataFrame({
            "layer": [layer for layer in range(L) for _ in range(nh)],
            "head": [head for _ in range(L) for head in range(nh)],
            "max_abs_err": [float(v) for v in self.max_abs_err.reshape(-1)],
            "passed": [bool(v) for v in self.passed.reshape(-1)],
        })

    def csv(self) -> str:
        """The per-head table as CSV text (errors in 6 significant digits, stable)."""
        lines = ["layer,head,max_abs_err,passed"]
        for row in self.frame().itertuples(index=False):
            lines.append(f"{row.layer},{row.head},{row.max_abs_err:.6g},"
                         f"{'true' if row.passed else 'false'}")
        return "\n".join(lines) + "\n"

    def summary(self) -> str:
        """One line: every head within budget, or the first that is not."""
        L, nh = self.max_abs_err.shape
        worst = float(self.max_abs_err.max())
        first = self.first_divergence
        how = ("each head on the reference's inputs to its layer" if self.local
               else f"each model on its own run: {self.note}" if self.note
               else "each model on its own run")
        if self.reordered:
            how += (f"; the candidate's heads of {len(self.reordered)} layer(s) compared "
                    "with the reference's they match, in another order")
        if first is None:
            return (f"attention heads ({how}): all {L}x{nh} heads within budget "
                    f"(max abs error {worst:.3g})")
        layer, head = first
        failing = int((~self.passed).sum())
        return (f"attention heads ({how}): first divergent head: layer {layer}, head {head} "
                f"(max abs error {float(self.max_abs_err[layer, head]):.3g} over budget "
                f"{self.budget}); {failing} of {L * nh} heads over budget")

    def svg(self, layer: int | None = None, head: int | None = None) -> str:
        """Side-by-side heatmaps of one head: reference, candidate and their difference.

        Defaults to the first divergent head (or layer 0, head 0 when all agree), drawn
        for the batch row where it differs most.
        """
        if layer is None or head is None:
            layer, head = self.first_divergence or (0, 0)
        self.reference.check(layers=[layer], heads=[head])
        return parity_svg(self.reference, self.candidate, self.budget, layer, head,
                          self.worst_row(layer, head))


def compare_heads(reference: torch.nn.Module, candidate: torch.nn.Module,
                  inputs: TokenizedInputs | Mapping[str, torch.Tensor], *,
                  atol: float | None = None, rtol: float | None = None,
                  local: bool = True) -> HeadParity:
    """Compare the attention probabilities of two models head by head.

    Args:
        reference: the trusted model (e.g. HF BERT, sdpa or eager).
        candidate: the model checked (a port, another dtype or attention kernel).
        inputs: ``introspect.tokenize(...)`` output or a mapping of tensors by name.
        atol, rtol: override the budget (default: per dtype, as ``introspect.diff``).
        local: compute each of the candidate's layers from the reference's inputs to it
            (default); False compares the two models each on its own run.

    Returns:
        A ``HeadParity``: per-head errors, the first divergent head, a heatmap of it.

    Raises:
        InputError: the two models differ in the number of layers, heads or tokens.
        TraceError: either model cannot be traced or holds no attention.
    """
    ref = attention(reference, inputs, title="reference")
    cand = attention(candidate, inputs, title="candidate")
    if ref.probs.shape != cand.probs.shape:
        raise InputError(
            f"cannot compare attention head by head: the reference has "
            f"{ref.num_layers} layers x {ref.num_heads} heads over {ref.probs.shape[-1]} "
            f"tokens, the candidate {cand.num_layers} x {cand.num_heads} over "
            f"{cand.probs.shape[-1]}")
    note = ""
    if local:
        try:
            probs, note = local_probabilities(reference, candidate, inputs)
        except (TraceError, RuntimeError, KeyError, TypeError, ValueError, IndexError) as e:
            # (the error's own words are torch's about the port's internals: a size
            # mismatch of its hand-written heads, nothing a user of the verdict acts on)
            probs, note = None, ("the reference's inputs could not be put in the candidate's "
                                 f"layers ({type(e).__name__})")
        if probs is not None and probs.shape == cand.probs.shape:
            cand = replace(cand, probs=probs)
        elif probs is not None:
            note = "the candidate's attention on the reference's inputs has another shape"
    is_local = local and not note
    dtype = compare_dtype(_dtype_name(reference), _dtype_name(candidate))
    budget = Tolerance(atol=atol, rtol=rtol).budget(dtype)
    real = (ref.keep[:, :, None] & ref.keep[:, None, :])[None, :, None]  # (1, B, 1, S, S)
    probs, reordered = _heads_in_reference_order(cand.probs, ref.probs, real)
    if reordered:
        cand = replace(cand, probs=probs)
    diff = (cand.probs - ref.probs).abs() * real
    allowed = budget.atol + budget.rtol * ref.probs.abs()
    max_abs_err = diff.amax(dim=(1, 3, 4))  # (L, nh)
    passed = ~((diff > allowed) & real).any(dim=(1, 3, 4))
    return HeadParity(ref, cand, max_abs_err, passed, budget, is_local, note, reordered)


def _heads_in_reference_order(candidate: torch.Tensor, reference: torch.Tensor,
                              real: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The candidate's heads ``(L, B, nh, S, S)`` each put at the reference head it
    matches, in each layer where they come in another order (a port permuting its heads'
    blocks of q, k and v rows, and the output projection's columns to match): each head
    to its nearest, one to one, and far nearer than in its own place (100x), so that a
    head that merely differs is never moved. Returns the probabilities and those layers."""
    reordered, layers = [], []
    for layer in range(candidate.shape[0]):
        mine, theirs = candidate[layer], reference[layer]  # (B, nh, S, S)
        gaps = ((mine[:, :, None] - theirs[:, None, :]).abs() * real[0, :, :, None]) \
            .amax(dim=(0, 3, 4))  # (candidate head, reference head)
        order = gaps.argmin(dim=1)
        own = torch.arange(order.numel())
        if torch.equal(order, own) or torch.unique(order).numel() != order.numel() \
                or not float(gaps[own, order].max()) <= 0.01 * float(gaps[own, own].max()):
            layers.append(mine)
            continue
        layers.append(mine.index_select(1, torch.argsort(order)))  # reference head j's
        reordered.append(layer)
    return (torch.stack(layers) if reordered else candidate), tuple(reordered)


# ----------------------------------------------------------------------------------------
# Local parity: the candidate's attention fed the reference's inputs to each layer

_LOOSE = 1e-3  # layer 0's inputs must agree this well (relative to their size) to be swapped


def local_probabilities(reference: torch.nn.Module, candidate: torch.nn.Module,
                        inputs: TokenizedInputs | Mapping[str, torch.Tensor]
                        ) -> tuple[torch.Tensor | None, str]:
    """The candidate's attention probabilities, each layer computed from the reference's
    inputs to that layer: ``((layers, batch, heads, query, key), "")``, or ``(None, why)``.

    A layer's inputs are the floating tensors of three dimensions that enter the module
    its attention runs in (found by walking back from the attention node, in both traced
    graphs): the hidden states, and the position tables of a rotary attention. Each of
    the candidate's is replaced by the reference's of the same shape, in order; the
    masks, the weights and anything of another shape stay the candidate's own.
    """
    from introspect.tracing.tracer import trace_module

    if isinstance(reference, torch.fx.GraphModule) or isinstance(candidate, torch.fx.GraphModule):
        return None, "a model given as a traced GraphModule runs as it is"
    tensors = _unpack(inputs)[0]
    ref_taken, cand_taken = _accepted(reference, tensors), _accepted(candidate, tensors)
    modes = reference.training, candidate.training
    set_mode(reference, False)
    set_mode(candidate, False)
    try:
        ref_gm = trace_module(reference, ref_taken).gm
        cand_gm = trace_module(candidate, cand_taken).gm
        ref_layers = [_layer_inputs(n) for n in attention_nodes(ref_gm.graph)]
        cand_layers = [_layer_inputs(n) for n in attention_nodes(cand_gm.graph)]
        if len(ref_layers) != len(cand_layers):
            return None, "the two models hold different numbers of attention layers"
        ref_values = _values(ref_gm, [e for externals, _ in ref_layers for e in externals],
                             ref_taken)
        plan: list[list[tuple[torch.fx.Node, torch.Tensor, set[torch.fx.Node]]]] = []
        for layer, ((ref_ext, _), (cand_ext, inside)) in enumerate(
                zip(ref_layers, cand_layers, strict=True)):
            pending = [ref_values[e.name] for e in ref_ext]
            chosen = []
            for e in cand_ext:
                shape = _meta_shape(e)
                match = next((v for v in pending if tuple(v.shape) == shape), None)
                if match is not None:
                    pending.remove(match)
                    chosen.append((e, match, inside))
            if not chosen:
                # (a port with no module around each layer's attention, its weights
                # stacked, hands it q, k and v alone: "another layout" was untrue there)
                where = "its module takes" if _module_of(attention_nodes(cand_gm.graph)[layer]) \
                    else "it sits in no module of its own, and takes"
                return None, (f"layer {layer}'s attention in the candidate: {where} no input "
                              "of the shape the reference's takes")
            plan.append(chosen)
        first_own = _values(cand_gm, [e for e, _, _ in plan[0]], cand_taken)
        # the candidate's batch rows, or its tokens, among the reference's, where reordered
        rows = tokens = None
        for e, value, _ in plan[0]:  # the pairing is right where no error has built up yet
            own = first_own[e.name].float()
            if not _close(own, value.float()):
                if rows is None and tokens is None:
                    rows = _row_order(own, value.float())
                    if rows is None and own.ndim >= 3:  # (a sequence run back to front)
                        tokens = _row_order(own.transpose(0, 1), value.float().transpose(0, 1))
                if rows is None and tokens is None \
                        or not _close(own, _reordered(value.float(), rows, tokens)):
                    return None, _why_layer_0_differs(ref_gm, ref_taken, cand_gm, own)
        if rows is not None or tokens is not None:  # each layer's inputs in the candidate's order
            plan = [[(e, _reordered(value, rows, tokens), inside) for e, value, inside in chosen]
                    for chosen in plan]
        with torch.no_grad():
            per_layer = _substituted_run(cand_gm, plan, cand_taken)
    finally:
        set_mode(reference, modes[0])
        set_mode(candidate, modes[1])
    probs = torch.stack([p.float() for p in per_layer])  # (L, B, nh, S, S)
    if rows is not None:  # back in the reference's row order
        probs = probs.index_select(1, torch.argsort(rows))
    if tokens is not None:  # queries and keys back in the reference's token order
        back = torch.argsort(tokens)
        probs = probs.index_select(3, back).index_select(4, back)
    return probs, ""


def _row_order(own: torch.Tensor, reference: torch.Tensor) -> torch.Tensor | None:
    """The order of the candidate's batch rows among the reference's (candidate row k is
    reference row ``order[k]``) where each of its rows is one of the reference's (a port
    that sorts its rows by length, or runs them reversed); None where some is none, or
    the rows are in their own order. Alike rows are taken in turn."""
    if own.ndim < 2 or own.shape != reference.shape or own.shape[0] < 2:
        return None
    order: list[int] = []
    for k in range(own.shape[0]):
        j = next((j for j in range(reference.shape[0])
                  if j not in order and _close(own[k], reference[j])), None)
        if j is None:
            return None
        order.append(j)
    return None if order == sorted(order) else torch.tensor(order)


def _reordered(value: torch.Tensor, rows: torch.Tensor | None,
               tokens: torch.Tensor | None) -> torch.Tensor:
    """A reference value ``(B, S, ...)`` in the candidate's order of rows and tokens."""
    if rows is not None and value.ndim and value.shape[0] == rows.numel():
        value = value.index_select(0, rows)
    if tokens is not None and value.ndim >= 2 and value.shape[1] == tokens.numel():
        value = value.index_select(1, tokens)
    return value


def _why_layer_0_differs(ref_gm: torch.fx.GraphModule, ref_taken: Mapping[str, torch.Tensor],
                         cand_gm: torch.fx.GraphModule, own: torch.Tensor) -> str:
    """Why the reference's inputs cannot be put in the candidate's layer 0: they differ,
    or what enters the module holding the candidate's attention is another of the
    reference's values (a block that is one module is entered before its norm: probe
    round o, where "they differ" was untrue)."""
    first = attention_nodes(ref_gm.graph)[0]
    before = []
    for node in ref_gm.graph.nodes:
        if node is first:
            break
        if _is_activation(node) and _meta_shape(node) == tuple(own.shape):
            before.append(node)
    values = _values(ref_gm, before, ref_taken) if before else {}
    same = next((n for n in reversed(before) if _close(own, values[n.name].float())), None)
    if same is None:
        return "the candidate's inputs to layer 0's attention differ from the reference's"
    where = _module_of(attention_nodes(cand_gm.graph)[0]) or "the model itself"
    return (f"what enters the candidate's {where}, which holds layer 0's attention, is the "
            f"reference's {same.name}, not its input to that attention: the module holds "
            "more than the attention (a norm before it)")


def _layer_inputs(node: torch.fx.Node) -> tuple[list[torch.fx.Node], set[torch.fx.Node]]:
    """The tensors entering the attention's module on the way to ``node``, and the nodes
    inside that module on that way (``node`` included)."""
    module = _module_of(node)

    def inside(n: torch.fx.Node) -> bool:
        path = _module_of(n)
        return bool(module) and (path == module or path.startswith(module + "."))

    seen, stack, found, within = {node}, [node], [], {node}
    while stack:
        current = stack.pop()
        for source in current.all_input_nodes:
            if source in seen:
                continue
            seen.add(source)
            if inside(source) and source.op not in ("placeholder", "get_attr"):
                within.add(source)
                stack.append(source)
            elif source.op not in ("placeholder", "get_attr") and _is_activation(source):
                found.append(source)
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    return sorted(found, key=order.__getitem__), within


def _is_activation(node: torch.fx.Node) -> bool:
    meta = node.meta.get("tensor_meta")
    dtype = getattr(meta, "dtype", None)
    return isinstance(dtype, torch.dtype) and dtype.is_floating_point and \
        len(getattr(meta, "shape", ())) == 3


def _meta_shape(node: torch.fx.Node) -> tuple[int, ...]:
    return tuple(node.meta["tensor_meta"].shape)


def _values(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node],
            inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The values of ``nodes`` (of ``gm``'s graph) when ``gm`` runs on ``inputs``."""
    import copy

    graph = copy.deepcopy(gm.graph)
    by_name = {n.name: n for n in graph.nodes}
    names = list(dict.fromkeys(n.name for n in nodes))
    rewritten = returning(gm, graph, [by_name[name] for name in names])
    with torch.no_grad():
        values = rewritten(**inputs)
    return dict(zip(names, values, strict=True))


def _substituted_run(gm: torch.fx.GraphModule,
                     plan: list[list[tuple[torch.fx.Node, torch.Tensor, set[torch.fx.Node]]]],
                     inputs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """``gm``'s attention probabilities with each layer's inputs swapped for the plan's."""
    import copy

    graph = copy.deepcopy(gm.graph)
    by_name = {n.name: n for n in graph.nodes}
    first = next(iter(graph.nodes))
    feeds: dict[str, torch.Tensor] = {}
    for layer, chosen in enumerate(plan):
        for i, (external, value, inside) in enumerate(chosen):
            name = f"introspect_reference_{layer}_{i}"
            with graph.inserting_before(first):
                placeholder = graph.placeholder(name)
            feeds[name] = value.to(external.meta["tensor_meta"].dtype)
            for node in inside:
                by_name[node.name].replace_input_with(by_name[external.name], placeholder)
    rewritten = returning(gm, graph, probabilities_of(graph, attention_nodes(graph)))
    result: tuple[torch.Tensor, ...] = rewritten(**inputs, **feeds)
    return result


def _close(own: torch.Tensor, reference: torch.Tensor) -> bool:
    scale = float(reference.abs().max()) if reference.numel() else 0.0
    return bool((own - reference).abs().max() <= _LOOSE * max(scale, 1.0))


def _dtype_name(model: torch.nn.Module) -> str:
    """The floating dtype of the model's parameters (float32 when it has none)."""
    for parameter in model.parameters():
        if parameter.is_floating_point():
            return str(parameter.dtype).removeprefix("torch.")
    return "float32"
