"""Step 6 of alignment: a guessed pair that disagrees is checked by value, and re-paired.

Steps 3 and 4 pair nodes by structure alone (same op and shape on paired inputs), and
step 2 settles a vector that several reference nodes read alike by graph position; an
opaque op of the port's own library that reads a Linear's weights may return what comes
after it. Each is a guess. When the side-by-side run finds such a pair over budget, the
values decide, as dumps are matched (``introspect.dump.match``): the reference's value is
looked for among the candidate's nodes of its shape near its partner (a slice of the other
half of a rotary's input, the other LayerNorm of a layer), and the candidate's value among
the reference's (the activation an opaque op fused into its Linear). A node that holds it
becomes the partner (``matched_by`` ``value``); the old partner is let go. The run is then
measured again on the new pairs.

Values are taken from one plain run of each recorded graph, keeping only the nodes that
could be partners (same shape, within ``_WINDOW`` nodes of the guess).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from introspect.diff.records import (
    BY_VALUE,
    PROVEN_STRUCTURE,
    STATUS_DRIFT,
    STATUS_FAIL,
    STATUS_UNCONFIRMED,
    NodeDiff,
    Pair,
    Unmatched,
)

_WINDOW = 48  # nodes before and after a guess (in its graph's order) searched for a partner
_RELATIVE = 1e-3  # values agree: max |a - b| <= _RELATIVE * max |b| + the pair's atol


def guesses_to_check(rows: Sequence[NodeDiff]) -> list[NodeDiff]:
    """The guessed pairs whose values disagree: over budget (failing or unconfirmed) with
    the candidate's own value over budget too."""
    return [r for r in rows if r.provenance == PROVEN_STRUCTURE and r.candidate_node
            and r.reference_node and r.status in (STATUS_FAIL, STATUS_UNCONFIRMED)
            and r.mismatched]


def pair_by_value(alignment: Any, rows: Sequence[NodeDiff], reference: Any, candidate: Any,
                  ref_inputs: Mapping[str, torch.Tensor],
                  cand_inputs: Mapping[str, torch.Tensor]) -> Any | None:
    """The alignment with each disagreeing guess re-paired where a value partner exists.

    Args:
        alignment: the ``Alignment`` the rows were measured on.
        rows: the measured rows (``introspect.diff.tables.node_rows``, confirmed).
        reference, candidate: the two recorded ``IntrospectGraph`` s.
        ref_inputs, cand_inputs: what each recording was run on.

    Returns:
        A new ``Alignment``, or None when no guess found a better partner (nothing to
        measure again).
    """
    checks = guesses_to_check(rows)
    # (a drifting guess, whose error came in from before, is only let go where a proven
    # pair holds its value: re-pairing it by value would find any node near it)
    drifting = [r for r in rows if r.provenance == PROVEN_STRUCTURE and r.candidate_node
                and r.reference_node and r.status == STATUS_DRIFT and r.mismatched]
    if not checks and not drifting:
        return None
    ref_order = {r.name: r.index for r in reference.records}
    cand_order = {r.name: r.index for r in candidate.records}
    ref_shapes = {r.name: r.shape for r in reference.records if r.kind == "tensor"}
    cand_shapes = {r.name: r.shape for r in candidate.records if r.kind == "tensor"}
    ref_by_index = sorted(ref_shapes, key=ref_order.__getitem__)
    cand_by_index = sorted(cand_shapes, key=cand_order.__getitem__)
    wanted_ref: set[str] = set()
    wanted_cand: set[str] = set()
    # each reference node's partners by proof, whole (a guess beside one that agrees is
    # refuted by it: let go, and its wrong values are no longer handed on in the replay)
    held: dict[str, list[str]] = {}
    for p in alignment.pairs:
        if p.provenance != PROVEN_STRUCTURE and p.reference_region is None \
                and p.candidate_region is None and p.feature_order is None \
                and not p.reference_bias:
            held.setdefault(p.reference, []).append(p.candidate)
    options: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    for row in checks:
        r, c = row.reference_node, row.candidate_node
        if r not in ref_shapes or c not in cand_shapes:
            continue
        near_cand = [n for n in _near(cand_by_index, cand_order, c)
                     if cand_shapes[n] == ref_shapes[r] and n != c]
        near_ref = [n for n in _near(ref_by_index, ref_order, r)
                    if ref_shapes[n] == cand_shapes[c] and n != r]
        options[(r, c)] = (near_cand, near_ref)
        wanted_ref |= {r, *near_ref}
        wanted_cand |= {c, *near_cand, *held.get(r, ())}
    for row in drifting:
        r, c = row.reference_node, row.candidate_node
        if held.get(r) and r in ref_shapes and c in cand_shapes:
            options.setdefault((r, c), ([], []))  # no partner sought: held, or kept
            wanted_ref.add(r)
            wanted_cand |= set(held[r])
    if not options:
        return None
    try:
        ref_values = _values(reference.gm, ref_inputs, wanted_ref)
        cand_values = _values(candidate.gm, cand_inputs, wanted_cand)
    except Exception:  # noqa: BLE001  a check of guesses never breaks the verdict: the
        return None  # guesses then stay as measured (unconfirmed unless confirmed)
    proven_cand = {p.candidate for p in alignment.pairs if p.provenance != PROVEN_STRUCTURE}
    proven_ref = {p.reference for p in alignment.pairs if p.provenance != PROVEN_STRUCTURE}
    budgets = {(row.reference_node, row.candidate_node): row.atol or 0.0
               for row in [*checks, *drifting]}
    dropped: set[tuple[str, str]] = set()
    added: list[Pair] = []
    for (r, c), (near_cand, near_ref) in options.items():
        atol = budgets[(r, c)]
        if _closest(ref_values.get(r), [(n, cand_values.get(n)) for n in held.get(r, ())],
                    atol, cand_order, c) is not None:
            dropped.add((r, c))  # held already, by proof, at a candidate node that agrees
            continue
        found = _closest(ref_values.get(r), [(n, cand_values.get(n)) for n in near_cand
                                             if n not in proven_cand], atol, cand_order, c)
        if found is not None:
            dropped.add((r, c))
            added.append(Pair(r, found, BY_VALUE, f"re-paired by value: the reference's "
                              f"value is the candidate's {found}, not {c} (paired by "
                              f"structure)"))
            continue
        found = _closest(cand_values.get(c), [(n, ref_values.get(n)) for n in near_ref
                                              if n not in proven_ref], atol, ref_order, r)
        if found is not None:
            dropped.add((r, c))
            added.append(Pair(found, c, BY_VALUE, f"re-paired by value: the candidate's "
                              f"{c} holds the reference's {found}, not {r}"))
    if not added and not dropped:
        return None
    return _replaced(alignment, dropped, added, ref_order, cand_order)


def _near(names: list[str], order: Mapping[str, int], name: str) -> list[str]:
    at = names.index(name) if name in names else -1
    if at < 0:
        return []
    return names[max(0, at - _WINDOW):at + _WINDOW + 1]


def _closest(target: torch.Tensor | None, options: Iterable[tuple[str, Any]], atol: float,
             order: Mapping[str, int], near: str) -> str | None:
    """Of the options whose value agrees with ``target``, the nearest to ``near``."""
    if not isinstance(target, torch.Tensor) or not target.is_floating_point():
        return None
    scale = float(target.abs().max()) if target.numel() else 0.0
    limit = _RELATIVE * scale + atol
    agreeing = []
    for name, value in options:
        if not isinstance(value, torch.Tensor) or value.shape != target.shape \
                or not value.is_floating_point():
            continue
        # (the candidate may run on a device of its own: compared on the reference's)
        difference = (value.double().to(target.device) - target.double()).abs()
        if bool(torch.isfinite(difference).all()) and float(difference.max()) <= limit:
            agreeing.append(name)
    if not agreeing:
        return None
    return min(agreeing, key=lambda n: abs(order[n] - order[near]))


def _values(gm: torch.fx.GraphModule, inputs: Mapping[str, torch.Tensor],
            wanted: set[str]) -> dict[str, torch.Tensor]:
    """One plain run of ``gm``, keeping the values of ``wanted`` nodes only."""
    kept: dict[str, torch.Tensor] = {}

    class Keeper(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            value = super().run_node(n)
            if n.name in wanted and isinstance(value, torch.Tensor):
                kept[n.name] = value.detach().clone()
            return value

    placeholders = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    args = [inputs.get(str(name)) for name in placeholders]
    with torch.no_grad():
        Keeper(gm).run(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    return kept


def _replaced(alignment: Any, dropped: set[tuple[str, str]], added: list[Pair],
              ref_order: Mapping[str, int], cand_order: Mapping[str, int]) -> Any:
    """The alignment with ``dropped`` pairs replaced by ``added``, and the leftovers kept
    consistent: a node paired now is no longer unmatched; one let go is, with the reason."""
    keep = [p for p in alignment.pairs if (p.reference, p.candidate) not in dropped
            and not any(p.reference == a.reference and p.candidate == a.candidate
                        for a in added)]
    pairs = [*keep, *added]
    ref_paired = {p.reference for p in pairs}
    cand_paired = {p.candidate for p in pairs}
    unmatched = [u for u in alignment.unmatched
                 if u.node not in (ref_paired if u.graph == "reference" else cand_paired)]
    for r, c in dropped:
        if r not in ref_paired:
            unmatched.append(Unmatched("reference", r, f"paired by structure with {c}, whose "
                                       "values are another quantity; no candidate node holds "
                                       "its values (computed inside an op of the candidate)"))
        if c not in cand_paired:
            unmatched.append(Unmatched("candidate", c, f"paired by structure with {r}, whose "
                                       "values are another quantity; no reference node holds "
                                       "its values"))
    pairs.sort(key=lambda p: (ref_order[p.reference], cand_order[p.candidate]))
    return dataclasses.replace(alignment, pairs=pairs, unmatched=unmatched,
                               notes=[*alignment.notes, f"{len(added)} pair(s) made by "
                                      "structure were re-paired by value"])


__all__ = ["guesses_to_check", "pair_by_value"]
