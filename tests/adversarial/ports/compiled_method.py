"""Layer N's feed-forward in a ``torch.compile``d bound method of the model (not a module),
its GELU written out with ``erf``; ``faulty`` types its constant 0.7071 for 1/sqrt(2)."""

import math

import adv_bert
import torch
import torch.nn.functional as F


class Bert(adv_bert.Bert):
    constant = 1 / math.sqrt(2)
    layer = 1

    def __init__(self, config) -> None:
        super().__init__(config)
        self.compiled_ffn = torch.compile(self._ffn, dynamic=False)

    def _ffn(self, x, w1, b1, w2, b2, c):
        h = F.linear(x, w1, b1)
        return F.linear(0.5 * h * (1.0 + torch.erf(h * c)), w2, b2)

    def forward(self, input_ids, token_type_ids, attention_mask):
        mask = attention_mask[:, None, None, :].bool()
        x = self.embed(input_ids, token_type_ids)
        for i, b in enumerate(self.blocks):
            if i != self.layer:
                x = b(x, mask)
                continue
            x = b.norm1(x + b.proj(b.attend(x, mask)))
            f = self.compiled_ffn(x, b.ffn_in.weight, b.ffn_in.bias, b.ffn_out.weight,
                                  b.ffn_out.bias, self.constant)
            x = b.norm2(x + f)
        return {"last_hidden_state": x, "pooler_output": self.pool(x[:, 0]).tanh()}


def correct(reference):
    model = adv_bert.load(Bert(reference.config), reference)
    model.layer = adv_bert.fault_layer(reference)
    return model


def faulty(reference):
    model = correct(reference)
    model.constant = 0.7071
    return model
