"""Forward hook: HF's own model (a copy) with a hook on layer N; the faulty hook scales
the layer's output by 1.01 (activation steering), the correct one only observes."""

import copy

import adv_bert


def _scale(factor):
    def hook(module, args, output):
        if factor == 1.0:
            return None  # an observer
        if isinstance(output, tuple):
            return (output[0] * factor, *output[1:])
        return output * factor
    return hook


def _build(reference, factor):
    model = copy.deepcopy(reference.model).eval()
    model.encoder.layer[adv_bert.fault_layer(reference)].register_forward_hook(_scale(factor))
    return model


def faulty(reference):
    return _build(reference, 1.01)


def correct(reference):
    return _build(reference, 1.0)
