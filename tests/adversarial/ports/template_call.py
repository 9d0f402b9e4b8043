"""BERT whose layers share one template module called through
``torch.func.functional_call`` with each layer's weights (imports only torch and
``adv_bert``; probe round r). The template is built as a copy of layer 0.

The recording read the template's attributes while functional_call had swapped each
layer's weights in; replayed, they held layer 0's. The replay did not reproduce the
recording, yet its rows still spoke: a correct port (its template's weights left
uninitialised) PASSED with "max abs error inf", a first divergence in layer 0 and a note
that NaN fails the diff; its faulty twin was named in layer 0.

- ``correct``: each layer's weights swapped in whole;
- ``faulty``: layer 3's output LayerNorm given the attention LayerNorm's bias.
"""

from __future__ import annotations

from typing import Any

import adv_bert
import torch
from torch.func import functional_call


class TemplateBert(adv_bert.Bert):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        c = config
        self.template = adv_bert.Block(0, c.hidden_size, c.num_attention_heads,
                                       c.intermediate_size, c.layer_norm_eps)
        self.swapped_wrong: int | None = None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        mask = attention_mask[:, None, None, :].bool()
        x = self.embed(input_ids, token_type_ids)
        for i, block in enumerate(self.blocks):
            weights = dict(block.named_parameters())
            if i == self.swapped_wrong:  # a copy-paste slip in the key of one weight
                weights["norm2.bias"] = weights["norm1.bias"]
            x = functional_call(self.template, weights, (x, mask))
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def correct(reference: Any) -> TemplateBert:
    model = TemplateBert(reference.config)
    template = model.template
    del model.template  # (loaded by the key map, which knows no template)
    adv_bert.load(model, reference)
    template.load_state_dict(model.blocks[0].state_dict())
    model.template = template
    return model.eval()


def faulty(reference: Any) -> TemplateBert:
    model = correct(reference)
    model.swapped_wrong = adv_bert.fault_layer(reference)
    return model
