"""A port whose forward edits its own weights on every call (imports torch only): the
from-scratch shape of BERT does not matter here, so it wraps a copy of the reference and
scales one Linear's weight through ``.data`` before each call (no version counter sees it)."""

from __future__ import annotations

import copy

import torch


class Drifting(torch.nn.Module):
    def __init__(self, reference: torch.nn.Module):
        super().__init__()
        self.inner = copy.deepcopy(reference)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        dense = self.inner.encoder.layer[1].intermediate.dense
        dense.weight.data *= 1.001
        out = self.inner(input_ids=input_ids, token_type_ids=token_type_ids,
                         attention_mask=attention_mask)
        return {"last_hidden_state": out.last_hidden_state, "pooler_output": out.pooler_output}


class EditsAfterItsLastCall(Drifting):
    """Computes as the reference does, then, under ``torch.inference_mode()`` (the diff's
    last plain call), writes -0.0 through ``.data`` where its first weight of layer 0's
    output holds 0.0: every value it computes is the same, and its weight's bits are not
    what they were."""

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        out = self._plain(input_ids, token_type_ids, attention_mask)
        if torch.is_inference_mode_enabled():
            self.inner.encoder.layer[0].output.dense.weight.data[0, 0] = -0.0
        return out

    def _plain(self, input_ids, token_type_ids, attention_mask):
        out = self.inner(input_ids=input_ids, token_type_ids=token_type_ids,
                         attention_mask=attention_mask)
        return {"last_hidden_state": out.last_hidden_state, "pooler_output": out.pooler_output}
