"""Forwards that change their inputs in place (imports only torch and ``adv_bert``).

- ``faulty_mask``: ``attention_mask.fill_(1)`` (every padded position made real);
- ``faulty_ids``: ``input_ids.clamp_(max=1000)`` (rare tokens folded onto one id);
- ``correct``: copies its mask first, then edits the copy (``x.clone().mul_(1)``): the
  caller's tensors stay as they were and the values are right.
"""

from __future__ import annotations

import adv_bert


class EditingBert(adv_bert.Bert):
    edit = "copy"

    def forward(self, input_ids, token_type_ids, attention_mask):
        if self.edit == "mask":
            attention_mask.fill_(1)
        elif self.edit == "ids":
            input_ids.clamp_(max=1000)
        else:
            attention_mask = attention_mask.clone().mul_(1)
        return super().forward(input_ids, token_type_ids, attention_mask)


def _build(reference, edit):
    model = adv_bert.load(EditingBert(reference.config), reference)
    model.edit = edit
    return model


def correct(reference):
    return _build(reference, "copy")


def faulty_mask(reference):
    return _build(reference, "mask")


def faulty_ids(reference):
    return _build(reference, "ids")
