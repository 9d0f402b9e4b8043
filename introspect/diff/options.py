"""The options of ``introspect.diff``, grouped by the one thing each group decides.

``diff()`` takes them as keyword arguments (its docstring says what each means) and groups
them here at its first line, so that each step of the flow (``introspect.diff.flow``) reads
the group it needs: how far apart values may be (``Budgets``), what is compared
(``Mode``), where the models run (``Devices``), and what the tables hold and how they name
the two sides (``Tables``). Imports nothing internal at run time.

Example::

    >>> options = DiffOptions(budgets=Budgets(atol=1e-4), tables=Tables(nodes=False))
    >>> options.budgets.atol, options.mode.generate, options.tables.nodes
    (0.0001, 0, False)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from introspect.diff.ops.eager import Recording


@dataclass(frozen=True)
class Budgets:
    """How far apart the two models' values may be."""

    atol: float | None = None  # widens the outputs' budget; None: per dtype (tolerance.py)
    rtol: float | None = None  # the same, relative to the reference's value
    noise_budget: bool = False  # each node's budget from its own noise (reference in float64)
    noise_factor: float = 4.0  # that budget: this many times the node's noise
    allow_nonfinite: bool = False  # NaN or Inf in a compared value: a note, not a failure


@dataclass(frozen=True)
class Mode:
    """What is compared: one forward (the default), a generation, gradients, or ranks."""

    generate: int = 0  # tokens decoded greedily, each compared (``diff.generation``); 0: none
    tokenizer: Any = None  # decodes the generated tokens for the reports (generate only)
    backward: bool = False  # gradients compared too (``diff.backward``)
    loss: Any = None  # with backward: loss(outputs, inputs) -> scalar; None: the head's own
    # each model's other forward keywords (reference's, candidate's): a generation step's
    # cache; with them the plain calls are the loop's, not the diff's
    forward_keywords: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None
    recordings: tuple[Recording, Recording] | None = None  # each side recorded already
    nproc: int | None = None  # the candidate on this many ranks (``diff.parallel``)


@dataclass(frozen=True)
class Devices:
    """Where the models run (``introspect.diff.devices``); None: where they are."""

    device: Any = None  # both models
    candidate_device: Any = None  # the candidate alone; values meet on the reference's


@dataclass(frozen=True)
class Tables:
    """What the tables hold, and how they pair and name the two sides."""

    nodes: bool = True  # node tables on every verdict; False: none for a PASS proven without
    name_map: Mapping[str, str] | None = None  # candidate name or prefix -> reference's
    reference_label: str = ""  # "": the reference's class name
    candidate_label: str = ""  # "": the candidate's class name (or its Deferred label)


@dataclass(frozen=True)
class DiffOptions:
    """Every option of one ``diff()``, in its groups."""

    budgets: Budgets = field(default_factory=Budgets)
    mode: Mode = field(default_factory=Mode)
    devices: Devices = field(default_factory=Devices)
    tables: Tables = field(default_factory=Tables)


__all__ = ["Budgets", "Devices", "DiffOptions", "Mode", "Tables"]
