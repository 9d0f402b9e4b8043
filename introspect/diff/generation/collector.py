"""The garbage collector's passes kept to what a generation allocates.

Each one-token step keeps every value of both models' steps until the next one: tens
of thousands of objects that outlive the collector's young generations, so every few
steps it runs a full pass, over every object of the process (torch's, transformers',
the models'): some 0.2 s each for GPT-2 in a plain Python process, a fifth of a
64-step diff. The objects alive when the generation starts are set aside
(``gc.freeze``) for its duration: the full passes read only what the generation made,
and what it made and dropped is collected as before. A process that froze objects of
its own, or turned the collector off, is left as it is.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def older_objects_set_aside() -> Iterator[None]:
    """Leave the objects alive now out of the collector's passes until the block ends
    (garbage among them is collected by the first full pass after it)."""
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


__all__ = ["older_objects_set_aside"]
