"""Helper module in another file: layer N calls ``self.ops.activation`` where ``ops`` is a
helper module (helper_exact.py or helper_tanh.py); this file's source is the same."""

import adv_bert
import helper_exact
import helper_tanh


class Block(adv_bert.Block):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ops = helper_exact

    def activation(self, h):
        return self.ops.activation(h)


def _build(reference, ops):
    model = adv_bert.build(reference, Block)
    model.blocks[adv_bert.fault_layer(reference)].ops = ops
    return model


def faulty(reference):
    return _build(reference, helper_tanh)


def correct(reference):
    return _build(reference, helper_exact)
