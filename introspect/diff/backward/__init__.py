"""Gradient parity: ``introspect.diff(..., backward=True)``, a mode of its own.

Files of one job each, as ``introspect/diff/generation/``:

- ``record``: one forward and backward on a loss, every node's gradient recorded;
- ``losses``: the head's own loss with seeded labels, or a user's ``loss(outputs, inputs)``;
- ``parity``: both sides' gradients compared node by node and per weight, one SGD step
  (``backward_diff``);
- ``measure``: a candidate gradient brought to the reference's layout and measured, from
  stored gradients or as they come;
- ``local``: each aligned pair's own backward, for a failing gradient;
- ``again``: a forward run again, checked the same run, for what a backward let go;
- ``results``: what it returns (``BackwardResult``, its rows);
- ``hints``: known causes of a gradient divergence.
"""

from introspect.diff.backward.parity import (
    FLOOR,
    SGD_LR,
    STATUS_FAIL,
    STATUS_OK,
    BackwardDivergence,
    BackwardResult,
    GradientDiff,
    ParameterGradient,
    backward_diff,
)

__all__ = ["FLOOR", "SGD_LR", "STATUS_FAIL", "STATUS_OK", "BackwardDivergence",
           "BackwardResult", "GradientDiff", "ParameterGradient", "backward_diff"]
