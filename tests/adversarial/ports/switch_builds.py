"""Builds that flip a process-wide switch and return the reference's own model, copied
(imports only torch): the port is correct; only the switch is in question.

- ``fastpath_off``: PyTorch's MHA fast path off (HF BERT never reads it);
- ``no_sdpa``: every scaled-dot-product-attention backend off (HF's sdpa cannot run);
- ``grad_off``: autograd left off;
- ``no_sdpa_own_attention``: no sdpa backend, a port that never calls sdpa.
"""

from __future__ import annotations

import copy

import torch


def fastpath_off(reference):
    torch.backends.mha.set_fastpath_enabled(False)
    return copy.deepcopy(reference.model)


def no_sdpa(reference):
    for name in ("flash", "mem_efficient", "math", "cudnn"):
        enable = getattr(torch.backends.cuda, f"enable_{name}_sdp", None)
        if enable is not None:
            enable(False)
    return copy.deepcopy(reference.model)


def grad_off(reference):
    torch.set_grad_enabled(False)
    return copy.deepcopy(reference.model)


def no_sdpa_own_attention(reference):
    """No sdpa backend, and a port that never calls sdpa: only the reference needs one."""
    import adv_bert

    no_sdpa(reference)
    return adv_bert.build(reference)
