"""Parity through greedy generation: prefill, then every one-token step, node by node.

``introspect.diff(reference, candidate, inputs, generate=N)`` lands here
(``diff_generation``); see ``loop`` for the protocol a model decodes by.
"""

from introspect.diff.generation.loop import diff_generation
from introspect.diff.generation.records import CacheDiff, Generated, StepDiff

__all__ = ["CacheDiff", "Generated", "StepDiff", "diff_generation"]
