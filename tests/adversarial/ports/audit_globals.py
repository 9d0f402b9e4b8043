"""Builders that change process-wide state, other ways than ``truth_globals`` (imports only
torch, transformers, ``adv_bert`` and the sibling ``audit_fastpath``). Each ``faulty_*``
changes something, then builds a port; a diff must end in exit 2 (naming the change where
it can) or FAIL, never PASS, except where the change is a process-wide switch (default
dtype, grad mode, deterministic algorithms: ``introspect.run.switches``) that changes no
value of either model: a verdict then, with a note naming the switch (issue 41).
``correct`` changes nothing. Each runs in a fresh process: what it changes outlives the
run.
"""

from __future__ import annotations

import adv_bert
import audit_fastpath
import torch
import torch.nn.functional as F
from torch import nn


def correct(reference):
    return adv_bert.build(reference)


def faulty_functional_gelu(reference):
    original = F.gelu
    torch.nn.functional.gelu = lambda x, approximate="none": original(x, approximate="tanh")
    return adv_bert.build(reference)


def faulty_matmul(reference):
    original = torch.matmul
    torch.matmul = lambda a, b, **k: original(a, b, **k) * 1.01
    return adv_bert.build(reference)


def faulty_default_dtype(reference):
    torch.set_default_dtype(torch.float64)
    return adv_bert.build(reference)


def faulty_matmul_precision(reference):
    torch.set_float32_matmul_precision("medium")
    return adv_bert.build(reference)


def faulty_act2fn(reference):
    """ACT2FN patched, then a port built from transformers' BertModel reads it."""
    import copy

    from transformers import BertModel
    from transformers.activations import ACT2FN, NewGELUActivation

    ACT2FN["gelu"] = NewGELUActivation
    model = BertModel(copy.deepcopy(reference.config))
    model.load_state_dict({k: v.detach().clone() for k, v in
                           reference.model.state_dict().items()})
    return model.eval()


def faulty_class_forward(reference):
    from transformers.models.bert import modeling_bert

    original = modeling_bert.BertSelfOutput.forward
    modeling_bert.BertSelfOutput.forward = \
        lambda self, h, x: original(self, h * 1.01, x)
    return adv_bert.build(reference)


def faulty_layernorm_forward(reference):
    original = nn.LayerNorm.forward
    nn.LayerNorm.forward = lambda self, x: original(self, x) * 1.001
    return adv_bert.build(reference)


def faulty_global_hook(reference):
    def hook(module, args, output):
        if type(module).__name__ == "BertIntermediate":
            return output * 1.01
        return None

    torch.nn.modules.module.register_module_forward_hook(hook)
    return adv_bert.build(reference)


def faulty_grad_off(reference):
    torch.set_grad_enabled(False)
    return adv_bert.build(reference)


def faulty_fastpath_off(reference):
    """The fast path switched off, so a fault only the fast path sees stays hidden."""
    torch.backends.mha.set_fastpath_enabled(False)
    model = audit_fastpath.correct_nested(reference)
    layer = model.encoder.layers[1]
    with torch.no_grad():
        layer.linear1.weight.mul_(1.05)
    plain = layer.linear1.forward
    layer.linear1.forward = lambda x: plain(x) / 1.05 - layer.linear1.bias * (1 / 1.05 - 1)
    return model


def faulty_deterministic(reference):
    torch.use_deterministic_algorithms(True)
    return adv_bert.build(reference)


def faulty_masking(reference):
    """transformers' mask helper patched: padding no longer masked in the reference."""
    from transformers import masking_utils

    masking_utils._ignore_bidirectional_mask_sdpa = lambda *args, **kwargs: True
    return adv_bert.build(reference)


class _PatchingBert(adv_bert.Bert):
    """Patches torch's sdpa on its first call (the candidate never uses sdpa)."""

    def forward(self, *args, **kwargs):
        if not getattr(self, "patched", False):
            self.patched = True
            original = F.scaled_dot_product_attention

            def sdpa(q, *a, **k):
                return original(q * 1.1 if torch.is_grad_enabled() else q, *a, **k)

            torch.nn.functional.scaled_dot_product_attention = sdpa
        return super().forward(*args, **kwargs)


def faulty_forward_patch(reference):
    return adv_bert.load(_PatchingBert(reference.config), reference)
