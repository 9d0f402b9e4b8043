"""The first divergence as the hypotheses see it. Imports nothing internal."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DivergenceContext:
    """The first divergent pair of a diff, with the models and inputs to re-run it."""

    reference_model: torch.nn.Module  # the reference as given to diff, in eval mode
    candidate_model: torch.nn.Module | None  # None for a dump: only its values are at hand
    inputs: Mapping[str, torch.Tensor]  # the reference's inputs (input_ids, token_type_ids, ...)
    reference_node: str  # the first divergent node in the reference's fx graph
    candidate_node: str  # its pair in the candidate's graph ("" if none)
    module: str  # reference module path, e.g. "bert.encoder.layer.2.attention.self"
    layer: str  # "embeddings", "encoder.layer.N", "pooler", or the head's name
    reference_value: torch.Tensor  # the reference node's output
    candidate_value: torch.Tensor  # the candidate's value at that pair, in the reference's layout
    atol: float
    rtol: float
    # the candidate's own calls (its truth runs, fresh random draws each) returned the same
    # outputs bit for bit: two more runs of it would show no dropout (``_dropout``)
    repeatable: bool = False
    # the reference module whose values the candidate's value was computed from alone:
    # the candidate's smallest failing module run on the reference's values at its
    # inputs, none of its own (``ops.inside``); "": the whole models'
    scope: str = ""
