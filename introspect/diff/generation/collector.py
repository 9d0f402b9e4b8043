"""The garbage collector's passes kept to what a generation allocates.

Each one-token step keeps every value of both models' steps until the next one: tens
of thousands of objects that outlive the collector's young generations, so every few
steps it runs a full pass, over every object of the process (torch's, transformers',
the models'): some 0.2 s each for GPT-2 in a plain Python process, a fifth of a
64-step diff. The objects alive when the generation starts are set aside
(``gc.freeze``) for its duration: the full passes read only what the generation made,
and what it made and dropped is collected as before. The young generation's threshold
is raised for its duration too (700 allocations to ``YOUNG_THRESHOLD``): a step
allocates tens of thousands of objects that live as long as the step, and each young
pass moves them along again (a 64-step diff ran some 2,000 passes; about 190 after).
A process that froze objects of its own, or turned the collector off, is left as it is.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

YOUNG_THRESHOLD = 5000  # allocations between two young passes while generating (700 by default)


@contextlib.contextmanager
def older_objects_set_aside() -> Iterator[None]:
    """Leave the objects alive now out of the collector's passes until the block ends
    (garbage among them is collected by the first full pass after it), and make young
    passes rarer (``YOUNG_THRESHOLD``); the thresholds are put back as they were."""
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(thresholds[0], YOUNG_THRESHOLD), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


__all__ = ["YOUNG_THRESHOLD", "older_objects_set_aside"]
