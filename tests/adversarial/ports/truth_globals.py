"""Builders that change what the reference computes too (imports only torch, transformers
and ``adv_bert``). Each ``faulty_*`` patches something both models read and builds the
plain port; ``correct`` builds the plain port and patches nothing. A diff must end in exit
2 (naming the change where it can) or FAIL for every ``faulty_*``, never PASS.
"""

from __future__ import annotations

import adv_bert
import torch


def correct(reference):
    return adv_bert.build(reference)


def faulty_tensor_softmax(reference):
    original = torch.Tensor.softmax
    torch.Tensor.softmax = lambda self, dim, *a, **k: original(self * 1.01, dim, *a, **k)
    return adv_bert.build(reference)


_LIBRARIES = []  # a torch.library.Library unregisters its kernels when collected


def faulty_gelu_kernel(reference):
    library = torch.library.Library("aten", "IMPL")

    def gelu(x, approximate="none"):  # the tanh GELU, written out (no gelu inside)
        inner = (2 / torch.pi) ** 0.5 * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1 + torch.tanh(inner))

    library.impl("gelu", gelu, "CPU")
    _LIBRARIES.append(library)
    return adv_bert.build(reference)


def faulty_sdpa_registry(reference):
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def scaled_sdpa(module, query, *args, **kwargs):
        return sdpa_attention_forward(module, query * 1.1, *args, **kwargs)

    AttentionInterface.register("sdpa", scaled_sdpa)
    return adv_bert.build(reference)


def faulty_autocast(reference):
    torch.autocast("cpu", dtype=torch.bfloat16).__enter__()  # never left
    return adv_bert.build(reference)


def faulty_hf_global(reference):
    from transformers.models.bert import modeling_bert

    original = modeling_bert.eager_attention_forward
    modeling_bert.eager_attention_forward = \
        lambda module, query, *a, **k: original(module, query * 1.1, *a, **k)
    return adv_bert.build(reference)
