"""A GPT-2 port that edits one of its weights between two decoding steps, three ways, for
``diff --generate`` tests. Imports torch and its sibling port only.

The edit happens as the call that starts step 2 begins (the cache then holds the prompt
and one token), once:

- ``in-place``: ``weight.add_(...)`` under ``no_grad`` (the same tensor, a new version);
- ``data``: ``weight.data = weight.data + ...`` (the same Parameter, new storage);
- ``data-in-place``: ``weight.data.add_(...)`` (the same storage and version counter: no
  proof short of reading the bytes sees it, but the step's values do);
- ``parameter``: the Parameter swapped for a new one holding edited values.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from tests.generate.gpt2_concat import GPT2

EDIT_AT_LENGTH = 6  # cached positions when step 2 starts (a prompt of 5, then one token)


class EditingGPT2(GPT2):
    def __init__(self, hf: nn.Module, edit: str) -> None:
        super().__init__(hf)
        self.edit = edit
        self.edited = False

    def forward(self, input_ids: torch.Tensor, past_key_values=None, use_cache: bool = True):
        if not self.edited and past_key_values and \
                past_key_values[0][0].shape[1] == EDIT_AT_LENGTH:
            self.edited = True
            self._edit_weight()
        return super().forward(input_ids, past_key_values, use_cache)

    def _edit_weight(self) -> None:
        block = self.blocks[0]
        weight = block["mlp_c_fc_weight"]
        if self.edit == "in-place":
            with torch.no_grad():
                weight.add_(0.05)
        elif self.edit == "data":
            weight.data = weight.data + 0.05
        elif self.edit == "data-in-place":
            weight.data.add_(0.05)
        elif self.edit == "parameter":
            block["mlp_c_fc_weight"] = nn.Parameter(weight.detach() + 0.05)
        else:
            raise ValueError(f"unknown edit {self.edit!r}")
