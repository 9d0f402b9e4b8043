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


__all__ = ["below", "depth", "within"]
