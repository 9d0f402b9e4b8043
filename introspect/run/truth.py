"""Truth runs: a model called plainly, as its user calls it, and what the calls showed.

The verdict rests on these calls (shared/DESIGN.md, "Truth runs"), not on the recording:

- eval mode (the diff puts the model there), no torch function mode of ours, autograd on
  (a plain ``model(**x)``), then once more under ``no_grad`` (what inference code does;
  PyTorch's fast paths, such as ``nn.TransformerEncoderLayer``'s fused kernel, run only
  there), and the candidate once more under ``torch.inference_mode()`` (what much
  inference code calls instead: a forward may ask ``torch.is_inference_mode_enabled()``);
- every call gets its own copy of the inputs, and the copy is checked unchanged afterwards
  (a port that fills the attention mask in place would otherwise corrupt what the other
  model sees, or the caller's own tensors);
- the candidate is called with autograd on at least twice: a forward whose outputs change
  from call to call (a Python counter, a cache it fills) cannot be trusted by one call;
- every output is kept, whatever produced it (``introspect.run.outputs``).

Example::

    >>> truth = run_truth(model, {"input_ids": ids})
    >>> sorted(truth.grad_outputs), truth.changed_inputs
    (['last_hidden_state', 'pooler_output'], [])
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch

from introspect.errors import InputError
from introspect.run.outputs import flatten_outputs
from introspect.run.quiet import checkpoint_warning_quiet, said, worker_errors

_T = TypeVar("_T")

# The modes a truth call runs in (the ``call`` column of ``DiffResult.outputs``).
AUTOGRAD, NO_GRAD, INFERENCE_MODE = "autograd", "no_grad", "inference_mode"


@dataclasses.dataclass
class TruthCall:
    """One plain call: its grad mode, its outputs by name, the inputs it changed in place."""

    grad: bool
    outputs: dict[str, torch.Tensor]
    changed_inputs: list[str]
    mode: str = ""  # AUTOGRAD, NO_GRAD or INFERENCE_MODE ("": from ``grad``)

    def __post_init__(self) -> None:
        self.mode = self.mode or (AUTOGRAD if self.grad else NO_GRAD)


@dataclasses.dataclass
class Truth:
    """The truth runs of one model: the calls with autograd on, then the ``no_grad`` one."""

    calls: list[TruthCall]
    # what the ``inference_mode`` call raised, where the others ran ("": it ran or none
    # was made): a port that cannot run there (grad modes are per thread: a worker thread
    # computes with autograd on, on inference tensors) gets a verdict from the others
    inference_raised: str = ""

    @property
    def grad_outputs(self) -> dict[str, torch.Tensor]:
        """The first call's outputs (autograd on): ``model(**x)`` as a user writes it."""
        return self.calls[0].outputs

    @property
    def no_grad_outputs(self) -> dict[str, torch.Tensor]:
        """The ``no_grad`` call's outputs (inference code; PyTorch's fast paths)."""
        return [c for c in self.calls if c.mode == NO_GRAD][-1].outputs

    @property
    def inference_outputs(self) -> dict[str, torch.Tensor] | None:
        """The ``torch.inference_mode()`` call's outputs; None where there was none."""
        return self.outputs_of(INFERENCE_MODE)

    def outputs_of(self, mode: str) -> dict[str, torch.Tensor] | None:
        """The outputs of the call in ``mode`` (the first with autograd on, as
        ``grad_outputs``); None where no call ran in it."""
        found = [c for c in self.calls if c.mode == mode]
        if not found:
            return None
        return (found[0] if mode == AUTOGRAD else found[-1]).outputs

    @property
    def changed_inputs(self) -> list[str]:
        """Inputs some call changed in place, in input order."""
        seen = {name: None for call in self.calls for name in call.changed_inputs}
        return list(seen)

    def repeatable(self) -> bool:
        """Every call returned the same outputs bit for bit, whatever its mode: a forward
        drawing at random (a dropout left on) did not show in them."""
        return not _differing(self.calls)

    def changed_between_calls(self) -> list[str]:
        """Outputs of the autograd calls that are not bit-identical from call to call."""
        return _differing([c for c in self.calls if c.grad])


def _differing(calls: list[TruthCall]) -> list[str]:
    """The outputs some of ``calls`` returned otherwise than the first, bit for bit (or
    not at all), in the first's order."""
    first = calls[0].outputs
    differing: dict[str, None] = {}
    for call in calls[1:]:
        for name in first.keys() | call.outputs.keys():
            if not identical(first.get(name), call.outputs.get(name)):
                differing[name] = None
    return sorted(differing, key=lambda n: _order(first, n))


def run_truth(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
              keywords: Mapping[str, Any] | None = None, grad_calls: int = 1,
              inference: bool = False, lean: bool = True,
              backward: Callable[[Any], None] | None = None, label: str = "") -> Truth:
    """Call ``model`` plainly ``grad_calls`` times with autograd on, then once under no_grad
    (and, with ``inference``, once under ``torch.inference_mode()``).

    Args:
        model: the model, already in the mode its user runs it in (the diff: eval).
        inputs: the input tensors by keyword; each call gets its own copy, and the
            originals are never handed to the model.
        keywords: other keyword arguments, passed as they are.
        grad_calls: how many calls with autograd on (the candidate: 2, to see a forward
            that changes from call to call).
        inference: a last call under ``torch.inference_mode()`` (the candidate: a forward
            may branch on ``torch.is_inference_mode_enabled()``).
        lean: the calls with autograd on keep nothing for a backward (``_NothingSaved``):
            the same forward, the memory of a ``no_grad`` call. False for compiled and
            scripted models, whose compilers see such hooks.
        backward: called with what the first call (autograd on) returned, its autograd
            graph kept: the user's own backward runs on the user's own call
            (``diff.backward.plain``); that call keeps what a backward reads.
        label: how an error names the model (a port's ``FILE.py:BUILD``); its class
            name where none is given.

    Raises:
        InputError: the model failed on the inputs (the cause is kept).
    """
    calls: list[TruthCall] = []
    raised = ""
    modes = [AUTOGRAD] * grad_calls + [NO_GRAD] + ([INFERENCE_MODE] if inference else [])
    for number, mode in enumerate(modes):
        then = backward if number == 0 else None  # (the first call has autograd on)
        in_threads: list[Any] = []
        try:
            with worker_errors(in_threads) if mode == INFERENCE_MODE else \
                    contextlib.nullcontext():
                copies, returned = _plain_call(model, inputs, keywords, mode,
                                               lean and mode == AUTOGRAD and then is None)
            outputs = flatten_outputs(returned)  # outside inference mode: plain tensors
        except Exception as e:
            cause = " ".join(str(e).split())
            if mode == INFERENCE_MODE and calls:  # the others ran: said, not refused
                raised = "; in a worker thread: ".join(
                    [f"{type(e).__name__}: {cause}", *map(said, in_threads[:1])])
                continue
            raise InputError(f"{label or type(model).__name__} could not run on the inputs: "
                             f"{type(e).__name__}: {cause}") from e
        for error in in_threads:  # the call ran after all: printed, as they would be
            threading.excepthook(error)
        if then is not None:  # (outside the try: its errors are its own)
            then(returned)
        del returned  # its autograd graph goes with it
        changed = [name for name in inputs if not identical(inputs[name], copies[name])]
        calls.append(TruthCall(mode == AUTOGRAD, outputs, changed, mode))
    return Truth(calls, raised)


def _plain_call(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                keywords: Mapping[str, Any] | None, mode: str, lean: bool,
                ) -> tuple[dict[str, torch.Tensor], Any]:
    """``model`` called on its own copy of ``inputs`` in ``mode``: (the copy, what it
    returned). ``lean``: nothing kept for a backward (``keeping_nothing``)."""

    def call() -> tuple[dict[str, torch.Tensor], Any]:
        copies = {name: tensor.clone() for name, tensor in inputs.items()}
        return copies, model(**copies, **(keywords or {}))

    with mode_context(mode), checkpoint_warning_quiet():
        return keeping_nothing(call) if lean else call()


class _NothingSaved(torch.autograd.graph.saved_tensors_hooks):
    """Autograd on, but what a backward would read is not kept.

    A plain ``model(**x)`` with autograd on runs the path a user's call takes (PyTorch's
    fast paths stay off, ``torch.is_grad_enabled()`` is True, every output has its
    ``grad_fn``) and keeps every activation for a backward that the truth runs never make:
    at 8 x 512, BERT-base's truth calls held 2.5x a forward's memory. Saved-tensor hooks
    see only what autograd stores, never a value the forward computes, so the outputs are
    the same bit for bit. A forward that runs a backward of its own reads what it saved:
    ``read`` says so, and the call runs again without these hooks.
    """

    def __init__(self) -> None:
        super().__init__(self._pack, self._unpack)
        self.read = False

    @staticmethod
    def _pack(tensor: torch.Tensor) -> None:
        return None

    def _unpack(self, packed: None) -> torch.Tensor:
        self.read = True
        raise RuntimeError("a value saved for backward was not kept (introspect's truth call)")


def keeping_nothing(run: Callable[[], _T]) -> _T:
    """``run()`` with nothing kept for a backward where autograd is on (``_NothingSaved``):
    a truth call, or a module run again on the reference's inputs (module evidence), is
    never differentiated, and a whole model's run kept every activation of a forward until
    it returned. A run that reads what it saved (a backward inside its forward) runs again
    with it kept: ``run`` makes its own copies of what it is given, each time."""
    with checkpoint_warning_quiet():
        if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            return run()
        nothing_saved = _NothingSaved()
        try:
            with nothing_saved:
                return run()
        except Exception:
            if not nothing_saved.read:
                raise
        return run()


def mode_context(mode: str) -> Any:
    """The context a call in ``mode`` (AUTOGRAD, NO_GRAD, INFERENCE_MODE) runs in."""
    if mode == INFERENCE_MODE:
        return torch.inference_mode()
    return torch.set_grad_enabled(mode == AUTOGRAD)


def identical(a: Any, b: Any) -> bool:
    """Bit for bit: same shape, dtype and values, NaN where the other has NaN."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return a is None and b is None
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a is b or same_view(a, b) or torch.equal(a, b):  # (equal: no NaN on either side;
        return True  # most calls end here)
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(a.nan_to_num(), b.nan_to_num())
                    and torch.equal(a.isnan(), b.isnan()))
    return bool(torch.equal(a, b))


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same elements of the same memory (two detached views of one value); False
    where either has no storage to ask (a functorch tensor under ``vmap``)."""
    try:
        return _same_view(a, b)
    except (RuntimeError, NotImplementedError):
        return False


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.device == b.device and a.dtype == b.dtype and not a.is_meta \
        and a.layout == torch.strided and b.layout == torch.strided \
        and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() \
        and a.storage_offset() == b.storage_offset() and a.stride() == b.stride() \
        and a.shape == b.shape and a.untyped_storage().data_ptr() != 0


def _order(outputs: Mapping[str, Any], name: str) -> int:
    names = list(outputs)
    return names.index(name) if name in names else len(names)


def weight_sums(model: torch.nn.Module, only: set[str] | None = None) -> dict[str, int]:
    """Each parameter's checksum: read again after calls, it shows a forward that edits its
    own weights (``weight.data *= 1.001``, which no version counter sees).

    The checksum is the sum of the values' bit patterns as integers, wrapping around: any
    one element changed changes it (a float sum may round a change away), NaN is a bit
    pattern like any other, and it reads each weight once at integer speed (about 6x a
    float64 sum on one core). Buffers are left out: a cache a forward fills on its first
    call is no edit. ``only``: those parameters alone."""
    with torch.no_grad():
        return {name: checksum(t.detach()) for name, t in model.named_parameters()
                if t.is_floating_point() and t.device.type != "meta"
                and (only is None or name in only)}


_CHUNK = 1 << 20  # narrower elements summed at a time: no wider copy of a whole weight
_AS_INTEGERS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def checksum(tensor: torch.Tensor) -> int:
    """The sum of ``tensor``'s bit patterns as integers, wrapping around (``weight_sums``)."""
    bits = tensor.reshape(-1).view(_AS_INTEGERS[tensor.element_size()])
    if bits.dtype in (torch.int32, torch.int64):  # summed in its own width: no copy at all
        return int(bits.sum(dtype=bits.dtype))
    return sum(int(part.sum(dtype=torch.int32)) for part in bits.split(_CHUNK))


def edited_weights(before: Mapping[str, int], after: Mapping[str, int]) -> list[str]:
    """The weights whose checksums differ."""
    return [name for name, value in before.items() if name in after and value != after[name]]


__all__ = ["AUTOGRAD", "INFERENCE_MODE", "NO_GRAD", "Truth", "TruthCall", "checksum",
           "edited_weights", "identical", "keeping_nothing", "run_truth", "same_view",
           "weight_sums"]
