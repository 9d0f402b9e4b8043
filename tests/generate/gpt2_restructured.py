"""A GPT-2 port whose op sequence changes from decoding step 2 on, for ``diff --generate``
tests of the structure proof (``generation.call_log``'s signature). Imports torch and its
sibling port only.

From the call that starts step 2 (the cache then holds the prompt and one token), the
second block's residual after attention is computed otherwise:

- ``extra-op``: one more op (``x * 1.0``), the same values;
- ``other-target``: ``torch.add(x, attended)`` where it was ``x + attended`` (another
  target at the same place), the same values;
- ``other-wiring``: ``attended + x`` (the same op and target, the inputs swapped), the
  same values (float addition commutes, bit for bit);
- ``wrong-wiring``: ``h + attended`` (the same op and target, one input another node's):
  the bug, from step 2.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.generate.gpt2_concat import GPT2, Cache

CHANGE_AT_LENGTH = 6  # cached positions when step 2 starts (a prompt of 5, then one token)
CHANGED_BLOCK = 1


class RestructuredGPT2(GPT2):
    def __init__(self, hf: torch.nn.Module, variant: str) -> None:
        super().__init__(hf)
        if variant not in ("extra-op", "other-target", "other-wiring", "wrong-wiring"):
            raise ValueError(f"unknown variant {variant!r}")
        self.variant = variant

    def forward(self, input_ids: torch.Tensor, past_key_values: Cache | None = None,
                use_cache: bool = True) -> tuple[torch.Tensor, Cache]:
        T = input_ids.shape[1]
        start = past_key_values[0][0].shape[1] if past_key_values else 0
        changed = start >= CHANGE_AT_LENGTH
        x = self.wte[input_ids] + self.wpe[start:start + T]
        C = x.shape[-1]
        presents: Cache = []
        for i, w in enumerate(self.blocks):
            h = F.layer_norm(x, (C,), w["ln_1_weight"], w["ln_1_bias"], self.eps)
            attended, present = self.attention(w, h, past_key_values[i] if past_key_values
                                               else None)
            presents.append(present)
            x = self._residual(x, h, attended) if changed and i == CHANGED_BLOCK \
                else x + attended
            h = F.layer_norm(x, (C,), w["ln_2_weight"], w["ln_2_bias"], self.eps)
            h = F.gelu(h @ w["mlp_c_fc_weight"] + w["mlp_c_fc_bias"], approximate="tanh")
            x = x + (h @ w["mlp_c_proj_weight"] + w["mlp_c_proj_bias"])
        x = F.layer_norm(x, (C,), self.ln_f_weight, self.ln_f_bias, self.eps)
        return x @ self.wte.t(), presents

    def _residual(self, x: torch.Tensor, h: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        if self.variant == "extra-op":
            return x * 1.0 + attended
        if self.variant == "other-target":
            return torch.add(x, attended)
        if self.variant == "other-wiring":
            return attended + x
        return h + attended  # wrong-wiring
