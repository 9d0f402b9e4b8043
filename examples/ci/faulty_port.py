"""my_port.py with a classic porting bug: layer 3's GELU is the tanh approximation.

The README's failing diff (``introspect diff --candidate examples/ci/faulty_port.py:build``)
runs this file; it imports the port next to it by path, so it works from any folder.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from torch import nn

_spec = importlib.util.spec_from_file_location("my_port", Path(__file__).with_name("my_port.py"))
assert _spec is not None and _spec.loader is not None
my_port = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(my_port)

FAULTY_LAYER = 3


def build(reference: Any) -> nn.Module:
    """The correct port, then the bug: ``approximate="tanh"`` in one layer's feed-forward."""
    model = my_port.build(reference)
    layer = min(FAULTY_LAYER, len(model.blocks) - 1)  # bert-tiny has 2 layers
    model.blocks[layer].act = nn.GELU(approximate="tanh").eval()
    return model
