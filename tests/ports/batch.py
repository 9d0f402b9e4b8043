"""The batch every port is checked on: the tutorial's padded pair and a two-segment pair.

Single-segment texts leave the token-type path untested (all ids 0), so a third row holds
two segments; the first row is padded, so masks are exercised.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

TEXTS = ("I love cats!", "He hates pineapple pizza.")
PAIR = ("The cat sat on the mat.", "It was happy.")
NAMES = ("input_ids", "token_type_ids", "attention_mask")


def port_batch(tokenizer) -> dict[str, torch.Tensor]:
    """Three rows padded to one length: the two texts, then the pair as segments A and B."""
    texts = tokenizer(list(TEXTS), padding=True, return_tensors="pt")
    pair = tokenizer([PAIR[0]], [PAIR[1]], return_tensors="pt")
    S = max(texts["input_ids"].shape[1], pair["input_ids"].shape[1])
    return {k: torch.cat([F.pad(texts[k], (0, S - texts[k].shape[1])),
                          F.pad(pair[k], (0, S - pair[k].shape[1]))]) for k in NAMES}
