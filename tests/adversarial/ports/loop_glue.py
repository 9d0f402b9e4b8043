"""HF BERT's own modules (copies) driven by a forward of the port's own: the layers called
in a loop, the attention mask made there (``finfo.min`` fill), and the pooler handed the
last hidden state. The faulty one scales what it hands the pooler by 1 + 3e-6 (a
temperature left in): every module agrees on the reference's inputs, the outputs move by
less than their budget, and only the code between modules computed the slip."""

import copy

import torch
from torch import nn


class LoopBert(nn.Module):
    def __init__(self, reference, scale):
        super().__init__()
        self.embeddings = copy.deepcopy(reference.embeddings)
        self.layers = nn.ModuleList(copy.deepcopy(layer) for layer in reference.encoder.layer)
        self.pooler = copy.deepcopy(reference.pooler)
        self.scale = scale

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        h = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        mask = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
        for layer in self.layers:
            out = layer(h, attention_mask=mask)
            h = out[0] if isinstance(out, tuple) else out
        pooled = self.pooler(h * self.scale if self.scale != 1.0 else h)
        return {"last_hidden_state": h, "pooler_output": pooled}


def faulty(reference):
    return LoopBert(reference.model, 1.0 + 3e-6).eval()


def correct(reference):
    return LoopBert(reference.model, 1.0).eval()
