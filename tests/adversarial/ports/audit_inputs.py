"""Forwards that write to their inputs, other ways than ``truth_inputs`` (imports only torch
and ``adv_bert``).

- ``faulty_view``: writes a token id through a view of ``input_ids``;
- ``faulty_second``: fills ``attention_mask`` with ones from its second call on;
- ``faulty_no_grad``: sets ``token_type_ids`` to 1 in place under ``no_grad`` only;
- ``faulty_types``: ``token_type_ids.zero_()`` on a pair batch (segment B made A);
- ``correct``: shifts ``input_ids`` in place and shifts them back before returning
  (the caller's tensor ends as it began, and the values are right).
"""

from __future__ import annotations

import adv_bert
import torch


class WritingBert(adv_bert.Bert):
    how = "restore"

    def forward(self, input_ids, token_type_ids, attention_mask):
        self.calls = getattr(self, "calls", 0) + 1
        if self.how == "view":
            input_ids.view(-1)[1] = 100
        elif self.how == "second" and self.calls >= 2:
            attention_mask.fill_(1)
        elif self.how == "no_grad" and not torch.is_grad_enabled():
            token_type_ids.fill_(1)
        elif self.how == "types":
            token_type_ids.zero_()
        elif self.how == "restore":
            input_ids.add_(7)
            out = super().forward(input_ids - 7, token_type_ids, attention_mask)
            input_ids.sub_(7)
            return out
        return super().forward(input_ids, token_type_ids, attention_mask)


def _build(reference, how):
    model = adv_bert.load(WritingBert(reference.config), reference)
    model.how = how
    return model


def correct(reference):
    return _build(reference, "restore")


def faulty_view(reference):
    return _build(reference, "view")


def faulty_second(reference):
    return _build(reference, "second")


def faulty_no_grad(reference):
    return _build(reference, "no_grad")


def faulty_types(reference):
    return _build(reference, "types")
