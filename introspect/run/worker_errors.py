"""What a model's worker threads raise while introspect runs it, kept rather than printed.

A port that computes its heads in ``threading.Thread`` workers runs them inside every call
introspect makes, its fx trace included. Python prints what such a thread raises with a
full traceback (``threading.excepthook``) and the call goes on without it; the user would
read tracebacks beside a verdict. Kept here, the caller decides: a trace that a worker
failed in is no trace, and a plain call that failed gives the thread's error as its cause.
"""

from __future__ import annotations

import contextlib
import threading
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


__all__ = ["said", "worker_errors"]
