"""pytest helpers: assert that a port agrees with its reference, node by node.

Example::

    from introspect.testing import assert_parity

    def test_my_port_matches_hf(hf_model, inputs):
        assert_parity(hf_model, MyBert.from_hf(hf_model), inputs)

On failure the message names the first divergent node, the hints, and the per-layer
table::

    AssertionError: parity fails: first divergence at encoder_layer_1_intermediate_dense
    (Linear in encoder.layer.1.intermediate.dense), local max abs error 0.05 ...
      hint: weight encoder.layer.1.intermediate.dense.bias differs from ...
    layer              max_abs_err   local_max nodes fail  status worst node
    ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from introspect.diff.api import diff
from introspect.diff.records import error_words
from introspect.diff.result import DiffResult
from introspect.models.load import TokenizedInputs


def assert_parity(reference: torch.nn.Module, candidate: torch.nn.Module,
                  inputs: TokenizedInputs | Mapping[str, torch.Tensor], **options: Any,
                  ) -> DiffResult:
    """Diff ``candidate`` against ``reference`` and fail unless parity holds.

    Args:
        reference, candidate, inputs: as ``introspect.diff``.
        **options: passed to ``introspect.diff`` (``atol``, ``rtol``, ``noise_budget``,
            ``name_map``, ...).

    Returns:
        The ``DiffResult``, for further checks.

    Raises:
        AssertionError: a node's local error is over budget; the message holds the
            first divergence, its hints and the per-layer table.
    """
    __tracebackhide__ = True  # pytest shows the assertion, not this helper's frames
    result = diff(reference, candidate, inputs, **options)
    if not result.passed:
        d = result.first_divergence
        lines = ["parity fails"]
        if d is not None:
            lines[0] += (f": first divergence at {d.reference_node} ({d.op} in "
                         f"{d.module or d.layer}), candidate node {d.candidate_node}, "
                         f"{error_words(d)} {d.local_max_abs_err:.3g} over budget "
                         f"{d.budget}")
            lines += [f"  hint: {h}" for h in d.hints]
        lines += ["", result.layer_table()]
        raise AssertionError("\n".join(lines))
    return result


__all__ = ["assert_parity"]
