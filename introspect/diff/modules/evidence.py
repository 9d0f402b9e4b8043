"""Module evidence (tier 2, shared/DESIGN.md "Evidence that holds"): the records, the
verdict they give, and what they covered that the recording could not see.

``gather_module_evidence`` takes what the hooks saw in both models' plain calls
(``capture``), pairs the candidate's module calls with reference values (``pairing``),
measures each pair's local error (``local``) against its noise budget (``budget``), and
returns a ``ModuleEvidence``: one ``ModuleDiff`` row per candidate module call, the
``Uncovered`` regions (where the op-level recording cannot see the user's call, and which
module evidence covered them), and the first divergence: the smallest failing module,
named by the reference's layer with the candidate's module beside it.

A failing pair fails the diff even where the outputs are within their (loose) budget: its
relation is proven (the weights it owns, or its inputs and output confirmed by value), and
its budget is what rounding explains for that module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from introspect.diff.modules.budget import (
    FLOOR_UNITS,
    NOISE_FACTOR,
    holds_int8_inside,
    module_budget,
    unit_of,
)
from introspect.diff.modules.cancelled import (
    cancelled,
    cancelling_gap,
    is_cancelled,
    same_in_float64,
)
from introspect.diff.modules.folds import exact_values, exactly, folded_biases
from introspect.diff.modules.handed_on import (
    HANDED_ON,
    MOVED_ALIKE,
    HandedOn,
    handed_on,
)
from introspect.diff.modules.handovers import HANDED, HandOver, HandOvers
from introspect.diff.modules.inference import INFERENCE_DIFFERS, judged_under_inference
from introspect.diff.modules.local import (
    UNIT,
    Exact,
    NotRerun,
    exact_error,
    handed_noise,
    with_noise,
    within_floor,
)
from introspect.diff.modules.pairing import (
    IN_PART,
    ModulePair,
    common_path,
    owned_relations,
    pair_call,
    reference_boundaries,
    region_of,
    relate_parameters,
)
from introspect.diff.modules.paths import below, within
from introspect.diff.modules.precise import (
    CONFIRM_SHARE,
    IN_FLOAT64,
    ON_AVERAGE,
    ReferenceCalls,
    float64_check,
)
from introspect.diff.modules.reproduced import first_unreproduced
from introspect.diff.modules.reuse import Reruns
from introspect.diff.ops.outside import handed_from_outside_hint
from introspect.diff.quantized import is_quantized, quantized_word
from introspect.diff.records import AVERAGE, STATUS_FAIL, STATUS_OK, Divergence
from introspect.run.capture import Calls, ModuleCall
from introspect.run.spill import Holding
from introspect.run.truth import AUTOGRAD, INFERENCE_MODE, NO_GRAD, identical
from introspect.tracing.shapes import (
    DEFAULT_LAYER_PREFIX,
    backbone_path,
    layer_prefix,
    module_layer,
)

if TYPE_CHECKING:
    import pandas

NOT_COMPARED = "not compared"


@dataclasses.dataclass(frozen=True)
class ModuleDiff:
    """One row of ``DiffResult.modules``: a candidate module call and its local error."""

    candidate_module: str  # path in the candidate ("" for the model itself)
    candidate_class: str
    reference_module: str  # the reference module whose output stands for its output
    layer: str  # the reference's layer, as the layer table names it ("encoder.layer.1")
    call: str  # the plain call it was seen in: "autograd" or "no_grad"
    paired_by: str  # "weights" (those it owns relate) or "value" (it owns none)
    max_abs_err: float | None  # its output, run on the reference's inputs, vs the reference's
    noise: float | None  # how far one rounding of its inputs moves its output
    limit: float | None  # its budget (``budget.module_budget``)
    status: str  # "ok", "FAIL" or "not compared"
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Uncovered:
    """A region of the candidate's plain call that op-level evidence did not cover."""

    candidate_module: str
    why: str  # "compiled (torch.compile)", "a worker thread", "vmap", ...
    covered_by: str  # the candidate module whose module evidence covers it ("": none)
    status: str  # that evidence's status ("ok", "FAIL"; "not compared" where none)


@dataclasses.dataclass
class ModuleEvidence:
    """What module evidence found: its rows, the uncovered regions, notes."""

    rows: list[ModuleDiff] = dataclasses.field(default_factory=list)
    uncovered: list[Uncovered] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    # the candidate's weights that hold none of the reference's (nothing vouches for them)
    unrelated: list[str] = dataclasses.field(default_factory=list)
    # candidate parameter path -> the reference parameters it holds (``relate_parameters``;
    # ``failing.pair_of`` pairs a failing row again with them)
    relations: dict[str, set[str]] = dataclasses.field(default_factory=dict, repr=False)
    # each judged call and the reference values paired with it (with ``keep_calls`` only:
    # they hold the values; ``backward.plain_parity`` reads their gradients)
    pairs: list[ModulePair] = dataclasses.field(default_factory=list, repr=False)
    # the candidate's calls, with autograd on, of modules owning weights that no pair
    # judged (with ``keep_calls`` only): what an embedding returned, for
    # ``backward.parting`` (only those: the others' values are let go)
    candidate_calls: list[ModuleCall] = dataclasses.field(default_factory=list, repr=False)
    # a forward that changes from call to call: the smallest module that, run again on its
    # own inputs, does not return what it did (``reproduced``), its row and the difference
    unreproduced: tuple[ModuleDiff, float] | None = None
    under_inference: bool = False  # that module was run again under inference_mode
    # the candidate's modules its plain calls called (``flow.whole_models``: a weight of
    # a module never called is read by code no module evidence judged)
    called: set[str] = dataclasses.field(default_factory=set, repr=False)

    @property
    def passed(self) -> bool:
        return not any(r.status == STATUS_FAIL for r in self.rows)

    @property
    def leaned_on(self) -> bool:
        """Some region the recording could not see was covered by module evidence."""
        return any(u.status != NOT_COMPARED for u in self.uncovered)

    def smallest_failing(self) -> list[ModuleDiff]:
        """The failing rows none of whose submodules fails too, in call order."""
        failing = [r for r in self.rows if r.status == STATUS_FAIL]
        return [r for r in failing if not any(
            o is not r and below(o.candidate_module, r.candidate_module) for o in failing)]

    def divergence(self) -> Divergence | None:
        """The smallest failing module (none of its submodules fails too), first called."""
        smallest = self.smallest_failing()
        if not smallest:
            return None
        row = smallest[0]
        shown = row.candidate_module or "the model"
        detail = (f"module evidence: the candidate's {shown} ({row.candidate_class}), run on "
                  f"the reference's inputs to it in its {row.call} call, is "
                  f"{row.max_abs_err:.3g} from the reference's {row.reference_module} "
                  f"(its budget {row.limit:.3g})")
        budget = "(module evidence: its rounding noise)"
        if row.note.startswith(HANDED):  # (what it hands a module inside it failed)
            detail = (f"module evidence: the candidate's {shown} ({row.candidate_class}) in "
                      f"its {row.call} call: {row.note}")
        elif row.note.startswith(HANDED_ON):  # (what its code hands on between modules)
            owner = f"the candidate's {shown}" if row.candidate_module else "the candidate"
            detail = (f"module evidence: the code of {owner} ({row.candidate_class}) in its "
                      f"{row.call} call: {row.note}")
            budget = "(module evidence: a few roundings of the value handed on)"
            if MOVED_ALIKE in row.note:  # (its mean gap, and the mean's budget)
                budget = f"{AVERAGE} {budget}"
        elif row.note.startswith(IN_FLOAT64):  # (within its float32 budget)
            if row.candidate_module:
                detail = (f"module evidence: the candidate's {shown} ({row.candidate_class}) "
                          f"and the reference's {row.reference_module}, {row.note}")
            else:  # both whole models (``flow.whole_models``)
                detail = (f"module evidence: the candidate ({row.candidate_class}) and the "
                          f"reference, each {row.note}")
            budget = "(module evidence: the reference's float32 error, in float64)"
            if ON_AVERAGE in row.note:  # (its mean gap, and the mean's budget)
                budget = f"{AVERAGE} (module evidence: the reference's mean float32 " \
                    "error, in float64)"
        return Divergence(
            row.reference_module or "model", row.candidate_module or "model",
            row.reference_module, row.layer, row.candidate_class, row.max_abs_err or 0.0,
            f"{row.limit:.3g} {budget}", (),
            detail=detail, candidate_module=row.candidate_module)

    def _changing(self) -> Divergence | None:
        """Where a forward that changes from call to call changes (``unreproduced``)."""
        if self.unreproduced is None:
            return None
        row, gap = self.unreproduced
        shown = row.candidate_module or "the model"
        run, changes = (" under inference_mode", "under inference_mode") \
            if self.under_inference else ("", "from call to call")
        return Divergence(
            row.reference_module, row.candidate_module, row.reference_module, row.layer,
            row.candidate_class, gap, "its own first output, bit for bit", (),
            detail=(f"module evidence: the candidate's {shown} ({row.candidate_class}), run "
                    f"again on its own inputs from its first call with autograd on{run}, "
                    f"returns other values (by up to {gap:.3g}): its forward changes "
                    f"{changes} here"), candidate_module=row.candidate_module)

    def join(self, passed: bool, divergence: Divergence | None, faithful: bool,
             order: Sequence[str] = ()) -> tuple[bool, Divergence | None]:
        """The verdict with this evidence: a failing module fails it; where the op-level
        recording is not faithful to the plain call (or names no node), the module names
        the divergence; so does a failing module that comes before the node the recording
        names, outside it (a fault the recording cannot see, NumPy, shows there only at
        the next op it sees, a layer later), or not after a value the recording names that
        it was handed from outside it (``ops.outside``). ``order``: the reference's modules in the
        order they first ran."""
        mine = self.divergence()
        if mine is None:
            changing = self._changing()  # (names a place only where nothing else does)
            if changing is not None and (divergence is None or divergence.layer == "outputs"
                                         or not divergence.reference_node):
                return False, changing
            return passed, divergence
        if divergence is None or not faithful or divergence.layer == "outputs" \
                or not divergence.reference_node \
                or _comes_first(mine.module, divergence.module, order) \
                or self._handed_into(divergence) \
                or handed_from_outside_hint(divergence.hints) and mine.candidate_module \
                and not _comes_first(divergence.module, mine.module, order):
            # (a value the recording was handed from a thread: a module called there was
            # judged on the reference's inputs to it, which the recording could not do;
            # not the whole models' float64 row, which names no call)
            divergence = mine
        return False, divergence

    def _handed_into(self, divergence: Divergence) -> bool:
        """The smallest failing row is a value the candidate's code moved on its way into a
        module (``handed_on``), and the recording's divergence lies inside that module: its
        ops there ran on the moved value (an fp16 round trip between two layers failed
        the next layer's query Linear, which module evidence found the reference's)."""
        smallest = self.smallest_failing()
        return bool(smallest) and smallest[0].note.startswith(HANDED_ON) \
            and bool(smallest[0].reference_module) \
            and within(divergence.module, smallest[0].reference_module)

    def frame(self) -> pandas.DataFrame:
        import pandas as pd

        return pd.DataFrame([dataclasses.asdict(r) for r in self.rows],
                            columns=list(ModuleDiff.__dataclass_fields__))

    def coverage_frame(self) -> pandas.DataFrame:
        import pandas as pd

        return pd.DataFrame([dataclasses.asdict(u) for u in self.uncovered],
                            columns=list(Uncovered.__dataclass_fields__))


def gather_module_evidence(reference: Calls, candidate: Calls,
                           attention_mask: torch.Tensor | None = None,
                           faithful: bool = True, parted: Any = None,
                           keep_calls: bool = False, rounding: Sequence[str] = (),
                           changing: str = "", outputs_failed: bool = False) -> ModuleEvidence:
    """Pair the candidate's module calls with the reference's values and judge each.

    Args:
        reference, candidate: what ``introspect.run.capture.capture_calls`` saw in each
            model's truth runs.
        attention_mask: (B, S); values laid out (B, S, ...) are compared at real tokens.
        faithful: whether the candidate's recording reproduced its plain calls.
        parted: (module, class, difference) where its recording left the plain path.
        keep_calls: keep the calls' values (the accounting of a PASS with no recording
            reads them next, ``accounted``); else they are let go.
        rounding: what the devices round to beyond the dtypes ("tfloat32": a GPU's float32
            matmuls), so a module's budget holds that rounding too.
        changing: "calls" where the candidate's forward changes from call to call (its
            truth runs), "inference_mode" where its outputs are wrong under
            ``torch.inference_mode()`` only: where every module passes, the smallest that
            does not reproduce its own first output (run again, or run again in inference
            mode) is found (``reproduced``), to name where. ``INFERENCE_DIFFERS``: its
            outputs there pass, but are not its other calls' bit for bit: that module (or
            its nearest judged ancestor) is judged again under inference mode
            (``inference.judged_under_inference``).
        outputs_failed: the truth runs fail already: a module paired by the weights it
            owns may be paired with their owner's output where its output is near no
            reference value (``pairing.pair_call``'s ``naming``), to name the layer a FAIL
            on the outputs alone would not (a block whose norm gains are folded into its
            Linears); with passing outputs only proven pairs may fail a port.
    """
    ref_calls = reference.of_mode(AUTOGRAD) or reference.of_mode(NO_GRAD)
    boundaries = reference_boundaries(ref_calls)
    relations = relate_parameters(reference.model, candidate.model)
    held = set().union(*relations.values()) if relations else set()
    folds = folded_biases(reference.model, candidate.model, (
        name for name, _ in reference.model.named_parameters()
        if name.endswith("bias") and name not in held))
    onward = set(folds)
    layers = ReferenceLayers.of(reference.model)
    evidence = ModuleEvidence(unrelated=[name for name, found in relations.items()
                                         if not found], relations=relations,
                              called={call.name for call in candidate.calls})
    seen: dict[tuple[str, int], ModuleCall] = {}
    counts: dict[tuple[str, str], int] = {}
    judged: list[ModuleCall] = []
    for call in sorted(candidate.calls, key=lambda c: (c.mode != AUTOGRAD, c.order)):
        number = counts.get((call.mode, call.name), 0)
        counts[(call.mode, call.name)] = number + 1
        twin = seen.get((call.name, number))
        if call.mode == AUTOGRAD:
            seen[(call.name, number)] = call
        elif twin is not None and _same_call(twin, call):
            continue  # the no_grad call saw what the autograd one did: judged once
        judged.append(call)
    pairs: list[ModulePair] = []
    with exactly(exact_values(reference.model, candidate.model, folds)):
        judgements = _judge_all(judged, boundaries, relations, layers, attention_mask,
                                rounding, pairs, outputs_failed, ReferenceCalls(ref_calls),
                                reference.holding, onward)
    # the code between two judged modules, where the reference hands the value on as is
    evidence.rows += [_handed_on_row(moved, candidate.of_mode(AUTOGRAD), layers)
                      for moved in handed_on(pairs, attention_mask)]
    if keep_calls:
        evidence.pairs = pairs
        paired = {id(pair.call) for pair in pairs}
        evidence.candidate_calls = [
            call for call in candidate.of_mode(AUTOGRAD) if id(call) not in paired
            and next(call.module.parameters(recurse=False), None) is not None]
    failed: list[str] = []
    for call, judgement in zip(judged, judgements, strict=True):  # rows in the calls' order
        if isinstance(judgement, Exception):
            failed.append(f"{call.name or 'the model'} ({type(judgement).__name__})")
        elif judgement is not None:
            evidence.rows.append(judgement)
    if failed:
        evidence.notes.append(f"module evidence could not judge {len(failed)} module call(s) "
                              f"({', '.join(failed[:3])}{', ...' if len(failed) > 3 else ''}): "
                              "not compared")
    evidence.uncovered = coverage_of(_unseen(candidate, seen), evidence.rows, faithful, parted)
    if changing == INFERENCE_DIFFERS and evidence.passed:
        judged_there = judged_under_inference(candidate.of_mode(AUTOGRAD), pairs,
                                              evidence.rows, attention_mask, rounding)
        if judged_there is not None:
            evidence.rows.append(judged_there)
    elif changing and evidence.passed:
        evidence.unreproduced = _unreproduced(candidate, evidence.rows,
                                              changing == INFERENCE_MODE, relations, layers)
        evidence.under_inference = changing == INFERENCE_MODE
    if not keep_calls:
        reference.calls.clear()  # the values are let go: memory
        candidate.calls.clear()
    return evidence


def _handed_on_row(moved: HandedOn, calls: Sequence[ModuleCall],
                   layers: ReferenceLayers) -> ModuleDiff:
    """The failing row of a value the candidate's code moved on its way from one judged
    module to the next (``handed_on``): the row of the innermost call running both, whose
    code that is, laid in the reference's layer that takes the value."""
    giver, taker = moved.giver.call, moved.taker.call
    around = [c for c in calls
              if 0 <= c.started < giver.started and c.order > taker.order and not c.thread]
    owner = max(around, key=lambda c: c.started, default=None)
    error, limit = moved.shown
    return ModuleDiff(owner.name if owner is not None else "",
                      type(owner.module).__name__ if owner is not None else "",
                      moved.taken_by, layers.of_module(moved.taken_by), AUTOGRAD, "weights",
                      error, None, limit, STATUS_FAIL, moved.note)


def _comes_first(module: str, other: str, order: Sequence[str]) -> bool:
    """``module`` is not ``other`` nor holds it, and comes before it in ``order``."""
    if not order or not module or within(other, module):
        return False
    index = {name: i for i, name in enumerate(order)}
    return index.get(module, len(order)) < index.get(other, len(order))


def _unreproduced(candidate: Calls, rows: Sequence[ModuleDiff], inference: bool,
                  relations: Mapping[str, set[str]], layers: Any,
                  ) -> tuple[ModuleDiff, float] | None:
    """The smallest module that does not reproduce its first output, with the row of it
    (or of its nearest judged ancestor) that names the reference's module."""
    found = first_unreproduced(candidate.of_mode(AUTOGRAD), inference)
    if found is None:
        return None
    call, gap = found
    row = next((r for r in rows if r.status != NOT_COMPARED and r.candidate_module == call.name),
               None)
    if row is not None:
        return row, gap
    # not judged itself (its values near none of the reference's): named by the reference
    # module owning the weights it holds alone (a zero bias holds every zero bias)
    owners = [next(iter(found)).rpartition(".")[0]
              for found in owned_relations(call.name, relations) if len(found) == 1]
    if not owners:
        return None
    module = common_path(owners)
    return ModuleDiff(call.name, type(call.module).__name__, module, layers.of_module(module),
                      AUTOGRAD, "weights", None, None, None, STATUS_FAIL), gap


def unseen_regions(candidate: Calls) -> dict[str, str]:
    """Each region of ``candidate``'s calls the op-level recording cannot see as the plain
    call ran it, and why: what the coverage reads of the calls' values, taken before they
    are let go (``coverage_of`` adds the recording's own word once it is known)."""
    seen: dict[tuple[str, int], ModuleCall] = {}
    counts: dict[str, int] = {}
    for call in sorted(candidate.of_mode(AUTOGRAD), key=lambda c: c.order):
        number = counts.get(call.name, 0)
        counts[call.name] = number + 1
        seen[(call.name, number)] = call
    return _unseen(candidate, seen)


@dataclasses.dataclass(frozen=True)
class _Paired:
    """A call paired with the reference's values, its local error still to measure."""

    pair: ModulePair
    row: ModuleDiff
    unit: float


def _judge_all(calls: Sequence[ModuleCall], boundaries: Sequence[Any],
               relations: Mapping[str, set[str]], layers: ReferenceLayers,
               attention_mask: torch.Tensor | None, rounding: Sequence[str],
               pairs: list[ModulePair], outputs_failed: bool = False,
               references: ReferenceCalls | None = None,
               holding: Holding | None = None, onward: Collection[str] = (),
               ) -> list[ModuleDiff | Exception | None]:
    """Each call's row (None: nothing to compare; the exception where it could not be
    judged); each pairing made is added to ``pairs``. Local errors are measured parents
    first, in the order the calls started: a parent's run on the reference's inputs gives
    its submodules theirs (``reuse``). ``holding``: the calls' values in memory and on
    disk (``run.spill``): its budget bounds what those runs hold for later calls, and the
    pages of spilled values read for each call are let go of after it. ``onward``: the
    reference's biases the candidate holds folded into a later one (``folds``)."""
    release = holding.release_pages if holding is not None else (lambda: None)
    judgements: list[ModuleDiff | Exception | None] = []
    paired: dict[int, _Paired] = {}  # by the call's index
    for i, call in enumerate(calls):
        judgement: ModuleDiff | _Paired | Exception | None
        try:
            pair = pair_for(call, boundaries, relations, outputs_failed, onward)
            judgement = _pair(call, pair, layers, rounding)
            if pair is not None:
                pairs.append(pair)
        except Exception as e:  # noqa: BLE001  evidence not taken is said, never a failure
            judgement = e
        if isinstance(judgement, _Paired):
            paired[i], judgement = judgement, None
        judgements.append(judgement)
        release()
    reruns = Reruns((p.pair for p in paired.values()),
                    holding.budget if holding is not None else None)
    nearest_inside: dict[int, list[ModulePair]] = {}  # each paired call's nearest inner ones
    for inner, outer in _nearest_ancestors(calls, paired).items():
        nearest_inside.setdefault(outer, []).append(paired[inner].pair)
    # A module over its floor waits for its noise run until every module inside it is
    # judged (the calls started after it, inside it): where one of them fails, the fault
    # is blamed there, and its own noise (a run as long as itself: the encoder's is a
    # forward) would only judge what holds it. At most one waits per level of nesting.
    waiting: list[tuple[int, Exact]] = []
    failing: set[tuple[str, str]] = set()  # (mode, module) of the failing rows
    handed: dict[int, HandOvers] = {}  # what each run handed the calls nearest inside it
    failed: dict[int, tuple[ModulePair, Exact]] = {}  # each failing row's pair, by its call

    def finish(i: int, exact: Exact) -> None:
        done = paired.pop(i)
        judgement = judgements[i] = _judged(done, exact, failing, handed.pop(i, None),
                                            reruns, references)
        if isinstance(judgement, ModuleDiff) and judgement.status == STATUS_FAIL:
            if done.pair.by != IN_PART:  # (one in part fails nothing on its own)
                failing.add((calls[i].mode, calls[i].name))
            failed[i] = (done.pair, exact)
        elif isinstance(judgement, ModuleDiff) and judgement.status == STATUS_OK \
                and references is not None:
            _cancel_inside(i, judgement, done.pair, exact, references)
        release()

    def _cancel_inside(i: int, holder: ModuleDiff, pair: ModulePair, exact: Exact,
                       references: ReferenceCalls) -> None:
        """The failing rows inside call ``i`` unconfirmed where its run is the
        reference's exactly (``cancelled``): what they differ by cancels in it."""
        inside = [j for j in failed if _ran_inside(calls[j], calls[i])]
        if not inside:
            return
        gap = cancelling_gap(pair, exact, references)
        if gap is None or not all(
                same_in_float64(*failed[j], _limit(judgements[j]), references)
                for j in inside):
            return
        for j in inside:
            judgements[j] = cancelled(judgements[j], holder, gap)
            failing.discard((calls[j].mode, calls[j].name))
            del failed[j]

    for i in sorted(paired, key=lambda i: _started(calls[i])):
        while waiting and not _inside_call(calls[i], calls[waiting[-1][0]]):
            finish(*waiting.pop())
        if i in nearest_inside:
            handed[i] = HandOvers(paired[i].pair, calls, nearest_inside[i], attention_mask,
                                  FLOOR_UNITS * paired[i].unit)
        try:
            exact = exact_error(paired[i].pair, attention_mask, reruns, handed.get(i))
        except NotRerun as e:
            judgements[i] = dataclasses.replace(paired.pop(i).row, status=NOT_COMPARED,
                                                note=str(e))
            continue
        except Exception as e:  # noqa: BLE001
            judgements[i], _ = e, paired.pop(i)
            continue
        finally:
            release()
        waiting.append((i, exact))
    while waiting:
        finish(*waiting.pop())
    return _settled_in_part(calls, judgements, pairs)


def _settled_in_part(calls: Sequence[ModuleCall],
                     judgements: list[ModuleDiff | Exception | None],
                     pairs: list[ModulePair]) -> list[ModuleDiff | Exception | None]:
    """The calls paired by their weights in part (``pairing.IN_PART``) keep a row, and
    their pair, only where the module holding them cancelled what they differ by: else
    nothing stands for them, as if they had not been paired (their owner's output may be
    the value of another computation than theirs: a bias folded elsewhere)."""
    in_part = {id(p.call) for p in pairs if p.by == IN_PART}
    if not in_part:
        return judgements
    dropped = set()
    for i, call in enumerate(calls):
        if id(call) in in_part and not (isinstance(judgements[i], ModuleDiff)
                                        and is_cancelled(judgements[i])):
            judgements[i] = None
            dropped.add(id(call))
    pairs[:] = [p for p in pairs if id(p.call) not in dropped]
    return judgements


def _nearest_ancestors(calls: Sequence[ModuleCall], paired: Mapping[int, _Paired],
                       ) -> dict[int, int]:
    """Each paired call of the first plain call (autograd on) -> the paired call it ran
    nearest inside (by their indices), where it ran inside one: what that one's run on the
    reference's inputs hands it is its hand-over (``handovers``)."""
    ordered = sorted((i for i in paired if calls[i].mode == AUTOGRAD and calls[i].started >= 0),
                     key=lambda i: calls[i].started)
    nearest: dict[int, int] = {}
    open_calls: list[int] = []  # the calls started and not yet finished, outermost first
    for i in ordered:
        while open_calls and calls[open_calls[-1]].order < calls[i].order:
            open_calls.pop()  # finished before this one finished: it is not inside it
        if open_calls:
            nearest[i] = open_calls[-1]
        open_calls.append(i)
    return nearest


def _limit(row: Any) -> float:
    """A failing row's budget (0 where it shows none: nothing is within it)."""
    return row.limit if row.limit is not None else 0.0


def _ran_inside(call: ModuleCall, outer: ModuleCall) -> bool:
    """``call`` ran inside ``outer``'s call: of a module inside it, in the same plain
    call, started after it and finished before it (where both were seen starting)."""
    if not _inside_call(call, outer):
        return False
    if call.started < 0 or outer.started < 0:
        return True
    return outer.started < call.started and call.order < outer.order


def _inside_call(call: ModuleCall, outer: ModuleCall) -> bool:
    """``call`` is of a module inside ``outer``'s, in the same plain call."""
    return call.mode == outer.mode and below(call.name, outer.name)


def _started(call: ModuleCall) -> tuple[bool, bool, int, int]:
    return call.mode != AUTOGRAD, call.started < 0, call.started, call.order


def _pair(call: ModuleCall, pair: ModulePair | None, layers: ReferenceLayers,
          rounding: Sequence[str] = ()) -> ModuleDiff | _Paired | None:
    """The row of one module call where its pairing (``pair_for``) decides it; None where
    it has nothing to compare (no floating input, or no reference value stands for it);
    else its pair."""
    if pair is None:
        return None
    output = call.outputs[0].value
    row = _row(call, pair, layers)
    if holds_int8_inside(call.module):
        note = f"holds {quantized_word(call.module)} Linears, judged each on its own budget"
        return dataclasses.replace(row, status=NOT_COMPARED, note=note)
    if pair.output.distance == 0 and all(m.distance == 0 for m in pair.inputs):
        # its own call took the reference's values and returned the reference's: run on
        # them again, it returns the same (no run needed: most modules of a close port)
        return dataclasses.replace(row, max_abs_err=0.0, status=STATUS_OK,
                                   note="its own call took and returned the reference's values")
    return _Paired(pair, row, unit_of(call.module, output, pair.output.boundary.value, rounding))


def pair_for(call: ModuleCall, boundaries: Sequence[Any],
             relations: Mapping[str, set[str]], outputs_failed: bool = False,
             onward: Collection[str] = ()) -> ModulePair | None:
    """The reference values standing for ``call``'s inputs and first output, paired by the
    weights its module's own relate to, else by value; None where none stands for it.
    ``outputs_failed``: see ``gather_module_evidence``; ``onward``: see ``_judge_all``."""
    if not call.inputs or not call.outputs:
        return None
    region = region_of(call, relations)
    if region is None:
        return None  # weights of its own, none the reference's: nothing stands for it
    by = "value" if region == "" and not _owns_weights(call.module) else "weights"
    dtype = str(call.outputs[0].value.dtype).removeprefix("torch.")
    own = owned_relations(call.name, relations)
    # proven: a module of no submodules (a norm, a Linear) each of whose weights holds one
    # weight of the reference's, and only one (a LoRA's base holds the bias alone; random
    # init's zero biases hold every bias)
    leaf = next(call.module.children(), None) is None
    folded = _bias_folded_onward(own, onward) if leaf and by == "weights" else None
    if folded is not None:
        # its bias held folded into a later one (a value bias in the output projection's):
        # it computes the reference's less that bias, which only a module holding it,
        # found the reference's exactly, can settle (``_settled_in_part``)
        return pair_call(call, boundaries, folded, IN_PART, dtype, proven=True)
    proven = bool(own) and all(len(found) == 1 for found in own) and leaf
    naming = outputs_failed and by == "weights" \
        and not _held_elsewhere(call.name, region, relations)
    pair = pair_call(call, boundaries, region, by, dtype, proven=proven, naming=naming)
    if pair is None and leaf and not proven and not naming and by == "weights" \
            and all(len(found) <= 1 for found in own):
        # some of its weights the reference's, the rest none (a key whose bias is still at
        # its initial values): its owner's output stands for it, and its row stands only
        # where the module holding it cancels what it differs by (``_judge_all``)
        pair = pair_call(call, boundaries, region, IN_PART, dtype, proven=True)
    return pair


def _bias_folded_onward(own: Sequence[set[str]], onward: Collection[str]) -> str | None:
    """The reference module whose weight matrix the call's module holds where the
    candidate holds that module's bias folded into a later one (``folds``), or None."""
    for found in own:
        for name in found:
            owner = name.rpartition(".")[0]
            if name.endswith(".weight") and f"{owner}.bias" in onward:
                return owner
    return None


def _held_elsewhere(name: str, region: str, relations: Mapping[str, set[str]]) -> bool:
    """Some weight of the reference's ``region`` is held, and held alone, by a candidate
    weight outside module ``name``: the two cut their blocks at other places (a stage
    holding a layer's weights but its last LayerNorm's, which the next stage holds), and
    the region's output stands for no value of ``name``'s. A block whose other weights are
    folded holds them nowhere."""
    for weight, found in relations.items():
        if len(found) != 1 or within(weight.rpartition(".")[0], name):
            continue
        (reference,) = found
        if within(reference.rpartition(".")[0], region):
            return True
    return False


def _judged(paired: _Paired, exact: Exact, failing: set[tuple[str, str]],
            handing: HandOvers | None = None, reruns: Reruns | None = None,
            references: ReferenceCalls | None = None) -> ModuleDiff | Exception:
    """The row of a paired call: its local error against its budget; not compared where
    it is over its floor and a module inside it fails already (its noise not run); failed
    where what its run hands a judged call inside it is over that hand-over's budget, or
    where, passing with more than ``CONFIRM_SHARE`` of its budget, its run in float64 on
    the same inputs is still apart from the reference's (``precise``)."""
    pair, row, unit = paired.pair, paired.row, paired.unit
    call = pair.call
    inside_fails = any(mode == call.mode and below(name, call.name) for mode, name in failing)
    if not within_floor(exact, FLOOR_UNITS * unit) and inside_fails:
        return dataclasses.replace(
            row, max_abs_err=exact.error, status=NOT_COMPARED,
            note="a module inside it is over its budget (the fault is blamed there): its "
                 "own rounding noise was not measured")
    try:
        local = with_noise(pair, unit, exact, floor=FLOOR_UNITS * unit)
    except NotRerun as e:
        return dataclasses.replace(row, status=NOT_COMPARED, note=str(e))
    except Exception as e:  # noqa: BLE001  evidence not taken is said, never a failure
        return e
    first_input = pair.inputs[0].boundary.value
    budget = module_budget(call.module, local, unit, first_input)
    status = STATUS_OK if local.max_abs <= budget.limit else STATUS_FAIL
    judged = dataclasses.replace(row, max_abs_err=local.max_abs, noise=local.noise,
                                 limit=budget.limit, status=status, note=budget.why)
    if status == STATUS_OK and handing is not None and reruns is not None and not inside_fails:
        judged = _handed_over(judged, pair, unit, handing, reruns)  # (finer: said first)
    if judged.status == STATUS_OK and not inside_fails and references is not None \
            and local.max_abs > CONFIRM_SHARE * budget.limit:
        judged = _in_float64(judged, pair, exact, unit, references)
    return judged


def _in_float64(row: ModuleDiff, pair: ModulePair, exact: Exact, unit: float,
                references: ReferenceCalls) -> ModuleDiff:
    """``row`` failed where the pair, run again in float64, is still apart (``precise``).
    Not where the pair rounds coarser than float32 (a bfloat16 port, TF32 matmuls, int8
    Linears): its budget there is that rounding's, not the reference's float32 error."""
    if unit > UNIT[torch.float32] or is_quantized(pair.call.module) \
            or holds_int8_inside(pair.call.module):
        return row
    reference = references.computing(pair)
    if reference is None:
        return row
    check = float64_check(pair, reference, exact.keep, exact.scale)
    if check is None or not check.failed:
        return row
    error, limit = check.shown  # (the mean gap and its budget, where it failed on those)
    return dataclasses.replace(row, max_abs_err=error, limit=limit, status=STATUS_FAIL,
                               note=check.why)


def _handed_over(row: ModuleDiff, pair: ModulePair, unit: float, handing: HandOvers,
                 reruns: Reruns) -> ModuleDiff:
    """``row`` failed where what its module's run on the reference's inputs handed a
    judged call inside it is over that hand-over's budget (``handovers``): the worst such."""
    try:
        handed_noise(pair, unit, reruns, handing)
    except NotRerun:
        return row  # (its own run was made: a noise run that raises tells nothing)
    worst: tuple[float, HandOver, float] | None = None
    for over in handing.over_floor():
        if over.noise is None or over.handed is None:  # its noise run did not hand it
            continue  # (another path): not told
        # in the lower precision of the two modules and the two values (a bf16 child)
        lowest = max(unit, unit_of(over.child.call.module, over.handed,
                                   over.match.boundary.value))
        limit = NOISE_FACTOR * over.noise + FLOOR_UNITS * lowest * over.scale
        if over.error > limit and (worst is None or over.error / limit > worst[0]):
            worst = (over.error / limit, over, limit)
    if worst is None:
        return row
    _, over, limit = worst
    reference = over.match.boundary
    return dataclasses.replace(
        row, max_abs_err=over.error, noise=over.noise, limit=limit, status=STATUS_FAIL,
        note=f"{HANDED} {over.child.call.name} ({over.match.path}), run on the "
             f"reference's inputs, is {over.error:.3g} from the reference's "
             f"{reference.module or 'model'} {reference.role} (budget {limit:.3g}: "
             f"{NOISE_FACTOR:g}x its noise {over.noise:.2g} + {FLOOR_UNITS:g} roundings of "
             f"{over.scale:.3g}); its own output {row.max_abs_err:.3g} (budget "
             f"{row.limit:.3g})")


def _row(call: ModuleCall, pair: ModulePair, layers: ReferenceLayers) -> ModuleDiff:
    module = pair.reference_module
    return ModuleDiff(call.name, type(call.module).__name__, module, layers.of_module(module),
                      call.mode, pair.by, None, None, None, NOT_COMPARED)


def _owns_weights(module: torch.nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _same_call(a: ModuleCall, b: ModuleCall) -> bool:
    return len(a.inputs) == len(b.inputs) and len(a.outputs) == len(b.outputs) and all(
        identical(x.value, y.value) for x, y in zip(a.inputs + a.outputs, b.inputs + b.outputs,
                                                    strict=True))


def _unseen(candidate: Calls, autograd: Mapping[tuple[str, int], ModuleCall],
            ) -> dict[str, str]:
    found: dict[str, str] = {}
    for call in candidate.calls:
        why = _blind(call)
        if why and call.name not in found:
            found[call.name] = why
    for name in sorted(candidate.vmapped):
        caller = _nearest(name, {c.name for c in candidate.calls})
        if caller is not None and caller not in found:
            found[caller] = "torch.func.vmap inside"
    for call in candidate.calls:  # the same inputs, other outputs: a grad-mode branch
        if call.mode != NO_GRAD:
            continue
        twin = next((c for (n, _), c in autograd.items() if n == call.name), None)
        if twin is not None and len(twin.inputs) == len(call.inputs) \
                and all(identical(x.value, y.value) for x, y in zip(twin.inputs, call.inputs,
                                                                    strict=True)) \
                and not all(identical(x.value, y.value)
                            for x, y in zip(twin.outputs, call.outputs, strict=False)):
            found.setdefault(call.name, "a grad-mode branch (autograd and no_grad differ)")
    return found


def coverage_of(unseen: Mapping[str, str], rows: Sequence[ModuleDiff], faithful: bool,
                parted: Any = None) -> list[Uncovered]:
    """``unseen_regions``, with the recording's own (where it does not reproduce the
    call), each with the module evidence that covered it."""
    found = dict(unseen)
    if not faithful:
        where = parted[0] if parted is not None else ""
        found.setdefault(where, "the recording does not reproduce the plain call")
    compared: dict[str, ModuleDiff] = {}
    for r in rows:  # a module's worst row stands for it (its autograd or no_grad call)
        if r.status != NOT_COMPARED and compared.get(r.candidate_module, r).status != STATUS_FAIL:
            compared[r.candidate_module] = r
    uncovered = []
    for name, why in found.items():
        cover = name if name in compared else _nearest(name, set(compared))
        row = compared.get(cover) if cover is not None else None
        uncovered.append(Uncovered(name, why, cover if cover is not None else "",
                                   row.status if row is not None else NOT_COMPARED))
    return uncovered


def _blind(call: ModuleCall) -> str:
    module = call.module
    if getattr(module, "_orig_mod", None) is not None:
        return "compiled (torch.compile)"
    if isinstance(module, torch.jit.ScriptModule):
        return "TorchScript"
    if call.thread:
        return "a worker thread"
    if call.mode == AUTOGRAD and call.outputs \
            and (_tracked(module) or any(leaf.tracked for leaf in call.inputs)) \
            and not any(leaf.tracked for leaf in call.outputs):
        return "computed outside autograd (NumPy?)"
    return ""


def _tracked(module: torch.nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def _nearest(name: str, names: set[str]) -> str | None:
    """The deepest of ``names`` that holds module ``name`` (itself excluded)."""
    holders = [n for n in names if n != name and below(name, n)]
    return max(holders, key=len) if holders else None


@dataclasses.dataclass(frozen=True)
class ReferenceLayers:
    """The reference's layers as its trace labels them (``tracing.shapes.layer_of``), so a
    module row's layer is a row of the layer table: ``encoder.layer.1`` under a head's
    ``bert.`` too, ``embeddings``, ``pooler``, ``head``."""

    backbone: str | None  # the module holding embeddings and layers ("bert"; "" the model)
    prefix: str  # its layers' label before their index ("encoder.layer")

    @classmethod
    def of(cls, model: torch.nn.Module) -> ReferenceLayers:
        backbone = backbone_path(model)
        modules = dict(model.named_modules())
        prefix = layer_prefix(modules[backbone]) if backbone is not None else None
        return cls(backbone, prefix or DEFAULT_LAYER_PREFIX)

    def of_module(self, module: str) -> str:
        """The layer holding ``module``: "outputs" for the model itself, a backbone's own
        output its name (a head's ``bert``: no one row of the layer table holds it)."""
        if module == "":
            return "outputs"
        if module == self.backbone:
            return module
        return module_layer(module, self.backbone, self.prefix)


__all__ = ["NOT_COMPARED", "ModuleDiff", "ModuleEvidence", "ReferenceLayers", "Uncovered",
           "coverage_of", "gather_module_evidence", "pair_for", "unseen_regions"]
