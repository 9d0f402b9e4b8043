"""Attention maps: what each head of each layer looks at, drawn offline and compared.

``introspect.attention`` is this package and is also callable, so both read naturally::

    >>> maps = introspect.attention(model, inputs)          # AttentionMaps
    >>> maps.probs.shape                                     # (layers, batch, heads, q, k)
    >>> parity = introspect.attention.compare_heads(hf, port, inputs)
    >>> parity.first_divergence                              # (layer, head) or None

Modules, one job each: ``records`` (the maps as data, what every picture reads), ``maps``
(probabilities from the traced graph; ``AttentionMaps`` adds the pictures as methods),
``stats`` (per-head statistics), ``views`` (static pictures: head, matrix and model views),
``svg`` (the SVG text: stable numbers, escaping, colours), ``raster`` (PNG), ``page``
(self-contained HTML), ``heads`` (head-by-head parity of two models).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from introspect.attention.heads import HeadParity, compare_heads
from introspect.attention.maps import AttentionMaps, attention

__all__ = ["AttentionMaps", "HeadParity", "attention", "compare_heads"]


class _CallableModule(types.ModuleType):
    """Lets ``introspect.attention(model, inputs)`` call ``maps.attention``.

    ``introspect.attention`` must be both the function the contract names and this
    package (``introspect.attention.compare_heads``); importing a submodule would
    otherwise replace the function on ``introspect`` with the package.
    """

    def __call__(self, model: Any, inputs: Any, **options: Any) -> AttentionMaps:
        return attention(model, inputs, **options)


sys.modules[__name__].__class__ = _CallableModule
