"""The example port with the activation its sibling helpers.py makes (folder b)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from helpers import make_act

FOLDER = "b"
_EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "ci" / "my_port.py"
_spec = importlib.util.spec_from_file_location("_b_my_port", _EXAMPLE)
my_port = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(my_port)


def build(reference: Any) -> Any:
    model = my_port.build(reference)
    for block in model.blocks:
        block.act = make_act()
    return model
