"""The reference called plainly once more, at the end: it must compute what it did first.

A candidate's code runs in the same process as the reference. One that changes what the
reference computes (a patched ``torch.Tensor`` method, a kernel, a registry, autocast left
on, a module global both import) would make any verdict meaningless, so the diff calls the
reference again under ``no_grad`` after the candidate ran and ends with no verdict when
its outputs moved.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from introspect.errors import InputError
from introspect.run.truth import Truth, identical, run_truth


class ReferenceChanged(InputError):
    """The reference computes other values after the candidate's code ran: no verdict."""


def check_reference_again(reference: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                          truth: Truth) -> None:
    """Call the reference once more under ``no_grad``: it must return what it did first.

    Raises:
        ReferenceChanged: it does not (the message names the outputs and the difference).
    """
    again = run_truth(reference, inputs, grad_calls=0).no_grad_outputs
    first = truth.no_grad_outputs
    moved = [name for name in first if not identical(first[name], again.get(name))]
    if not moved:
        return
    gaps = []
    for name in moved:
        a, b = first[name], again.get(name)
        if b is not None and a.shape == b.shape and a.is_floating_point():
            gaps.append(float((a.double() - b.double()).abs().nan_to_num(float("inf")).max()))
    gap = f" by up to {max(gaps):.3g}" if gaps else ""
    raise ReferenceChanged(
        f"the candidate changed what the reference computes (run again, its "
        f"{', '.join(moved)} moved{gap}: a patched torch function or kernel, autocast left "
        "on?); no verdict")


__all__ = ["ReferenceChanged", "check_reference_again"]
