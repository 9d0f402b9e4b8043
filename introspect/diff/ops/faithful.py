"""The truth runs against the recordings: faithful or not, and the divergence they name.

``introspect.diff.outputs`` compares the two models' plain calls; this module ties that
verdict to the rest of the diff:

- ``faithful_recordings``: each recording must reproduce its model's own ``no_grad`` call
  bit for bit (outputs made outside torch cannot be recorded at all). Where it does not (a
  fast path, a compiled region, autocast), the notes say so in one line naming the module
  where the paths part (``introspect.run.boundaries``), and node-level values no longer
  decide anything;
- ``recorded_call_verdict``: the recording is one more call of the model, held to the
  reference like the plain calls;
- ``truth_divergence``: where the truth runs fail and the recording cannot say where, the
  first divergence is the module where the paths part, or the worst output.

The reference called once more at the end is tier 1's (``introspect.run.reference``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.fx

from introspect.diff.outputs import TruthVerdict
from introspect.diff.records import STATUS_FAIL, Divergence
from introspect.errors import InputError
from introspect.graph import IntrospectGraph
from introspect.run.boundaries import reference_module, where_paths_part
from introspect.run.outputs import flatten_outputs
from introspect.run.truth import Truth, TruthCall, identical


def faithful_recordings(ref_truth: Truth, ref_recording: Any, cand_truth: Truth,
                        cand_recording: Any, candidate: torch.nn.Module,
                        cand_inputs: Mapping[str, torch.Tensor], labels: tuple[str, str],
                        noise_budget: bool,
                        ) -> tuple[bool, list[str], tuple[str, str, float] | None]:
    """Whether both recordings reproduce their models' own calls, the notes, where they part.

    Returns:
        (faithful, notes, parted): ``parted`` is the candidate's (module, class, largest
        difference) where its recording leaves the path its plain call takes, or None.
    """
    notes: list[str] = []
    faithful = True
    parted = None
    sides = [(labels[1], cand_truth, cand_recording)]
    if not noise_budget:  # the reference was recorded in float64 then: not the same run
        sides.insert(0, (labels[0], ref_truth, ref_recording))
    for label, truth, recording in sides:
        if recording is None:
            faithful = False
            continue
        recorded = flatten_outputs(recording.recorded_outputs)
        outside = [n for n in truth.no_grad_outputs if n not in recorded]
        # The recording runs the path a call with autograd on takes (any torch function
        # mode switches the fast paths off): reproducing either call makes it faithful.
        differing = min(([n for n in outputs if n in recorded
                          and not identical(outputs[n], recorded[n])]
                         for outputs in (truth.no_grad_outputs, truth.grad_outputs)), key=len)
        if outside:
            notes.append(f"the {label}'s {', '.join(outside)} was made outside torch (NumPy?): "
                         "the recording cannot see how; it is compared as returned")
            faithful = False
        if differing:
            faithful = False
            where = ""
            if truth is cand_truth:
                parted = where_paths_part(candidate, cand_inputs)
            if parted is not None and truth is cand_truth:
                where = (f"; the paths part at {parted[0]} ({parted[1]}, its plain output "
                         f"differs from the recorded one by {parted[2]:.3g})")
            notes.append(f"the recording of the {label} reproduces neither of its own calls "
                         f"({', '.join(differing)} differ{where}: a PyTorch fast path, a "
                         "compiled region or autocast that any recording switches off); the "
                         "node-level values explain the path the recording took, and the "
                         "verdict comes from the two models' own calls")
    return faithful, notes, parted


def recorded_call_verdict(judge: Callable[[Truth], TruthVerdict], truth: Truth,
                          recording: Any, label: str) -> str | None:
    """The recording is one more call of the model: it must agree with the reference too.

    A forward wrong on its fourth call only (a counter) passes three plain calls; the
    recording, its fourth, computes the fault. Where the recording reproduces none of the
    plain calls bit for bit, its outputs are judged as a call of their own (rounding of a
    fast path stays within budget; a fast path's fault already failed its ``no_grad``
    call). Returns the note saying why the diff fails, or None.
    """
    if recording is None:
        return None
    recorded = flatten_outputs(recording.recorded_outputs)
    if not recorded or any(all(identical(call.outputs.get(n), v) for n, v in recorded.items())
                           for call in truth.calls):
        return None
    try:
        verdict = judge(Truth([TruthCall(True, recorded, []), TruthCall(False, recorded, [])]))
    except InputError:  # nothing recorded stands for a reference output: nothing to judge
        return None
    worst = verdict.worst_failing()
    if verdict.passed or worst is None or worst.max_abs_err is None:
        return None
    return (f"the {label}'s forward changes from call to call: its plain calls agree with the "
            f"reference, yet one more call (the recording's) returned {worst.reference_output} "
            f"off by {worst.max_abs_err:.3g} (a counter, a cache or state its calls change); "
            "the diff fails, since no single call can be trusted")


def truth_divergence(verdict: TruthVerdict, parted: tuple[str, str, float] | None,
                     relations: Iterable[Any] = ()) -> Divergence | None:
    """The divergence of a failing truth run that the node-level comparison cannot name.

    ``parted`` names the candidate's module where its plain call leaves the recorded path;
    ``relations`` (the alignment's ``WeightRelation`` s) map it to the reference's module
    and layer through the weights it owns, so the divergence names the reference's layer
    (``encoder.layer.1``) with the candidate's module (``encoder.layers.1``) beside it.
    """
    worst = verdict.worst_failing()
    reasons = ", ".join(verdict.reasons) or "outputs"
    if worst is None:
        return Divergence("outputs", "", "", "outputs", "output", 0.0,
                          "bit for bit", (), detail=f"the candidate's forward {reasons}")
    error = worst.max_abs_err if worst.max_abs_err is not None else float("nan")
    budget = f"{worst.limit:.3g} (what rounding explains)" if worst.limit else "exact"
    hints: tuple[str, ...] = ()
    detail = f"{worst.reference_output} in the {worst.call} call"
    if parted is not None:
        module, kind, *_ = parted
        theirs = reference_module(module, [(r.candidate, r.reference) for r in relations])
        where = (f"; the candidate's {module} ({kind}) computes the reference's {theirs}"
                 if theirs else f"; no weight of the candidate's {module} relates to the "
                 "reference's: the layer named is the candidate's")
        return Divergence(worst.reference_output, module, theirs or module,
                          _layer(theirs or module), kind, error, budget, hints,
                          detail=f"{detail}; found at module boundaries: the recording "
                                 f"took another path from this module on{where}",
                          candidate_module=module)
    return Divergence(worst.reference_output, worst.candidate_output, "", "outputs", "output",
                      error, budget, hints, detail=detail)


def output_region(divergence: Divergence, verdict: TruthVerdict,
                  reference: IntrospectGraph) -> Divergence:
    """``divergence`` at a failing output, named in the reference's layer that computes it
    where that is all that lies between it and outputs that agree: the reference computes
    ``pooler_output`` from ``last_hidden_state`` alone, so where that one agrees and the
    pooler's does not, they part in the pooler. Else ``divergence`` as it is."""
    if divergence.layer != "outputs" or not divergence.reference_node:
        return divergence
    failing = {r.reference_output for r in verdict.rows if r.status == STATUS_FAIL}
    agreeing = {r.reference_output for r in verdict.rows} - failing
    returned = next((n.args[0] for n in reference.gm.graph.nodes if n.op == "output"), None)
    if not isinstance(returned, dict) or not agreeing:
        return divergence
    node = returned.get(divergence.reference_node)
    stops = {returned[k] for k in agreeing if isinstance(returned.get(k), torch.fx.Node)}
    if not isinstance(node, torch.fx.Node) or node in stops:
        return divergence
    records = {r.name: r for r in reference.records}
    layers: set[str] = set()
    seen, frontier = {node}, [node]
    while frontier:
        current = frontier.pop()
        if current.op == "placeholder":
            return divergence  # the inputs reach it past every agreeing output
        if current.op != "get_attr" and current.name in records:
            layers.add(records[current.name].layer)
        for n in current.all_input_nodes:
            if n not in seen and n not in stops:
                seen.add(n)
                frontier.append(n)
    layers -= {"", "inputs", "outputs"}
    if len(layers) != 1:
        return divergence
    layer = layers.pop()
    record = records.get(node.name)
    return dataclasses.replace(
        divergence, reference_node=node.name, module=record.module if record else "",
        layer=layer, detail=f"{divergence.detail}; the outputs it reads agree: only the "
                            f"reference's {layer} lies between")


def _layer(module: str) -> str:
    parts = module.split(".")
    for i, part in enumerate(parts[:-1]):
        if part in ("layer", "layers", "h", "blocks") and parts[i + 1].isdigit():
            return ".".join(parts[: i + 2])
    return parts[0] if parts and parts[0] else "outputs"


__all__ = ["faithful_recordings", "output_region", "recorded_call_verdict",
           "truth_divergence"]
