"""A layer mapped over the batch's rows with ``torch.func.vmap`` (imports only torch and
``adv_bert``): each row runs the layer as a batch of one.

- ``correct``: layer ``fault_layer`` under ``vmap`` over rows;
- ``faulty``: the same, with the tanh GELU in that layer;
- ``correct_called`` / ``faulty_called``: the model maps the layer module itself over the
  rows (``vmap(lambda row: block(row[None])[0])``): the layer's call is made under
  ``vmap``, not its insides. Module evidence left such a call to its caller (the whole
  model), and the FAIL named only the outputs.
"""

from __future__ import annotations

import adv_bert
import torch
import torch.nn.functional as F


class RowMappedBlock(adv_bert.Block):
    approximate = "none"
    mapped = -1

    def activation(self, h):
        return F.gelu(h, approximate=self.approximate if self.index == self.mapped else "none")

    def forward(self, x, mask):
        if self.index != self.mapped:
            return super().forward(x, mask)
        one = super().forward
        return torch.func.vmap(lambda row, m: one(row[None], m[None])[0])(x, mask)


def _mapped(reference, approximate):
    model = adv_bert.build(reference, RowMappedBlock)
    for block in model.blocks:
        block.mapped = adv_bert.fault_layer(reference)
        block.approximate = approximate
    return model


def correct(reference):
    return _mapped(reference, "none")


def faulty(reference):
    return _mapped(reference, "tanh")


class RowMappedBert(adv_bert.Bert):
    mapped = -1

    def forward(self, input_ids, token_type_ids, attention_mask):
        mask = attention_mask[:, None, None, :].bool()
        x = self.embed(input_ids, token_type_ids)
        for block in self.blocks:
            if block.index == self.mapped:
                x = torch.func.vmap(lambda row, m, b=block: b(row[None], m[None])[0])(x, mask)
            else:
                x = block(x, mask)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


class TanhBlock(adv_bert.Block):
    tanh_layer = -1

    def activation(self, h):
        return F.gelu(h, approximate="tanh" if self.index == self.tanh_layer else "none")


def _called(reference, approximate):
    model = adv_bert.load(RowMappedBert(reference.config, TanhBlock), reference)
    model.mapped = adv_bert.fault_layer(reference)
    for block in model.blocks:
        block.tanh_layer = model.mapped if approximate == "tanh" else -1
    return model


def correct_called(reference):
    return _called(reference, "none")


def faulty_called(reference):
    return _called(reference, "tanh")
