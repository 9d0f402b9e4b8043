"""Ports whose forward, on its last call (under ``torch.inference_mode``), leaves behind
something the reference computes with; each computes the reference's own values (it runs
a copy of the reference, then does its damage). Imports only torch and NumPy.

- ``correct``: leaves nothing behind;
- ``environment``: sets an environment variable nobody reads (harmless);
- ``weights``: adds 1 to one of the reference's own weights through a NumPy view (no
  version counter sees it);
- ``kernel``: registers a tanh GELU as ``aten::gelu``'s CPU kernel (``torch.library``);
- ``layer_norm``: rebinds ``torch.nn.functional.layer_norm`` to one that scales its output;
- ``faulty``: its copy's layer 1 takes the tanh GELU (a FAIL), and leaves nothing behind;
- ``faulty_weights``: that FAIL, and the ``weights`` edit on its last call.
"""

from __future__ import annotations

import copy
import os

import torch
import torch.nn.functional as F

_KEPT = []  # a torch.library.Library unregisters its kernels when collected


class Runs(torch.nn.Module):
    """A copy of the reference, run as it is; ``leave`` runs after the last call."""

    def __init__(self, reference, leave=None, tanh=False):
        super().__init__()
        self.model = copy.deepcopy(reference.model).eval()
        self._leave = leave
        if tanh:
            self.model.encoder.layer[1].intermediate.intermediate_act_fn = \
                torch.nn.GELU(approximate="tanh")

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = self.model(input_ids=input_ids, token_type_ids=token_type_ids,
                         attention_mask=attention_mask)
        if torch.is_inference_mode_enabled() and self._leave is not None:
            self._leave()
        return {"last_hidden_state": out.last_hidden_state,
                "pooler_output": out.pooler_output}


def correct(reference):
    return Runs(reference)


def environment(reference):
    return Runs(reference, lambda: os.environ.__setitem__("INTROSPECT_LEFT_BEHIND", "1"))


def weights(reference):
    weight = reference.model.encoder.layer[0].output.dense.weight

    def edit():
        weight.detach().numpy()[0, 0] += 1.0
    return Runs(reference, edit)


def faulty(reference):
    return Runs(reference, tanh=True)


def faulty_weights(reference):
    weight = reference.model.encoder.layer[0].output.dense.weight

    def edit():
        weight.detach().numpy()[0, 0] += 1.0
    return Runs(reference, edit, tanh=True)


def kernel(reference):
    def register():
        library = torch.library.Library("aten", "IMPL")

        def gelu(x, approximate="none"):
            inner = (2 / torch.pi) ** 0.5 * (x + 0.044715 * x * x * x)
            return 0.5 * x * (1 + torch.tanh(inner))

        library.impl("gelu", gelu, "CPU")
        _KEPT.append(library)
    return Runs(reference, register)


def layer_norm(reference):
    original = F.layer_norm

    def scaled(*args, **kwargs):
        return original(*args, **kwargs) * 1.01

    def patch():
        torch.nn.functional.layer_norm = scaled
    return Runs(reference, patch)
