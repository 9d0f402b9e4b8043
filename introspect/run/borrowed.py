"""Which of the reference's own modules a candidate runs.

A port that returns the reference's outputs (``build`` returns a wrapper around the HF
model, or its forward calls the model it was handed) agrees with the reference by
construction: that part is compared with itself, and a PASS there proves nothing. Such a
port is legal, and partial reuse is common (a port that keeps HF's embeddings while it
writes the encoder), so this is a note, never a verdict.

The modules are seen with a *global* forward pre-hook while the candidate is recorded: a
global hook leaves PyTorch's fast paths on (``introspect.run.boundaries``), and the
recording, not a truth run, is where it is installed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_NAMED = 3  # module names in the note; "and N more" after


@contextlib.contextmanager
def reference_modules_run(reference: torch.nn.Module) -> Iterator[list[str]]:
    """Collects, in call order, the names of the reference's modules that run inside."""
    names = {id(module): name for name, module in reference.named_modules()}
    seen: dict[str, None] = {}

    def pre_hook(module: torch.nn.Module, args: Any) -> None:
        name = names.get(id(module))
        if name is not None:
            seen[name] = None

    handle = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
    found: list[str] = []
    try:
        yield found
    finally:
        handle.remove()
        found.extend(seen)


def borrowed_note(names: list[str], reference_label: str) -> str | None:
    """One line for the notes, or None when the candidate ran none of the reference's modules."""
    if not names:
        return None
    if "" in names:
        return (f"the candidate runs the reference itself ({reference_label}): it is compared "
                "with itself, and parity proves nothing about a port")
    tops = [n for n in names if not any(n.startswith(other + ".") for other in names)]
    shown = ", ".join(tops[:_NAMED]) + (f" and {len(tops) - _NAMED} more"
                                         if len(tops) > _NAMED else "")
    return (f"the candidate runs {len(tops)} of the reference's own modules ({shown}): "
            "those parts are compared with themselves")


__all__ = ["borrowed_note", "reference_modules_run"]
