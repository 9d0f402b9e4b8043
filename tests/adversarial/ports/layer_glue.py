"""HF BERT's own modules (copies) driven by a loop of the port's own, the code between
the layers being the port's: the same layers, the same weights. Correct: the loop hands
each layer's output on as it is, or as ``h * 3 / 3`` (each element within a rounding),
or with the padding positions zeroed (what no real token reads). Faulty: the loop scales
layer 3's output by 1 + 2e-6 on its way to layer 4 (a temperature left in), in the model's
own loop or in an encoder module's (or by 1 + 5e-7: every element moved by a few
roundings, alike); every module agrees on the reference's inputs, and
the next LayerNorm all but undoes the slip before the outputs."""

import copy

import torch
from torch import nn


def _handed_on(h, i, mask, how):
    if how == "there_and_back":
        return h * 3.0 / 3.0
    if how == "padding_zeroed":
        return h * mask[:, :, None].to(h.dtype)
    if how == "scaled" and i == 3:
        return h * (1.0 + 2e-6)
    if how == "scaled_slightly" and i == 3:
        return h * (1.0 + 5e-7)
    return h


class Encoder(nn.Module):
    def __init__(self, reference, how):
        super().__init__()
        self.layer = nn.ModuleList(copy.deepcopy(layer) for layer in reference.encoder.layer)
        self.how = how

    def forward(self, h, additive, mask):
        for i, layer in enumerate(self.layer):
            out = layer(h, attention_mask=additive)
            h = _handed_on(out[0] if isinstance(out, tuple) else out, i, mask, self.how)
        return h


class LoopBert(nn.Module):
    def __init__(self, reference, how, encoder=False):
        super().__init__()
        self.embeddings = copy.deepcopy(reference.embeddings)
        if encoder:
            self.encoder = Encoder(reference, how)
        else:
            self.layers = nn.ModuleList(copy.deepcopy(layer) for layer in reference.encoder.layer)
        self.pooler = copy.deepcopy(reference.pooler)
        self.how = how

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        h = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        additive = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) \
            * torch.finfo(h.dtype).min
        if hasattr(self, "encoder"):
            h = self.encoder(h, additive, attention_mask)
        else:
            for i, layer in enumerate(self.layers):
                out = layer(h, attention_mask=additive)
                h = _handed_on(out[0] if isinstance(out, tuple) else out, i, attention_mask,
                               self.how)
        return {"last_hidden_state": h, "pooler_output": self.pooler(h)}


def correct(reference):
    return LoopBert(reference.model, "as_is").eval()


def there_and_back(reference):
    return LoopBert(reference.model, "there_and_back").eval()


def padding_zeroed(reference):
    return LoopBert(reference.model, "padding_zeroed").eval()


def faulty(reference):
    return LoopBert(reference.model, "scaled").eval()


def faulty_slightly(reference):  # (each element within 16 roundings: its mean is not)
    return LoopBert(reference.model, "scaled_slightly").eval()


def faulty_in_encoder(reference):
    return LoopBert(reference.model, "scaled", encoder=True).eval()
