"""Hints for a first divergence, each found by testing a hypothesis on the values.

For the block of an HF BERT-like reference that holds the divergence (embeddings, an
encoder layer, the pooler), the block is recomputed from the reference's own weights and
its input on the diff's inputs; the divergent reference node is identified *by value*
among the block's intermediates (q, k, v, scores, probs, context, attention output,
intermediate, layer output, embeddings sum, pooled output, ...). Each hypothesis re-runs
the block with one classic porting bug (Q/K/V swapped, position ids offset, token types
left out or doubled, mask missing / on the query axis / another fill, softmax over the
wrong dim, scale 1/d, residual left out, pre-LN, LayerNorm eps or unbiased variance, tanh
GELU, pooler without tanh or mean-pooled, layers out of order, weights transposed or from
another layer, a bias never added) and is reported only when it reproduces the candidate's
value within budget and far better than the unmodified block. Two checks are not re-runs:
dropout left active (the candidate's values are the reference's with some zeroed and the
rest scaled by 1/(1 - p), or two eval runs of the candidate differ), weights reshaped where
they should have been transposed (a parameter of the candidate holds the reference
weight's values in their memory order under another shape) and weights left unloaded (no
parameter of the candidate holds them). A pooler bug is also recognised at the head that
reads the pooled output (``pooler.head_hints``). Nothing is inferred from names; where no
hypothesis reproduces the values, no hint is given. Heads concatenated in another order
are found by value first (``head_order``), then judged like a hypothesis; so are weights
the candidate stores in bfloat16 or float16 and upcasts (``stored_dtype``).

The causes recognised at the divergent node itself, with no re-run (a weight unloaded or
transposed, LayerNorm eps, tanh GELU, the attention scale or mask, a lower dtype) are in
``hints``.

Example::

    >>> explain_divergence(context)
    ("keys and values are swapped in the candidate's attention (its key projection holds the
    reference's value weights): swapping them in the reference reproduces the candidate's
    values (max abs error 2.4e-07 vs 0.83)",)
"""

from __future__ import annotations

import dataclasses
import math

import torch

from introspect.diff.hypotheses import (
    activation,
    attention,
    decoder_attention,
    dropout,
    embeddings,
    gpt2,
    norm,
    pooler,
    positions,
    rmsnorm,
    structure,
    weights,
)
from introspect.diff.hypotheses.blocks import READS, Linears
from introspect.diff.hypotheses.context import DivergenceContext
from introspect.diff.hypotheses.head_order import head_order_hints
from introspect.diff.hypotheses.hypothesis import Hypothesis, run_base
from introspect.diff.hypotheses.matching import (
    BETTER,
    SLACK,
    Judge,
    Quantity,
    Verdict,
    identify,
)
from introspect.diff.hypotheses.site import Site, locate
from introspect.diff.hypotheses.stored_dtype import stored_dtype_hints
from introspect.diff.hypotheses.tokens import real_in, real_tokens
from introspect.diff.modules.paths import within

FAMILIES = (embeddings, attention, norm, activation, structure, pooler, weights)


def explain_divergence(context: DivergenceContext) -> tuple[str, ...]:
    """Hints for the first divergence, most precise first; empty when nothing reproduces it.

    Args:
        context: the divergent pair, both models and the reference's inputs.

    Returns:
        Sentences saying what differs in the candidate and by how much, e.g.
        "the candidate's pooler leaves out the tanh (pooler activation missing): dropping
        the tanh from the reference's pooler reproduces the candidate's values (max abs
        error 0 vs 0.41)".
    """
    with torch.no_grad():
        hints = _dropout(context)
        if context.candidate_model is not None:
            hints += weights.reshaped(context.reference_model, context.module,
                                      context.candidate_model)
        shifted = positions.hints(context)  # an index tensor: nothing to re-run
        if shifted:
            return tuple(hints + shifted)
        try:
            site = locate(context)
        except (AttributeError, IndexError, TypeError):  # BERT-like in name only: stay silent
            site = None
        if site is None or (site.kind != "embeddings" and site.block_input is None):
            # a pooler bug seen at the head that reads it; a decoder's: RMSNorm eps,
            # rotary, causal mask, grouped-query heads (Llama); a Conv1D weight transposed
            # or its fused q/k/v blocks reordered (GPT-2)
            return tuple(dict.fromkeys(
                hints + pooler.head_hints(context) + rmsnorm.hints(context)
                + decoder_attention.hints(context) + gpt2.hints(context)))
        site = dataclasses.replace(site, linears=Linears())  # the base's, for variants
        base = run_base(site)
        quantity = identify(context.reference_value, base, site.keep, site.heads)
        if quantity is None:
            return tuple(hints)
        held = Judge(quantity.layout(base[quantity.name]), context.candidate_value, quantity,
                     context.atol, context.rtol)
        reproduced = _reproduced(context, site, base, quantity, held)
        if not reproduced:  # (found by value or by the candidate's parameters first)
            reproduced = head_order_hints(base, quantity, context.candidate_value, site.keep,
                                          site.heads, held) \
                or stored_dtype_hints(site, quantity, context.candidate_model, held)
        hints += reproduced
        edits = any(h.startswith(dropout.WEIGHT_EDIT) for h in hints)
        if not reproduced and context.candidate_model is not None and not edits:
            # random values: last (weights its forward edits hold no loaded values to find)
            hints += weights.unloaded(site, quantity.name, context.candidate_model)
    return tuple(dict.fromkeys(hints))


def _dropout(context: DivergenceContext) -> list[str]:
    """Dropout active in the candidate: seen in the values at the divergence (zeros, the
    rest scaled by 1/(1 - p)), else in two runs of the candidate that differ (not made
    where its own calls agreed bit for bit already: ``DivergenceContext.repeatable``)."""
    keep = real_tokens(context.inputs)
    reference, candidate = context.reference_value, context.candidate_value
    real = real_in(reference.shape, keep) if keep is not None else \
        torch.ones(reference.shape, dtype=torch.bool)
    seen = dropout.value_hints(reference, candidate, real, context.module)
    if seen or context.candidate_model is None or context.repeatable:
        return seen
    return dropout.hints(context.candidate_model, context.inputs)


def _reproduced(context: DivergenceContext, site: Site, base: dict[str, torch.Tensor],
                quantity: Quantity, held: Judge) -> list[str]:
    """The hints of the hypotheses whose variants ``held`` (the judge of the candidate's
    value at ``quantity``) finds reproducing it."""
    found: list[tuple[bool, float, Hypothesis, Verdict]] = []
    every = [h for family in FAMILIES for h in family.hypotheses(_up_to(site, quantity))
             if _can_move(h, quantity.name, base)]
    for stage in _by_scope(every, context.scope):
        if found:
            break
        for hypothesis in _pruned(context, site, base, quantity, stage, held):
            try:
                value = quantity.layout(hypothesis.run()[quantity.name])
            except (RuntimeError, KeyError, IndexError):
                continue
            verdict = held(value)
            if verdict is not None:
                found.append((verdict.real_only, verdict.error, hypothesis, verdict))
    if any(not real_only for real_only, *_ in found):  # reproduced everywhere beats real-only
        found = [f for f in found if not f[0]]
    found.sort(key=lambda f: (f[1], f[2].family))
    families = {f[2].family for f in found}
    if "order" in families:  # a whole other layer explains single weights of it too
        found = [f for f in found if f[2].family != "weights"]
    hints = []
    for real_only, _, h, v in found:
        where = ", at real tokens; padding positions left out" if real_only else ""
        hints.append(f"{h.what}: {h.how} reproduces the candidate's values (max abs error "
                     f"{v.error:.2g} vs {v.base_error:.2g} unmodified{where})")
    return hints


# Hypotheses are first run on a few rows of the batch: those where the unmodified block is
# furthest from the candidate. A hypothesis that reproduces the candidate on every row does
# on these (they hold the unmodified block's largest error and its worst overrun), so only
# the ones that do are run on every row, where the verdict on them is taken. The rows are
# judged with twice the slack and half the betterment, and the unmodified block taken as
# out of budget (it is, on every row): a smaller batch rounds its matmuls otherwise, and
# that must not drop a hypothesis. Where those rows are over half the batch, every
# hypothesis is run on every row at once.
_PRUNE_FROM = 8  # hypotheses: fewer are all run on every row
_LOOSER = 2.0


def _pruned(context: DivergenceContext, site: Site, base: dict[str, torch.Tensor],
            quantity: Quantity, hypotheses: list[Hypothesis],
            held: Judge) -> list[Hypothesis]:
    """The hypotheses worth running on every row (see the comment above); ``held``
    judges them there."""
    candidate = context.candidate_value.detach()
    batch = site.keep.shape[0]
    if len(hypotheses) < _PRUNE_FROM or candidate.dim() < 2 or candidate.shape[0] != batch:
        return hypotheses
    rows = _telling_rows(held, quantity)
    if len(rows) * 2 > batch:
        return hypotheses
    index = torch.tensor(rows)
    few = _rows_of(site, index)
    few_base = run_base(few)
    few_quantity = identify(context.reference_value.detach()[index], few_base, few.keep,
                            few.heads)
    if few_quantity is None or few_quantity.name != quantity.name:
        return hypotheses
    loose = Judge(few_quantity.layout(few_base[quantity.name]), candidate[index],
                  few_quantity, context.atol, context.rtol, slack=_LOOSER * SLACK,
                  better=_LOOSER * BETTER, base_within=False)
    dropped = set()
    for hypothesis in (h for family in FAMILIES for h in family.hypotheses(_up_to(few, quantity))
                       if h.by_row and _can_move(h, quantity.name, base)):
        try:
            value = few_quantity.layout(hypothesis.run()[quantity.name])
        except (RuntimeError, KeyError, IndexError):
            continue  # the run on every row decides
        if loose(value) is None:
            dropped.add((hypothesis.family, hypothesis.what, hypothesis.how))
    return [h for h in hypotheses if (h.family, h.what, h.how) not in dropped]


def _by_scope(hypotheses: list[Hypothesis], scope: str) -> list[list[Hypothesis]]:
    """The hypotheses in the order they are tried, stage by stage: where the candidate's
    value was computed by ``scope`` alone on the reference's values
    (``DivergenceContext.scope``), first those whose change may sit inside it, then, only
    where none of those reproduces it, the rest. A change in no module inside ``scope``
    changes nothing the candidate's value was computed from (its inputs were the
    reference's), so it cannot be what the candidate does there; the rest still run
    where nothing inside does (a module reading what its model stashed on it)."""
    if not scope:
        return [hypotheses]
    stages: tuple[list[Hypothesis], list[Hypothesis]] = ([], [])
    for h in hypotheses:
        inside = not h.changes or any(within(module, scope) for module in h.changes)
        stages[0 if inside else 1].append(h)
    return list(stages)


def _up_to(site: Site, quantity: Quantity) -> Site:
    """``site`` whose hypotheses' runs stop at ``quantity``: the judge reads no other (the
    base run, which ``identify`` searches, computes them all)."""
    return dataclasses.replace(site, stop=quantity.name)


def _can_move(hypothesis: Hypothesis, quantity: str, base: dict[str, torch.Tensor]) -> bool:
    """Whether the variant can move ``quantity``: one that only replaces a weight first
    read by a quantity computed after it cannot (the block computes ``base`` in order, each
    quantity from those before it and the weights ``READS`` names)."""
    if not hypothesis.replaces:
        return True
    module = hypothesis.replaces.rpartition(".")[0]
    order = list(base)
    readers = [i for i, name in enumerate(order) if module in READS.get(name, ())]
    if not readers or quantity not in order:
        return True  # not known to this table: run it
    return min(readers) <= order.index(quantity)


def _telling_rows(held: Judge, quantity: Quantity) -> list[int]:
    """The rows holding the unmodified block's largest error and its largest overrun of
    the budget ``held`` judges with, over every position and over real ones."""
    gap = held.base_gap
    over = gap - held.bound
    rows = set()
    everywhere = torch.ones(gap.shape, dtype=torch.bool)
    for where in (everywhere, quantity.real):
        for measure in (gap, over):
            masked = torch.where(where, measure, torch.full_like(measure, -math.inf))
            rows.add(int(masked.reshape(masked.shape[0], -1).amax(dim=1).argmax()))
    return sorted(rows)


def _rows_of(site: Site, index: torch.Tensor) -> Site:
    """``site`` on the batch's rows ``index`` only (its own Linears to record)."""
    return dataclasses.replace(
        site, linears=Linears(), keep=site.keep[index], input_ids=site.input_ids[index],
        token_type_ids=site.token_type_ids[index],
        block_input=None if site.block_input is None else site.block_input[index])


__all__ = ["DivergenceContext", "explain_divergence"]
