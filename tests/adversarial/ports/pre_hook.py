"""Forward pre-hook: HF's own model (a copy) with a pre-hook on layer N's intermediate
block; the faulty one scales its input by 1.01, the correct one returns None."""

import copy

import adv_bert


def _pre(factor):
    def hook(module, args):
        if factor == 1.0:
            return None
        return (args[0] * factor, *args[1:])
    return hook


def _build(reference, factor):
    model = copy.deepcopy(reference.model).eval()
    layer = model.encoder.layer[adv_bert.fault_layer(reference)]
    layer.intermediate.register_forward_pre_hook(_pre(factor))
    return model


def faulty(reference):
    return _build(reference, 1.01)


def correct(reference):
    return _build(reference, 1.0)
