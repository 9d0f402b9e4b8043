"""The random generators a forward may draw from, taken and put back.

A forward run again from the state its first run began in draws the same numbers: the
backward diff runs a model's forward again for the local backwards of a failing
gradient (``diff.backward.parity.run_again``), and a port with dropout left on must
make the very graph it made the first time.

Example::

    >>> state = RandomState.now()
    >>> first = model(**inputs)
    >>> with random_state_of(state):
    ...     again = model(**inputs)  # the same dropout masks
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class RandomState:
    """The random generators a forward may draw from (torch's on the CPU and on every
    CUDA device in use, Python's, NumPy's), as a forward began: its run again, from the
    same state, draws the same numbers (dropout left on in a port)."""

    cpu: torch.Tensor
    cuda: list[torch.Tensor] | None
    python: Any
    numpy: Any

    @classmethod
    def now(cls) -> RandomState:
        import random
        import sys

        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        numpy = sys.modules.get("numpy")
        return cls(torch.get_rng_state(), cuda, random.getstate(),
                   numpy.random.get_state() if numpy is not None else None)

    def restore(self) -> None:
        import random
        import sys

        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        random.setstate(self.python)
        numpy = sys.modules.get("numpy")
        if numpy is not None and self.numpy is not None:
            numpy.random.set_state(self.numpy)


@contextlib.contextmanager
def random_state_of(state: RandomState | None) -> Iterator[None]:
    """Run with the generators as ``state`` left them, then put back the caller's."""
    if state is None:
        yield
        return
    before = RandomState.now()
    state.restore()
    try:
        yield
    finally:
        before.restore()


__all__ = ["RandomState", "random_state_of"]
