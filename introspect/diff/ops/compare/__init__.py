"""Run two aligned graphs side by side and measure every pair, keeping summaries only.

Files of one job each, in the order a pair meets them:

- ``replay``: both graphs in lock-step, propagated and local values, what each pair is
  measured on (``run_side_by_side``);
- ``axes``: which axes of each reference value are the batch and the tokens (``TokenAxes``);
- ``padding``: the mask of padded positions on those axes (``Padding``);
- ``layouts``: a candidate value reshaped, permuted, reordered or narrowed onto its
  reference (``fit_layouts``, ``fit_layout``);
- ``stats``: the errors of one pair against its budget (``measure``);
- ``records``: what a run returns (``RunResult``, ``Snapshot``).
"""

from introspect.diff.ops.compare.axes import TokenAxes
from introspect.diff.ops.compare.layouts import fit_layout, fit_layouts
from introspect.diff.ops.compare.padding import Padding
from introspect.diff.ops.compare.records import RunResult, Snapshot
from introspect.diff.ops.compare.replay import run_side_by_side
from introspect.diff.ops.compare.stats import measure

__all__ = ["Padding", "RunResult", "Snapshot", "TokenAxes", "fit_layout", "fit_layouts", "measure",
           "run_side_by_side"]
