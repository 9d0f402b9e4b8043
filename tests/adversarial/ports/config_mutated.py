"""Config object mutated after construction: each layer keeps its own config object and
forward reads ``self.cfg.hidden_act``; the builder changes layer N's after building."""

import dataclasses

import adv_bert
import torch.nn.functional as F

ACT = {"gelu": F.gelu, "gelu_tanh": lambda h: F.gelu(h, approximate="tanh")}


@dataclasses.dataclass
class LayerConfig:
    hidden_act: str = "gelu"


class Block(adv_bert.Block):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cfg = LayerConfig()

    def activation(self, h):
        return ACT[self.cfg.hidden_act](h)


def _build(reference, act):
    model = adv_bert.build(reference, Block)
    model.blocks[adv_bert.fault_layer(reference)].cfg.hidden_act = act  # after construction
    return model


def faulty(reference):
    return _build(reference, "gelu_tanh")


def correct(reference):
    return _build(reference, "gelu")
