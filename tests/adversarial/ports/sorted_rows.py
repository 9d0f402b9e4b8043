"""BERT that sorts its batch rows by length, longest first, and puts them back at the
end (imports only torch and ``adv_bert``; probe round q): packing code does this.

With three rows in the order [1, 0, 2], the token-type embeddings of two rows are alike
(one segment pattern over their real tokens), so their rows named no order of their own:
a correct port FAILED at the token-type embedding (max abs error 37 over the nodes), and
every attention head was said to be over its budget.

- ``correct``: BERT's arithmetic, rows sorted and back;
- ``faulty``: the same, layer 3's output LayerNorm with eps 1e-5.
"""

from __future__ import annotations

from typing import Any

import adv_bert
import torch

# (the texts its test passes: rows of 8, 9 and 7 tokens, sorted [1, 0, 2])


class SortedRows(adv_bert.Bert):
    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        order = attention_mask.sum(1).argsort(descending=True, stable=True)
        back = order.argsort()
        out = super().forward(input_ids[order], token_type_ids[order], attention_mask[order])
        return {name: value[back] for name, value in out.items()}


def correct(reference: Any) -> SortedRows:
    return adv_bert.load(SortedRows(reference.config), reference)


def faulty(reference: Any) -> SortedRows:
    model = correct(reference)
    model.blocks[adv_bert.fault_layer(reference)].norm2.eps = 1e-5
    return model
