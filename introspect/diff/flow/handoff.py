"""The first step: the arguments that decide the mode, checked, and the modes of their own
(``--nproc``, ``--generate``) handed off before anything runs or moves."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from introspect.diff import devices
from introspect.diff.options import DiffOptions
from introspect.diff.result import DiffResult
from introspect.errors import InputError
from introspect.models.load import TokenizedInputs
from introspect.run.deferred import Deferred

Inputs = TokenizedInputs | Mapping[str, torch.Tensor]


def diff_parallel_mode(reference: Any, candidate: Any, inputs: Inputs,
                       options: DiffOptions) -> DiffResult:
    """A tensor-parallel port: its own mode (``introspect.diff.parallel``). First, before
    the other modes are checked: it takes none of them."""
    from introspect.diff.parallel import diff_parallel

    budgets, mode, tables = options.budgets, options.mode, options.tables
    assert mode.nproc is not None
    if mode.generate or mode.backward or budgets.noise_budget:
        raise InputError("nproc does not mix with generate, backward or noise_budget")
    return diff_parallel(reference, candidate, inputs, mode.nproc,  # type: ignore[no-any-return]
                         atol=budgets.atol, rtol=budgets.rtol,
                         reference_label=tables.reference_label,
                         candidate_label=tables.candidate_label,
                         allow_nonfinite=budgets.allow_nonfinite)


def check_modes(options: DiffOptions) -> None:
    """Refuse the modes that do not mix, before anything moves or runs."""
    mode = options.mode
    devices.check_modes(options.devices.device, options.devices.candidate_device,
                        mode.generate, mode.backward)
    if mode.generate and mode.backward:
        raise InputError("generate does not mix with backward: gradients are compared on one "
                         "forward")


def diff_generation_mode(reference: torch.nn.Module, candidate: Any, inputs: Inputs,
                         options: DiffOptions,
                         diff_forward: Callable[..., DiffResult]) -> DiffResult:
    """``generate``: the decoding loop (``introspect.diff.generation``), which compares each
    step with ``diff_forward`` (``introspect.diff`` itself, handed in: the loop never
    imports it)."""
    from introspect.diff.generation import diff_generation

    budgets, tables = options.budgets, options.tables
    return diff_generation(reference, built(candidate), inputs, options.mode.generate,
                           diff_forward=diff_forward, tokenizer=options.mode.tokenizer,
                           atol=budgets.atol, rtol=budgets.rtol,
                           noise_budget=budgets.noise_budget, name_map=tables.name_map,
                           reference_label=tables.reference_label,
                           candidate_label=tables.candidate_label,
                           allow_nonfinite=budgets.allow_nonfinite,
                           noise_factor=budgets.noise_factor)


def built(candidate: Any) -> Any:
    """The candidate model, built now if it was handed over ``Deferred``."""
    return candidate.build() if isinstance(candidate, Deferred) else candidate


__all__ = ["built", "check_modes", "diff_generation_mode", "diff_parallel_mode"]
