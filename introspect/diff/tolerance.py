"""Error budgets: how far a candidate's value may be from the reference's and still agree.

A value agrees when ``|cand - ref| <= atol + rtol * |ref|`` element by element, as in
``torch.testing.assert_close``. The defaults depend on the dtype the two values are
compared in (the lower precision of the two); integer and boolean values must be equal.
With ``noise_factor`` set, each node's ``atol`` is raised to that many times the node's
own numerical noise, measured by running the reference in float64 (see
``introspect.diff(..., noise_budget=True)``).

Example::

    >>> Tolerance().budget("bfloat16")
    Budget(atol=1e-05, rtol=0.016)
    >>> Tolerance(atol=1e-4).budget("float32")
    Budget(atol=0.0001, rtol=1.3e-06)
    >>> Tolerance(atol=1e-4).node_budget("float32")
    Budget(atol=1e-05, rtol=1.3e-06)

A user's ``atol``/``rtol`` widen the *outputs'* budget only (``budget``): every node's
budget inside the model follows the noise model (``node_budget``: the dtype's own, raised
to a measured noise). Widening the nodes too would let a fault beside an expected error
pass: an int8 port's advised ``--atol`` once let a tanh GELU outside its Linears through.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from introspect.errors import InputError

# dtype name -> (rtol, atol), as torch.testing.assert_close (shared/DESIGN.md).
DEFAULTS: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float16": (1e-3, 1e-5),
    # A float32 matmul on CUDA under TF32 (introspect.diff.devices): inputs rounded to a
    # 10-bit mantissa (unit roundoff 2^-11), products summed in float32. Calibrated like
    # the others, on correct ports: a TF32 Linear's error, element by element, needed at
    # most atol 1.3e-3 beside rtol 1e-3 (MiniLM; 8e-4 on random-init BERT-base), on the
    # CPU with TF32's rounding applied to each Linear's inputs. About 4x that.
    "tfloat32": (2e-3, 5e-3),
}
# Lower precision first: the dtype two values are compared in is the first of theirs here.
PRECISION_ORDER = ("bfloat16", "float16", "tfloat32", "float32", "float64")


@dataclass(frozen=True)
class Budget:
    """The budget of one node."""

    atol: float
    rtol: float

    def __str__(self) -> str:
        return f"atol {self.atol:.3g} + rtol {self.rtol:.3g} * |ref|"


@dataclass(frozen=True)
class Tolerance:
    """Budgets per dtype, with optional overrides.

    Attributes:
        atol: absolute tolerance for every floating node (default: per dtype).
        rtol: relative tolerance for every floating node (default: per dtype).
        noise_factor: with a float64 noise measurement, a node's atol is at least this
            many times the node's own noise (its local error when the reference runs in
            the candidate's dtype, against the reference in float64).
    """

    atol: float | None = None
    rtol: float | None = None
    noise_factor: float = 4.0

    def __post_init__(self) -> None:
        for name in ("atol", "rtol", "noise_factor"):
            check_tolerance(name, getattr(self, name))

    def budget(self, dtype: str, noise: float | None = None) -> Budget:
        """The budget of an output compared in ``dtype`` ("float32", "int64", ...): the
        user's ``atol``/``rtol`` where given, else the dtype's own."""
        if dtype not in DEFAULTS:  # integers, booleans: exact
            return Budget(0.0, 0.0)
        rtol, atol = DEFAULTS[dtype]
        atol = self.atol if self.atol is not None else atol
        rtol = self.rtol if self.rtol is not None else rtol
        if noise is not None:
            atol = max(atol, self.noise_factor * noise)
        return Budget(atol, rtol)

    def node_budget(self, dtype: str, noise: float | None = None) -> Budget:
        """The budget of a node inside a model compared in ``dtype``: the dtype's own,
        at least ``noise_factor`` times a measured ``noise``; never the user's overrides."""
        return Tolerance(noise_factor=self.noise_factor).budget(dtype, noise)


# An int8 quantized Linear's error, in units of ``quantized.int8_noise`` (the standard
# deviation of its summed rounding errors). Calibrated on correct ``quantize_dynamic`` ports
# of bert-tiny and MiniLM: see INT8_MEASURED below.
INT8_SIGMAS = 8.0


def int8_budget(budget: Budget, noise: float) -> Budget:
    """The budget of a node computed by an int8 quantized Linear whose rounding noise is
    ``noise``: its atol is at least ``INT8_SIGMAS`` times that noise."""
    return Budget(max(budget.atol, INT8_SIGMAS * noise), budget.rtol)


def check_tolerance(name: str, value: object) -> None:
    """Raise ``InputError`` unless ``value`` is None or a finite number >= 0."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{name} must be a number, got {value!r}")
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise InputError(f"{name} must be a finite number >= 0, got {value!r}")


def parse_tolerance(name: str, text: str) -> float:
    """A tolerance from the command line: ``1e-5`` is fine, ``-1``, ``nan`` and ``abc`` are not."""
    try:
        value = float(text)
    except ValueError as e:
        raise InputError(f"{name} must be a number, got {text!r}") from e
    check_tolerance(name, value)
    return value


def compare_dtype(reference: str, candidate: str) -> str:
    """The dtype two values are compared in: the lower precision of the two floats."""
    floats = [d for d in (reference, candidate) if d in DEFAULTS]
    if len(floats) < 2:
        return floats[0] if floats and reference == candidate else (reference or candidate)
    return min(floats, key=PRECISION_ORDER.index)
