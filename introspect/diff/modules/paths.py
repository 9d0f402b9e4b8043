"""Module paths one inside another ("" is the model itself, holding every module)."""

from __future__ import annotations


def within(name: str, outer: str) -> bool:
    """Module ``name`` is ``outer`` or inside it."""
    return not outer or name == outer or name.startswith(f"{outer}.")


def below(name: str, outer: str) -> bool:
    """Module ``name`` is inside ``outer``, not ``outer`` itself."""
    return name != outer and within(name, outer)


def depth(name: str) -> int:
    """How many modules deep ``name`` is (the model itself: 0)."""
    return name.count(".") + 1 if name else 0


def layer_at(module: str, layer: str) -> int | None:
    """Where ``layer``'s parts begin among ``module``'s; None where it is none of its."""
    parts, inner = module.split("."), layer.split(".")
    return next((start for start in range(len(parts) - len(inner) + 1)
                 if parts[start:start + len(inner)] == inner), None)


def moved_to(module: str, layer: str, other: str) -> str:
    """``module``, a module of ``layer`` (``transformer.h.1.ln_2`` of ``h.1``), as the same
    module of layer ``other``; ``other`` itself where it is none of ``layer``'s."""
    at = layer_at(module, layer)
    if at is None:
        return other
    parts = module.split(".")
    return ".".join(parts[:at] + other.split(".") + parts[at + len(layer.split(".")):])


__all__ = ["below", "depth", "layer_at", "moved_to", "within"]
