"""Numeric bounds of the tests: derived from the noise model, and recorded with their margin.

Two implementations of the same arithmetic round differently (another order of a sum,
another kernel, another CPU), so a test may only hold their difference to what rounding
can do. A sum of ``n`` terms computed in floating point is off from the exact sum by at
most ``n * u * sum(|term|)`` to first order, ``u`` being the unit roundoff of its dtype
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 3.1; the
project's float32 budget, ``introspect.diff.tolerance``, is ``torch.testing``'s: rtol
1.3e-6 ~ 11 u and atol 1e-5). The difference of two such computations is bounded by the
same, up to a factor 2. Hence :func:`rounding_bound`: ``SAFETY * n * u * scale`` with the
longest reduction the values pass through as ``n`` and their largest magnitude as
``scale``. That bound grows with the model and the values, never with one CPU's luck; it
is a worst case, which the measured errors sit orders of magnitude under (rounding errors
mostly cancel: the typical error grows like ``sqrt(n) * u``).

An element's *relative* error has no such bound: an element that is the small difference
of large terms (cancellation) carries the terms' absolute error, which may be any multiple
of its own size. Bounds are therefore stated against the values' scale, as the library's
budgets (atol) and its drift limits do.

Every bound a test asserts through :func:`below`, :func:`above` or :func:`close` is also
recorded, with its margin (how far the measured value is from the bound, as a factor),
when ``INTROSPECT_BOUND_LOG`` names a file: ``scripts/bound_margins.py`` runs the tests
that way and prints the table, so a bound tuned to one machine (margin ~1) shows.
"""

from __future__ import annotations

import json
import math
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: the ONNX tests import it late
    import torch

# Unit roundoff: half the distance from 1 to the next representable number.
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11,
                 "bfloat16": 2.0**-8}
# The worst case n * u is for one reduction; a value has gone through a chain of them (a
# layer's forward and backward are about ten reductions deep, each adding its own rounding,
# and the difference of two computations can be twice either's error).
SAFETY = 10.0
LOG = "INTROSPECT_BOUND_LOG"


def rounding_bound(dtype: str, reduction: int, scale: float, safety: float = SAFETY) -> float:
    """What rounding can move a value of magnitude ``scale`` computed through reductions
    of at most ``reduction`` terms in ``dtype``: ``safety * reduction * u * scale``.

    >>> f"{rounding_bound('float64', 30522, 1.0):.2e}"
    '3.39e-11'
    """
    return safety * reduction * UNIT_ROUNDOFF[dtype] * scale


def longest_reduction(config, tokens: int) -> int:
    """The longest sum in a BERT-like model's forward and backward: over the vocabulary
    (the MLM head's softmax, and the logits' gradient into the hidden states), the
    intermediate or hidden size (matmuls), or the tokens (a weight's gradient)."""
    sizes = [getattr(config, name, None) for name in
             ("vocab_size", "intermediate_size", "hidden_size")]
    return max([tokens, *(s for s in sizes if s)])


def below(measured: float | torch.Tensor, bound: float, what: str = "") -> bool:
    """``measured < bound``, recorded with its margin ``bound / measured``."""
    measured = float(measured)  # a 0-d tensor or a numpy float too
    _record(what, f"< {bound:.3g}", measured, bound / measured if measured else math.inf)
    return measured < bound


def above(measured: float | torch.Tensor, floor: float, what: str = "") -> bool:
    """``measured > floor`` (a fault is visible), recorded with its margin ``measured / floor``."""
    measured = float(measured)
    _record(what, f"> {floor:.3g}", measured, measured / floor if floor else math.inf)
    return measured > floor


def close(actual: torch.Tensor, expected: torch.Tensor, *, rtol: float, atol: float,
          what: str = "") -> bool:
    """``torch.allclose(actual, expected, rtol, atol)``, recorded with its margin: the
    budget ``atol + rtol * |expected|`` over the error, at the element nearest its budget."""
    import torch

    actual, expected = actual.double(), expected.double()
    err = (actual - expected).abs()
    used = float((err / (atol + rtol * expected.abs())).max()) if err.numel() else 0.0
    _record(what, f"atol {atol:.3g} + rtol {rtol:.3g}*|ref|", float(err.max()) if err.numel()
            else 0.0, 1 / used if used else math.inf)
    return torch.allclose(actual, expected, rtol=rtol, atol=atol)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, rtol: float, atol: float,
                 what: str = "", **kwargs) -> None:
    """``torch.testing.assert_close`` with :func:`close`'s record of the margin."""
    import torch

    close(actual, expected, rtol=rtol, atol=atol, what=what)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, **kwargs)


def _record(what: str, bound: str, measured: float, margin: float) -> None:
    path = os.environ.get(LOG)
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
    with open(path, "a", encoding="utf-8") as f:  # one line per bound: appends never interleave
        f.write(json.dumps({"test": test, "what": what, "bound": bound,
                            "measured": measured, "margin": margin}) + "\n")
