"""Ports that return their outputs other ways than HF's ``ModelOutput`` (imports only torch,
NumPy and ``adv_bert``). Each faulty twin takes the tanh GELU in layer 1, unless said.

- ``*_tuple``: ``(last_hidden_state, pooler_output)``;
- ``*_renamed``: a dict with other names (``hidden``, ``pooled``);
- ``*_list``: a Python list of tensors;
- ``*_numpy_mid``: layer 1's GELU runs in NumPy (tensor -> ndarray -> tensor); the faulty
  one computes the tanh approximation there;
- ``*_extra``: extra outputs besides the two: every layer's hidden state and a Python
  float (``.item()``);
- ``*_float64``: the whole port in float64;
- ``*_half_output``: computed in float32, the outputs returned in float16;
- ``*_dataclass``: a ``@dataclass`` of the two (``Encoded``), read field by field; its
  backward takes the loss of its first field, as of a dict's first value.
"""

from __future__ import annotations

import dataclasses
import math

import adv_bert
import numpy as np
import torch
import torch.nn.functional as F


class TanhBlock(adv_bert.Block):
    tanh = False

    def activation(self, h):
        return F.gelu(h, approximate="tanh" if self.tanh and self.index == 1 else "none")


@dataclasses.dataclass
class Encoded:
    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor


class ShapedBert(adv_bert.Bert):
    shape = "tuple"

    def forward(self, input_ids, token_type_ids, attention_mask):
        mask = attention_mask[:, None, None, :].bool()
        x = self.embed(input_ids, token_type_ids)
        states = [x]
        for block in self.blocks:
            x = block(x, mask)
            states.append(x)
        pooled = torch.tanh(self.pool(x[:, 0]))
        if self.shape == "tuple":
            return x, pooled
        if self.shape == "renamed":
            return {"hidden": x, "pooled": pooled}
        if self.shape == "list":
            return [x, pooled]
        if self.shape == "dataclass":
            return Encoded(x, pooled)
        if self.shape == "extra":
            return {"last_hidden_state": x, "pooler_output": pooled, "hidden_states": states,
                    "mean": x.mean().item()}
        return {"last_hidden_state": x.half(), "pooler_output": pooled.half()}


def _shaped(reference, shape, tanh, dtype=torch.float32):
    model = adv_bert.load(ShapedBert(reference.config, TanhBlock), reference)
    model.shape = shape
    for block in model.blocks:
        block.tanh = tanh
    return model.to(dtype)


def correct_tuple(reference):
    return _shaped(reference, "tuple", False)


def faulty_tuple(reference):
    return _shaped(reference, "tuple", True)


def correct_renamed(reference):
    return _shaped(reference, "renamed", False)


def faulty_renamed(reference):
    return _shaped(reference, "renamed", True)


def correct_list(reference):
    return _shaped(reference, "list", False)


def faulty_list(reference):
    return _shaped(reference, "list", True)


def correct_extra(reference):
    return _shaped(reference, "extra", False)


def faulty_extra(reference):
    return _shaped(reference, "extra", True)


def correct_dataclass(reference):
    return _shaped(reference, "dataclass", False)


def faulty_dataclass(reference):
    return _shaped(reference, "dataclass", True)


def correct_float64(reference):
    return _shaped(reference, "tuple", False, torch.float64)


def faulty_float64(reference):
    return _shaped(reference, "tuple", True, torch.float64)


def correct_half_output(reference):
    return _shaped(reference, "half", False)


def faulty_half_output(reference):
    return _shaped(reference, "half", True)


_erf = np.vectorize(math.erf, otypes=[np.float64])


class NumpyGeluBlock(adv_bert.Block):
    tanh = False

    def activation(self, h):
        if self.index != 1:
            return F.gelu(h)
        x = h.detach().numpy().astype(np.float64)
        if self.tanh:
            y = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
        else:
            y = 0.5 * x * (1 + _erf(x / math.sqrt(2)))
        return torch.from_numpy(y.astype(np.float32))


def correct_numpy_mid(reference):
    return adv_bert.build(reference, NumpyGeluBlock)


def faulty_numpy_mid(reference):
    model = adv_bert.build(reference, NumpyGeluBlock)
    for block in model.blocks:
        block.tanh = True
    return model
