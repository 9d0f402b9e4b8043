"""Builders that change the reference they are given, each in one way (and one that only reads)."""

from __future__ import annotations

import copy
import functools
import importlib.util
from pathlib import Path
from typing import Any

import torch

_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "ci" / "my_port.py"
_spec = importlib.util.spec_from_file_location("_harms_my_port", _EXAMPLE)
my_port = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(my_port)


def query(reference: Any) -> torch.nn.Linear:
    return reference.model.encoder.layer[0].attention.self.query


def only_reads(reference: Any) -> torch.nn.Module:
    """Reads weights, deep-copies, runs the reference: changes nothing."""
    copy.deepcopy(reference.model)
    ids = torch.tensor([[101, 2000, 102]])
    with torch.no_grad():
        reference.model(input_ids=ids, attention_mask=torch.ones_like(ids))
    reference.model.eval()
    return my_port.build(reference)


def scales_a_weight(reference: Any) -> torch.nn.Module:
    with torch.no_grad():
        query(reference).weight.mul_(1.0001)
    return my_port.build(reference)


def nudges_one_element(reference: Any) -> torch.nn.Module:
    weight = reference.model.encoder.layer[1].output.dense.weight
    with torch.no_grad():  # the next float up: one bit
        weight[3, 5] = torch.nextafter(weight[3, 5], torch.tensor(float("inf")))
    return my_port.build(reference)


def changes_a_buffer(reference: Any) -> torch.nn.Module:
    reference.model.embeddings.position_ids[0, 1] = 0
    return my_port.build(reference)


def replaces_a_module(reference: Any) -> torch.nn.Module:
    layer = reference.model.encoder.layer[1]
    layer.intermediate = copy.deepcopy(layer.intermediate)  # same values, another object
    return my_port.build(reference)


def adds_a_hook(reference: Any) -> torch.nn.Module:
    reference.model.encoder.layer[0].output.register_forward_hook(lambda m, i, o: o * 1.01)
    return my_port.build(reference)


def adds_a_pre_hook(reference: Any) -> torch.nn.Module:
    reference.model.encoder.layer[0].register_forward_pre_hook(lambda m, args: None)
    return my_port.build(reference)


def swaps_a_forward(reference: Any) -> torch.nn.Module:
    dense = reference.model.encoder.layer[0].intermediate.dense
    dense.forward = functools.partial(type(dense).forward, dense)  # computes the same
    return my_port.build(reference)


def patches_a_class(reference: Any) -> torch.nn.Module:
    intermediate = type(reference.model.encoder.layer[0].intermediate)
    original = intermediate.forward
    intermediate.forward = lambda self, x: original(self, x) * 1.01
    return my_port.build(reference)


def adds_a_global_hook(reference: Any) -> torch.nn.Module:
    torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    return my_port.build(reference)


def changes_eps(reference: Any) -> torch.nn.Module:
    reference.model.embeddings.LayerNorm.eps = 1e-5
    return my_port.build(reference)


def changes_the_config(reference: Any) -> torch.nn.Module:
    reference.config.output_hidden_states = True
    return my_port.build(reference)


def trains_the_reference(reference: Any) -> torch.nn.Module:
    reference.model.train()
    return my_port.build(reference)


def casts_the_reference(reference: Any) -> torch.nn.Module:
    reference.model.double()
    return my_port.build(reference)


def shares_a_weight(reference: Any) -> torch.nn.Module:
    """Correct, but holds the reference's own Parameter: casting it casts the reference."""
    model = my_port.build(reference)
    model.blocks[0].q.weight = query(reference).weight
    return model


class _Meddling(torch.nn.Module):
    def __init__(self, port: torch.nn.Module, weight: torch.nn.Parameter) -> None:
        super().__init__()
        self.port = port
        self.weight = [weight]  # not a submodule: only the forward knows it

    def forward(self, **inputs: torch.Tensor) -> Any:
        with torch.no_grad():
            self.weight[0].mul_(1.0001)
        return self.port(**inputs)


def forward_changes_the_reference(reference: Any) -> torch.nn.Module:
    return _Meddling(my_port.build(reference), query(reference).weight)
