"""A port holding every weight in one flat Parameter (imports torch only): each weight a
view of a slice of it, the computation the reference's own, run by
``torch.func.functional_call`` on a skeleton that is not a submodule. ``build(reference,
cut=None)``: ``cut`` names a weight whose view is taken from ``.data``, so no gradient
reaches it (a training bug node gradients cannot show)."""

from __future__ import annotations

import copy

import torch
from torch import nn


class FlatPort(nn.Module):
    def __init__(self, reference: nn.Module, cut: str | None = None) -> None:
        super().__init__()
        named = dict(reference.named_parameters())
        self.flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in named.values()]))
        self.layout = [(name, tuple(p.shape)) for name, p in named.items()]
        self.cut = cut
        self.__dict__["skeleton"] = copy.deepcopy(reference).eval()  # not a submodule

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        views, start = {}, 0
        source = self.flat
        for name, shape in self.layout:
            size = 1
            for n in shape:
                size *= n
            piece = (source.data if name == self.cut else source)[start:start + size]
            views[name] = piece.view(shape)
            start += size
        out = torch.func.functional_call(self.skeleton, views, (), dict(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask))
        return {"last_hidden_state": out.last_hidden_state, "pooler_output": out.pooler_output}


def build(reference: nn.Module, cut: str | None = None) -> nn.Module:
    return FlatPort(reference, cut).eval()
