"""A pooler whose tanh runs in NumPy, as glue code around a model often does (imports only
torch, NumPy and the sibling ``adv_bert``). ``pooler_output`` is a NumPy array: the
recording cannot see it, the truth runs compare it as returned.

- ``correct``: ``np.tanh`` in float32;
- ``faulty``: a rational approximation of tanh (off by up to ~2e-2 on [-3, 3]).
"""

from __future__ import annotations

import adv_bert
import numpy as np


class NumpyPoolerBert(adv_bert.Bert):
    exact = True

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = super().forward(input_ids, token_type_ids, attention_mask)
        pooled = self.pool(out["last_hidden_state"][:, 0]).detach().numpy()
        if self.exact:
            pooled = np.tanh(pooled)
        else:
            x = np.clip(pooled, -3, 3)
            pooled = x * (27 + x * x) / (27 + 9 * x * x)
        return {"last_hidden_state": out["last_hidden_state"],
                "pooler_output": pooled.astype(np.float32)}


def correct(reference):
    return adv_bert.load(NumpyPoolerBert(reference.config), reference)


def faulty(reference):
    model = adv_bert.load(NumpyPoolerBert(reference.config), reference)
    model.exact = False
    return model
