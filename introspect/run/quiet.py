"""What introspect's own calls of a model would print, kept quiet: what its worker threads
raise, and the warning reentrant checkpoints give a call that needs no gradient.

A port that computes its heads in ``threading.Thread`` workers runs them inside every call
introspect makes, its fx trace included. Python prints what such a thread raises with a
full traceback (``threading.excepthook``) and the call goes on without it; the user would
read tracebacks beside a verdict. Kept here, the caller decides: a trace that a worker
failed in is no trace, and a plain call that failed gives the thread's error as its cause.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def worker_errors(found: list[Any]) -> Iterator[None]:
    """Each ``threading.ExceptHookArgs`` raised in a thread meanwhile, appended to ``found``."""
    before = threading.excepthook
    threading.excepthook = found.append
    try:
        yield
    finally:
        threading.excepthook = before


def said(error: Any) -> str:
    """A worker thread's error (``threading.ExceptHookArgs``) in one line."""
    return f"{error.exc_type.__name__}: {' '.join(str(error.exc_value).split())}"


# ``torch.utils.checkpoint(use_reentrant=True)`` warns on every call where none of its
# inputs requires a gradient: under ``no_grad``, in a trace, or a module run on the
# reference's values: calls introspect makes, not the user's training (a region the user's
# own backward hands no gradient is named there, with a hint:
# ``backward.hints.autograd_off_hint``)
_CHECKPOINT_WARNING = r"None of the inputs have requires_grad=True"


@contextlib.contextmanager
def checkpoint_warning_quiet() -> Iterator[None]:
    """Reentrant checkpoints' "None of the inputs have requires_grad=True" left unprinted."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_CHECKPOINT_WARNING, category=UserWarning)
        yield


__all__ = ["checkpoint_warning_quiet", "said", "worker_errors"]
