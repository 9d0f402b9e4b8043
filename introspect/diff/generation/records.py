"""Records of a diff through generation: one row per decoding step, one per cached tensor.

Imports nothing internal.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepDiff:
    """One row of ``DiffResult.steps``: one forward of greedy decoding, both sides.

    Step 0 is the prefill (the whole prompt, no cache); step k > 0 is the one-token
    forward at position ``position`` with each side's own cache. The token fed at step k
    is the reference's choice at step k - 1 (teacher forcing, when the two choices part).
    """

    step: int
    position: int  # the first position this forward computes (0 for the prefill)
    fed_tokens: int  # tokens fed: the prompt's length at step 0, then 1
    reference_token: int  # the greedy choice from this step's last logits
    candidate_token: int
    tokens_agree: bool
    logits_max_abs_err: float  # the last position's logits, candidate against reference
    passed: bool  # every node and every cached tensor of the step within budget
    first_node: str  # the step's first divergent reference node ("" when none)
    candidate_node: str
    module: str
    layer: str
    op: str
    local_max_abs_err: float | None
    cache: str  # the first cached tensor over budget, e.g. "layer 3 keys" ("" when none)
    hints: tuple[str, ...]  # incremental-decoding hints tested on the values (first failing step)
    reference_text: str = ""  # the chosen tokens, decoded ("" without a tokenizer)
    candidate_text: str = ""


@dataclass(frozen=True)
class CacheDiff:
    """One row of ``DiffResult.caches``: a layer's cached keys or values after a step."""

    step: int
    layer: int
    kind: str  # "keys" or "values"
    reference_shape: str  # "(1, 2, 6, 16)"
    candidate_shape: str
    layout: str  # how the candidate's tensor was read as the reference's, or why it was not
    filled: int  # positions the reference holds after the step
    max_abs_err: float | None  # over the filled positions; None when no layout fits
    passed: bool
    note: str = ""


@dataclass(frozen=True)
class Generated:
    """What each side generated: token ids, and the texts when a tokenizer is known."""

    prompt: tuple[int, ...]
    reference: tuple[int, ...]  # the reference's greedy tokens, one per step
    candidate: tuple[int, ...]  # the candidate's choices (fed the reference's: see StepDiff)
    reference_pieces: tuple[str, ...] = ()  # each token decoded, for the side-by-side texts
    candidate_pieces: tuple[str, ...] = ()
    prompt_text: str = ""

    @property
    def first_parting(self) -> int | None:
        """The first step whose chosen tokens differ, or None."""
        return next((i for i, (r, c) in enumerate(zip(self.reference, self.candidate,
                                                      strict=True)) if r != c), None)


__all__ = ["CacheDiff", "Generated", "StepDiff"]
