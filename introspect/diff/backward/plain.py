"""The user's own backward: each model's first plain call (autograd on) differentiated on
the diff's loss, as its user trains it, with nothing recorded.

``PlainGradients.taker`` is handed to ``run.truth.run_truth`` (its ``backward``): the
loss of what that call returned, and its ``backward()``, each parameter's ``.grad`` read
and put back as the caller had it. The module outputs' gradients come from the same
backward, through the tensor hooks ``run.capture.capture_calls(gradients=True)`` put on
them (``Leaf.grad``).
``backward.plain_parity`` judges the two sides' gradients.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch

from introspect.diff.backward.record import LossFn, _describe, _loss_of
from introspect.errors import InputError


@dataclasses.dataclass
class PlainGradients:
    """One side's own backward of its first plain call (named as ``GradientRecording``'s
    fields, so that ``parity._loss_notes`` reads either)."""

    loss: float = math.nan
    parameter_grads: dict[str, torch.Tensor | None] = dataclasses.field(default_factory=dict)
    parameters: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    detached: bool = False  # the loss did not reach autograd: no gradient flowed
    frozen: list[str] = dataclasses.field(default_factory=list)  # requires_grad off
    buffers: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)  # floating
    grads: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)  # (no nodes)

    def taker(self, model: torch.nn.Module, loss_fn: LossFn,
              detached_ok: bool = False) -> Callable[[Any], None]:
        """What ``run_truth`` calls with the first call's outputs: this side's loss and
        every parameter's gradient, kept here. ``detached_ok``: a loss autograd cannot
        reach (the candidate's forward detached it) is noted, not refused."""

        def take(returned: Any) -> None:
            named = _first_names(model)
            self.parameters = {name: p.detach() for name, p in named.items()}
            self.frozen = [name for name, p in named.items() if not p.requires_grad]
            self.buffers = {name: b.detach() for name, b in model.named_buffers()
                            if b.is_floating_point()}
            with torch.enable_grad():
                loss = _loss_of(loss_fn, returned, {})
            scalar = isinstance(loss, torch.Tensor) and loss.numel() == 1
            self.detached = scalar and not loss.requires_grad and detached_ok
            if not scalar or not (loss.requires_grad or self.detached):
                raise InputError("the loss must be a scalar tensor that depends on the "
                                 f"model's outputs, got {_describe(loss)}")
            self.loss = float(loss.detach())
            wanted = {name: p for name, p in named.items() if p.requires_grad}
            self.parameter_grads = dict.fromkeys(named)
            if self.detached or not wanted:
                return
            # ``loss.backward()`` as its user calls it (a reentrant checkpoint refuses
            # ``autograd.grad``), each ``.grad`` taken and put back as it was
            kept = {name: p.grad for name, p in wanted.items()}
            try:
                for p in wanted.values():
                    p.grad = None
                loss.reshape(()).backward()
                for name, p in wanted.items():
                    self.parameter_grads[name] = None if p.grad is None else p.grad.detach()
            except Exception as e:
                cause = " ".join(str(e).split())
                raise InputError(f"{type(model).__name__} could not run its backward: "
                                 f"{type(e).__name__}: {cause}") from e
            finally:
                for name, p in wanted.items():
                    p.grad = kept[name]

        return take


def _first_names(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Each floating parameter once, under its first name (tied weights: one)."""
    return {name: p for name, p in model.named_parameters() if p.is_floating_point()}


__all__ = ["PlainGradients"]
