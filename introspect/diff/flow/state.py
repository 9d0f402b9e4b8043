"""What the steps of one ``diff()`` share: the models, the inputs' copies, and the evidence
as each step adds it (``DiffState``); how the models' modes are kept and put back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from introspect.diff import devices
from introspect.diff.modules import ModuleEvidence
from introspect.diff.options import DiffOptions
from introspect.diff.outputs import NoOutputPairs, compare_truths
from introspect.diff.records import Divergence, NodeDiff
from introspect.diff.tolerance import Tolerance
from introspect.errors import InputError
from introspect.models.load import TokenizedInputs
from introspect.models.ports import describe_changes
from introspect.run.deferred import Deferred
from introspect.run.footprint import Footprint


@dataclass
class DiffState:
    """One diff's models, inputs and evidence, filled in by the steps in their order
    (``introspect.diff.flow``); ``put_back`` undoes what the steps did to the models."""

    options: DiffOptions
    tolerance: Tolerance
    # The reference recorded: with noise_budget, a float64 copy of ``original_reference``
    # (the caller's), which every check and every put-back uses.
    reference: torch.nn.Module
    original_reference: torch.nn.Module
    candidate: Any  # the caller's model; a ``Deferred`` until ``build_candidate``
    deferred: Deferred | None  # the candidate as handed over, built after the reference ran
    reference_label: str
    candidate_label: str
    modes: dict[str, dict[str, bool]]  # each side's training modes, put back at the end
    tensors: dict[str, torch.Tensor]  # a copy of the caller's inputs: theirs reach no model
    # The plain calls run here: not on a generation step (its loop runs its own), and no
    # more once the outputs cannot be paired (``unpaired``).
    truths: bool
    placement: devices.Placement | None = None  # where each model runs; undone at the end
    notes: list[str] = field(default_factory=list)

    # Each side's inputs on its device, each a copy of its own
    ref_tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    ref_accepted: dict[str, torch.Tensor] = field(default_factory=dict)  # its forward's
    cand_tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    # Tier 1: the plain calls (``run.truth``) and what each module saw in them (``run.capture``)
    ref_truth: Any = None
    ref_calls: Any = None
    cand_truth: Any = None
    cand_calls: Any = None
    unseen: dict[str, str] = field(default_factory=dict)  # coverage, the values let go
    switched: dict[str, Any] = field(default_factory=dict)  # what the build flipped, process-wide
    before_build: dict[str, Any] = field(default_factory=dict)  # those switches before it
    candidate_dtypes: list[str] = field(default_factory=list)
    judge_dtypes: list[str] = field(default_factory=list)  # the dtypes the outputs' budget knows
    verdict: Any = None  # the outputs judged (``TruthVerdict``); None: no plain calls judged
    unpaired: NoOutputPairs | None = None  # raised once the alignment's notes are in

    # The reference's recording (graph, inputs it took, recording), and what goes with it
    ref_side: Any = None
    gradients_with: Any = None  # the recorder that keeps autograd on, with backward
    later: bool = False  # recorded only where a PASS is not proven without it
    before_candidate: Footprint | None = None  # what it computes with, before the candidate
    reference_now: Footprint | None = None  # the same, read again at the end (``state.later``)
    # the candidate's weights' checksums before its calls, until they are held to theirs
    # after (``candidate.note_edited_weights``)
    candidate_sums: dict[str, int] | None = None
    # with backward: the same, taken on every path; a failing backward is judged again
    # against the reference's rounding noise only where nothing of it moved since
    clean_footprint: Footprint | None = None
    ref_gradients: Any = None  # its backward, run before the candidate is built
    loss_inputs: dict[str, torch.Tensor] | None = None
    # With backward and no node tables: the loss, and each side's own backward of its
    # first plain call (``backward.plain``), which may prove the backward's PASS
    loss: Any = None  # (kind, loss_fn)
    ref_plain: Any = None
    cand_plain: Any = None
    # what they prove (``backward.plain_parity.PlainVerdict``): a PASS, a FAIL, or nothing
    own_gradients: Any = None
    noise: dict[str, float] | None = None  # each node's noise, with noise_budget

    # Tier 2: module evidence
    module_evidence: ModuleEvidence = field(default_factory=ModuleEvidence)
    device_rounding: list[str] = field(default_factory=list)
    early: bool = False  # judged before any recording, for a PASS that may need none
    fast: Any = None  # that PASS's tables (``modules_only``); None: the full path
    inside: str = ""  # the failing module op evidence was taken inside alone ("": all)

    # Tier 3: op evidence, and the verdict it settles
    explanation: Any = None  # ``ops.explain.Explanation``
    rows: list[NodeDiff] = field(default_factory=list)
    divergence: Divergence | None = None
    explained_passed: bool = False  # the node-level comparison alone passes
    faithful: bool = True  # both recordings reproduce their models' plain calls
    parted: tuple[str, str, float] | None = None  # where a recording leaves its plain call
    random: bool = False  # the candidate's forward changes from call to call
    gradients: Any = None  # the backward diff's result, with backward
    passed: bool = False

    @classmethod
    def start(cls, reference: torch.nn.Module, candidate: Any,
              inputs: TokenizedInputs | Mapping[str, torch.Tensor],
              options: DiffOptions) -> DiffState:
        """The state before any model runs: the tolerance checked, the inputs copied, the
        sides named, the reference in eval mode (its own modes kept to put back)."""
        budgets, tables = options.budgets, options.tables
        tolerance = Tolerance(atol=budgets.atol, rtol=budgets.rtol,
                              noise_factor=budgets.noise_factor)
        callers = tensors_of(inputs)
        tensors = copies(callers)  # nothing below ever hands the caller's tensors to a model
        deferred = candidate if isinstance(candidate, Deferred) else None
        reference_label = tables.reference_label or type(reference).__name__
        candidate_label = tables.candidate_label or (deferred.label if deferred is not None
                                                     else type(candidate).__name__)
        modes = {"reference": training_modes(reference)}
        truths = options.mode.forward_keywords is None  # a generation step: the loop runs its own
        state = cls(options, tolerance, reference, reference, candidate, deferred,
                    reference_label, candidate_label, modes, tensors, truths)
        reference.eval()
        return state

    @property
    def labels(self) -> tuple[str, str]:
        return self.reference_label, self.candidate_label

    @property
    def keywords(self) -> tuple[Any, Any]:
        """Each side's other forward keywords (reference's, candidate's), or None."""
        return self.options.mode.forward_keywords or (None, None)

    @property
    def recorded_already(self) -> tuple[Any, Any]:
        """Each side's recording handed over (reference's, candidate's), or None."""
        return self.options.mode.recordings or (None, None)

    def changes_between_calls(self) -> bool:
        """The candidate's forward changed between its truth calls, or counts them: one
        more call would be a call of another model (and move what it counts)."""
        return self.random or (self.cand_truth is not None
                               and bool(self.cand_truth.changed_between_calls()))

    def candidate_repeatable(self) -> bool:
        """The candidate's plain calls returned the same outputs bit for bit, whatever
        their modes: the hints need not run it twice more to look for a dropout left on."""
        return self.cand_truth is not None and self.cand_truth.repeatable()

    def judge(self, truth: Any, against: Any = None) -> Any:
        """The candidate's plain calls ``truth`` judged against the reference's (or
        ``against``): ``compare_truths`` with this diff's budgets."""
        return compare_truths(against or self.ref_truth, truth, self.tolerance,
                              self.judge_dtypes, self.options.budgets.allow_nonfinite,
                              self.labels, self.tensors.get("attention_mask"))

    def put_back(self) -> None:
        """Every module back in its own mode and on its own device."""
        if self.placement is not None:
            self.placement.restore()
        restore_modes(self.original_reference, self.modes["reference"])
        if "candidate" in self.modes:
            restore_modes(self.candidate, self.modes["candidate"])


def tensors_of(inputs: TokenizedInputs | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if isinstance(inputs, TokenizedInputs):
        return dict(inputs.tensors)
    if not isinstance(inputs, Mapping) or not inputs:
        raise InputError("diff needs inputs: introspect.tokenize(...) output or a non-empty "
                         f"mapping of input names to tensors, got {type(inputs).__name__}")
    bad = [k for k, v in inputs.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise InputError(f"inputs must be tensors; {', '.join(map(str, bad))} is not")
    return dict(inputs)


def copies(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of each input: every call and every replay gets its own."""
    return {name: tensor.clone() for name, tensor in tensors.items()}


def holds_script(model: torch.nn.Module) -> bool:
    """TorchScript keeps what an ``inference_mode`` call made (its profiled graph's
    tensors), and a later call with autograd on then fails: no such call for it."""
    return any(isinstance(m, torch.jit.ScriptModule) for m in model.modules())


def compiled(model: torch.nn.Module) -> bool:
    """``torch.compile`` or TorchScript anywhere in ``model``: its compiler sees the truth
    calls' saved-tensor hooks (``run.truth``), so its calls keep what autograd saves."""
    return holds_script(model) or any(getattr(m, "_orig_mod", None) is not None
                                      for m in model.modules())


def training_modes(model: torch.nn.Module) -> dict[str, bool]:
    return {name: module.training for name, module in model.named_modules()}


def restore_modes(model: torch.nn.Module, modes: Mapping[str, bool]) -> None:
    for name, module in model.named_modules():
        module.training = modes.get(name, module.training)


def modes_that_count(model: torch.nn.Module, training: Mapping[str, bool]) -> dict[str, bool]:
    """``training`` without torch's quantized modules, which are built for inference and
    never read the flag: ``quantize_dynamic`` makes its Linears (and their packed
    parameters) in training mode inside a model in eval mode, which is no mode of the
    port's (they are still run in eval mode and put back with the rest)."""
    modules = dict(model.named_modules())
    return {name: on for name, on in training.items()
            if not type(modules.get(name)).__module__.startswith(_INFERENCE_ONLY)}


_INFERENCE_ONLY = ("torch.ao.nn.quantized.", "torch.nn.quantized.")


def training_note(side: str, training: Mapping[str, bool]) -> str:
    """Which modules were in training mode (the whole model, or some of its parts)."""
    if training.get(""):
        return (f"the {side} was in training mode; diff ran it in eval mode (dropout off) "
                "and put it back")
    parts = [name for name, on in training.items() if on]
    return (f"the {side} had {len(parts)} module(s) in training mode "
            f"({describe_changes(parts, most=3)}) inside a model "
            "in eval mode; diff ran them in eval mode (dropout off) and put them back")


__all__ = ["DiffState", "compiled", "copies", "holds_script", "restore_modes",
           "modes_that_count", "tensors_of", "training_modes", "training_note"]
