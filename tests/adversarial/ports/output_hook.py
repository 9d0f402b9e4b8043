"""A hook on the model itself: HF's own model (a copy) with a forward hook on the model
that hands back its ``last_hidden_state`` shifted by 1e-5 (a calibration offset, a debug
nudge left in), under the outputs' budget. Its correct twins' hooks hand back a copy of
it (values unchanged), or it converted there and back, ``* 3 / 3``, which float32 rounds
(code no module judged computed it, and float64 shows it is the same)."""

import copy


def _hook(change):
    def hook(module, args, output):
        output.last_hidden_state = change(output.last_hidden_state)
        return output
    return hook


def _build(reference, change):
    model = copy.deepcopy(reference.model).eval()
    model.register_forward_hook(_hook(change))
    return model


def faulty(reference):
    return _build(reference, lambda hidden: hidden + 1e-5)


def copied(reference):
    return _build(reference, lambda hidden: hidden.clone())


def there_and_back(reference):
    return _build(reference, lambda hidden: hidden * 3.0 / 3.0)
