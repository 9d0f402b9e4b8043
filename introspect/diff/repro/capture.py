"""The values at the first divergence, taken again: both recorded graphs replayed side by
side as the diff replayed them, keeping what the failing pair's nodes ran on.

The diff keeps per-node summaries only (``introspect.diff.ops.compare``), so a repro replays
the two recordings once more, in the same lock-step and local mode, and holds on to the
few values one repro needs: each side's inputs to the op that computed the divergent
values, each side's output at the pair the diff measured (the candidate's in local mode:
its op fed the reference's values), and how that pair was compared (region, feature
order, layout, padding). A replay runs the same kernels as the diff did, so the values
are the ones its figures came from.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx.node import map_arg

from introspect.diff.ops.compare.padding import Padding
from introspect.diff.ops.compare.replay import SAME, Runner
from introspect.diff.records import Pair, Region
from introspect.diff.tolerance import Budget
from introspect.run.modes import set_mode


@dataclass(frozen=True)
class ReplaySource:
    """What a replay of a diff needs besides the two graphs (kept on the ``DiffResult``)."""

    reference_inputs: Mapping[str, torch.Tensor]  # by placeholder name
    candidate_inputs: Mapping[str, torch.Tensor]
    budgets: Sequence[Budget]  # one per pair of the alignment
    attention_mask: torch.Tensor | None  # the padding the diff left out of its figures


@dataclass
class Side:
    """One side's chain at the divergence: the op that computed, then the layout ops down
    to the node the diff compared, with the computing op's arguments as it ran them."""

    nodes: list[torch.fx.Node]  # computing op first, compared node last
    args: tuple[Any, ...] = ()  # the computing op's arguments: tensors and constants
    kwargs: dict[str, Any] = field(default_factory=dict)
    output: torch.Tensor | None = None  # the compared node's value (candidate: local mode)


@dataclass
class Capture:
    """Both sides at the divergence, and how the diff compared the two outputs."""

    pair: Pair
    reference: Side
    candidate: Side
    budget: Budget
    padding: torch.Tensor | None = None  # True at padded positions, in the reference's shape
    feature_order: torch.Tensor | None = None  # candidate feature j is reference order[j]
    layout: Any = None  # compare.layouts.Layout: the candidate's value reshaped and permuted
    # compare.layouts.AxisOrder: the candidate's rows or tokens in another order (after
    # the layout)
    axis_order: Any = None
    candidate_region: Region | None = None
    reference_region: Region | None = None


class _Capturing(Runner):
    """The diff's side-by-side run, holding on to the values of one pair's chains."""

    def __init__(self, reference: torch.fx.GraphModule, candidate: torch.fx.GraphModule,
                 pairs: Sequence[Pair], budgets: Sequence[Budget], padding: Padding,
                 index: int, capture: Capture) -> None:
        super().__init__(reference, candidate, pairs, budgets, padding, snapshots=0)
        self.index = index
        self.capture = capture
        self.ref_first = capture.reference.nodes[0].name
        self.cand_first = capture.candidate.nodes[0].name
        # the compared nodes' values stay in the environments until the capture reads them
        self.ref_uses[capture.pair.reference] += 1
        self.cand_uses[capture.pair.candidate] += 1

    def _run_reference(self, node: torch.fx.Node, inputs: Mapping[str, torch.Tensor]) -> None:
        if node.name == self.ref_first and node.op not in ("placeholder", "get_attr"):
            env = self.ref_interp.env
            side = self.capture.reference
            side.args = _copied(map_arg(node.args, env.__getitem__))
            side.kwargs = _copied(map_arg(node.kwargs, env.__getitem__))
        super()._run_reference(node, inputs)

    def _run_candidate(self, node: torch.fx.Node, inputs: Mapping[str, torch.Tensor]) -> None:
        if node.name == self.cand_first and node.op not in ("placeholder", "get_attr"):
            side = self.capture.candidate
            side.args = _copied(map_arg(node.args, self._local_input))
            side.kwargs = _copied(map_arg(node.kwargs, self._local_input))
        super()._run_candidate(node, inputs)

    def _local(self, node: torch.fx.Node) -> Any:
        local = super()._local(node)
        if node.name == self.capture.pair.candidate:
            value = self.cand_interp.env[node] if local is SAME else local
            self.capture.candidate.output = _copied(value)
        return local

    def _room_for(self, i: int) -> bool:
        return False  # the hints' snapshots: not needed again

    def _compare(self, i: int, value: Any, local: Any) -> bool:
        exact = super()._compare(i, value, local)
        if i == self.index:
            pair, capture = self.pairs[i], self.capture
            reference = self.ref_interp.env[self.pair_ref_node[i]]
            capture.reference.output = _copied(reference)
            if pair.reference_region is not None:
                reference = reference.narrow(pair.reference_region.dim,
                                             pair.reference_region.start,
                                             pair.reference_region.stop
                                             - pair.reference_region.start)
            capture.padding = self.padding.mask_for(reference.shape,
                                                    self.axes.known(pair.reference))
            capture.feature_order = self.orders.get(i)
            capture.layout = self.layouts.get(i)
            capture.axis_order = self.axis_orders.get(i)
        return exact


def capture_pair(reference: torch.fx.GraphModule, candidate: torch.fx.GraphModule,
                 pairs: Sequence[Pair], source: ReplaySource, index: int,
                 reference_chain: list[torch.fx.Node],
                 candidate_chain: list[torch.fx.Node]) -> Capture:
    """Replay both graphs as the diff did and take pair ``index``'s values.

    Args:
        reference, candidate: the recorded GraphModules the diff replayed.
        pairs: the alignment's pairs; ``source.budgets`` one per pair.
        source: the inputs and padding the diff ran with.
        index: the failing pair.
        reference_chain, candidate_chain: each side's nodes from the op that computed the
            values down to the pair's node (``Side.nodes``).
    """
    pair = pairs[index]
    capture = Capture(pair, Side(reference_chain), Side(candidate_chain),
                      source.budgets[index], candidate_region=pair.candidate_region,
                      reference_region=pair.reference_region)
    runner = _Capturing(reference, candidate, pairs, source.budgets,
                        Padding(source.attention_mask), index, capture)
    runner.run(_onto_model(source.reference_inputs, reference),
               _onto_model(source.candidate_inputs, candidate))
    return capture


@contextlib.contextmanager
def evaluating(*models: torch.nn.Module) -> Iterator[None]:
    """Eval mode while the replay runs, as in the diff; each module's own mode afterwards
    (the diff put back a model it found in training mode)."""
    modes = [(m, m.training) for model in models for m in model.modules()]
    for model in models:
        set_mode(model, False)
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _onto_model(inputs: Mapping[str, torch.Tensor], model: torch.nn.Module
                ) -> dict[str, torch.Tensor]:
    """Copies of the inputs, where the model's weights are now: the diff puts a model it
    moved (``--device``) back where it found it, and the replay runs there."""
    weight = next(itertools.chain(model.parameters(), model.buffers()), None)
    return {k: v.to(weight.device if weight is not None else v.device, copy=True)
            for k, v in inputs.items()}


def _copied(value: Any) -> Any:
    """``value`` with every tensor detached and copied: later in-place ops leave it be."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_copied(v) for v in value) if not hasattr(value, "_fields") \
            else type(value)(*(_copied(v) for v in value))
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    return value


__all__ = ["Capture", "ReplaySource", "Side", "capture_pair", "evaluating"]
