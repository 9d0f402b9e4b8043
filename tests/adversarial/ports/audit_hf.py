"""Ports built from transformers' own BERT classes, each its own copy (imports only torch
and transformers). Faults sit in layer 1.

- ``*_eager``: ``BertModel`` with ``attn_implementation="eager"`` (the reference runs sdpa);
  the faulty one sets layer 1's activation to ``ACT2FN["gelu_new"]`` (tanh);
- ``*_deepcopy``: ``copy.deepcopy`` of the reference; the faulty one sets layer 1's output
  LayerNorm eps to 1e-3;
- ``*_instance``: layer 1's ``output.forward`` replaced on the instance (a copy's), the
  faulty one scales the result by 1.01;
- ``*_config``: a deep copy of the config with ``hidden_act`` changed ("gelu" kept /
  "gelu_new").
"""

from __future__ import annotations

import copy

from transformers import BertModel
from transformers.activations import ACT2FN


def _fresh(reference, **changes):
    config = copy.deepcopy(reference.config)
    for key, value in changes.items():
        setattr(config, key, value)
    model = BertModel(config, add_pooling_layer=True)
    model.load_state_dict({k: v.detach().clone() for k, v in
                           reference.model.state_dict().items()})
    return model.eval()


def correct_eager(reference):
    return _fresh(reference, _attn_implementation="eager")


def faulty_eager(reference):
    model = _fresh(reference, _attn_implementation="eager")
    model.encoder.layer[1].intermediate.intermediate_act_fn = ACT2FN["gelu_new"]
    return model


def correct_deepcopy(reference):
    return copy.deepcopy(reference.model)


def faulty_deepcopy(reference):
    model = copy.deepcopy(reference.model)
    model.encoder.layer[1].output.LayerNorm.eps = 1e-3
    return model


def _instance(reference, factor):
    model = copy.deepcopy(reference.model)
    output = model.encoder.layer[1].output
    plain = output.forward

    def forward(hidden_states, input_tensor):
        return plain(hidden_states, input_tensor) * factor

    output.forward = forward
    return model


def correct_instance(reference):
    return _instance(reference, 1.0)


def faulty_instance(reference):
    return _instance(reference, 1.01)


def correct_config(reference):
    return _fresh(reference, hidden_act="gelu")


def faulty_config(reference):
    return _fresh(reference, hidden_act="gelu_new")

