"""A candidate built only once the reference's truth has been taken.

A port's file runs code when it is imported and when its ``build()`` is called: it can
patch ``torch.Tensor.softmax``, register a kernel, enter ``torch.autocast`` and never
leave, or change a module global that the reference reads too. Whatever the candidate
does then, the reference's truth runs and its recording, taken before, saw none of it
(shared/DESIGN.md, "The reference is taken clean"). ``introspect.diff`` builds a
``Deferred`` candidate at that moment, and checks the reference once more afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Deferred:
    """A candidate model to be built later: ``build()`` returns the ``nn.Module``.

    Example::

        >>> candidate = Deferred(lambda: build_port(spec, ...), label="port.py:build")
        >>> introspect.diff(reference, candidate, inputs)   # built after the reference ran
    """

    def __init__(self, build: Callable[[], Any], label: str = "") -> None:
        self._build = build
        self.label = label
        self.model: Any = None  # the built module, once built

    def build(self) -> Any:
        """Build the candidate once; later calls return the same module."""
        if self.model is None:
            self.model = self._build()
        return self.model


__all__ = ["Deferred"]
