"""The pair behind a failing module row: the candidate's call and the reference's values
module evidence judged it on, found again as ``evidence.gather_module_evidence`` found
them (op evidence inside that module, ``ops.inside``, is recorded on these values)."""

from __future__ import annotations

from collections.abc import Mapping

from introspect.diff.modules.evidence import ModuleDiff, pair_for
from introspect.diff.modules.pairing import ModulePair, reference_boundaries
from introspect.diff.modules.paths import depth, within
from introspect.run.capture import Calls, ModuleCall
from introspect.run.truth import AUTOGRAD, NO_GRAD, same_view


def pair_of(row: ModuleDiff, reference: Calls, candidate: Calls,
            relations: Mapping[str, set[str]],
            ) -> tuple[ModulePair, ModuleCall, ModuleCall] | None:
    """The first call of ``row``'s candidate module (in its plain call) paired as the row
    was, the reference module's call that computes the same (``_covering``) and the call
    inside it that returned the value standing for the candidate's output (itself, or a
    module inside it); None where none is found again or none covers it. ``relations``:
    the evidence's (``ModuleEvidence.relations``)."""
    ref_calls = reference.of_mode(AUTOGRAD) or reference.of_mode(NO_GRAD)
    boundaries = reference_boundaries(ref_calls)
    for call in candidate.calls:
        if call.name != row.candidate_module or call.mode != row.call:
            continue
        pair = pair_for(call, boundaries, relations)
        if pair is None or pair.reference_module != row.reference_module:
            continue
        covering = _covering(pair, ref_calls)
        return (pair, *covering) if covering is not None else None
    return None


def _covering(pair: ModulePair, ref_calls: list[ModuleCall],
              ) -> tuple[ModuleCall, ModuleCall] | None:
    """The deepest reference module call that took every value standing for the pair's
    inputs and computed the value standing for its output (returned by it or by a module
    inside it), and the outermost call in it that returned that value: the reference's
    computation of what the candidate's module computes."""
    output = pair.output.boundary.value
    inputs = [m.boundary.value for m in pair.inputs]
    returners = [c for c in ref_calls if any(same_view(leaf.value, output) for leaf in c.outputs)]
    covering = [c for c in ref_calls
                if all(any(same_view(leaf.value, value) for leaf in c.inputs)
                       for value in inputs)
                and any(within(r.name, c.name) for r in returners) and _holds(c, pair)]
    outer = max(covering, key=lambda c: depth(c.name), default=None)
    if outer is None:
        return None
    inner = min((r for r in returners if within(r.name, outer.name)),
                key=lambda c: depth(c.name))
    return outer, inner


def _holds(call: ModuleCall, pair: ModulePair) -> bool:
    """Whether ``call`` computes from nothing the candidate's module is not given: it holds
    the weights the module's own relate to (their owner, or a module above it); a module
    with none takes no floating value but those standing for its inputs (a module that
    also took a value computed before it, as a residual's sum takes the attention's
    output, covers less than the candidate's)."""
    if pair.region:
        return within(pair.region, call.name)
    inputs = [m.boundary.value for m in pair.inputs]
    return all(any(same_view(leaf.value, value) for value in inputs)
               for leaf in call.inputs if leaf.value.is_floating_point())


__all__ = ["pair_of"]
