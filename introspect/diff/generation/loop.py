"""Greedy decoding on both sides, each with its own cache, compared step by step.

The protocol a model decodes by is HF's: it is called as
``model(input_ids=ids, past_key_values=cache, use_cache=True)`` (``cache=`` where its
forward takes that, as transformers >= 5.2 does; ``use_cache`` only when it takes it) and
returns the logits and its cache: a ``ModelOutput`` with ``.logits`` and ``.cache`` (or
``.past_key_values``), a mapping with those keys, or a tuple
``(logits, cache, ...)``. The cache is whatever the model wants back on the next call
(HF's ``Cache`` classes, a tuple of ``(keys, values)`` per layer, its own object holding
pre-allocated buffers); ``past_key_values=None`` starts a new sequence (a port keeping
its buffers inside resets them). A model with another signature is wrapped in a small
``nn.Module`` that calls it this way (docs/generation.md).

Step 0 (the prefill) runs the prompt; step k > 0 runs one token at position
``len(prompt) + k - 1``. The prefill is compared node by node by ``introspect.diff``
itself (``forward_keywords``: each side's own cache). Every later step is recorded on
both sides and each aligned pair measured on the values the models computed, the
alignment reused from step to step under a proof that neither model nor graph changed
(``quick``); a step where anything is over budget (a node, the logits, the caches) gets
the full diff, made from the same recordings. After each step, every layer's cached keys
and values are compared by value (``caches``); a step that fails gets the
incremental-decoding hints tested on its values (``hints``). Both
sides are fed the reference's greedy token (teacher forcing), so when the chosen tokens
part the later steps are still compared, and the notes say from which step.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from introspect.diff.generation.caches import cache_layers, compare_cached, shape_text
from introspect.diff.generation.call_log import CallLog
from introspect.diff.generation.collector import older_objects_set_aside
from introspect.diff.generation.hints import StepContext, crash_hints
from introspect.diff.generation.hints import explain as step_hints
from introspect.diff.generation.protocol import (
    call_keywords,
    captured_outputs,
    check_length,
    check_protocol,
    logits_and_cache,
    prompt_row,
)
from introspect.diff.generation.quick import QuickSteps
from introspect.diff.generation.records import CacheDiff, Generated, StepDiff
from introspect.diff.ops.align.weights import relations_remembered
from introspect.diff.ops.eager import write_metadata
from introspect.diff.result import DiffResult
from introspect.diff.tables import layer_rows as table_of_layers
from introspect.diff.tolerance import Tolerance, compare_dtype
from introspect.errors import InputError
from introspect.models.load import TokenizedInputs
from introspect.run.modes import set_mode
from introspect.tracing.tracer import CACHE_OFF_NOTE


def diff_generation(reference: torch.nn.Module, candidate: torch.nn.Module,
                    inputs: TokenizedInputs | Mapping[str, torch.Tensor], steps: int, *,
                    diff_forward: Callable[..., DiffResult], tokenizer: Any = None,
                    atol: float | None = None, rtol: float | None = None,
                    noise_budget: bool = False,
                    **options: Any) -> DiffResult:
    """Decode ``steps`` tokens greedily on both sides and compare every step node by node.

    Args:
        reference, candidate: models that decode by the protocol of this module.
        inputs: the prompt: ``input_ids`` of one row (the first row of a batch is taken).
        steps: tokens to generate (the prefill chooses the first).
        diff_forward: the diff of one forward, ``introspect.diff`` itself: it compares the
            prefill and any step that fails; passed in, so this mode never imports the
            entry point that hands over to it.
        tokenizer: decodes the chosen tokens for the reports.
        atol, rtol, options: as ``introspect.diff``.

    Returns:
        A ``DiffResult`` whose rows are the first failing step's (the prefill's when
        every step passes), with ``steps``, ``caches``, ``generated`` and
        ``first_divergence.step``.

    Raises:
        InputError: ``steps`` not a positive integer, no ``input_ids``, a model whose
            forward takes no ``past_key_values``, a reference that fails on a step.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InputError(f"generate must be a positive number of tokens, got {steps!r}")
    tolerance = Tolerance(atol=atol, rtol=rtol,
                          noise_factor=options.get("noise_factor", Tolerance.noise_factor))
    prompt, notes = prompt_row(inputs)
    check_length(reference, prompt.shape[-1], steps)
    for side, model in (("reference", reference), ("candidate", candidate)):
        check_protocol(side, model)
    # eval mode for the whole run: the hints re-run the reference between the steps' diffs
    modes = [{name: m.training for name, m in model.named_modules()}
             for model in (reference, candidate)]
    notes += [f"the {side} had module(s) in training mode; generation ran it in eval mode "
              "(dropout off) and put it back"
              for side, saved in zip(("reference", "candidate"), modes, strict=True)
              if any(saved.values())]
    set_mode(reference, False)
    set_mode(candidate, False)
    try:
        # the prefill and the first one-token step relate the same weights: once, while
        # every weight is proven the same (``align.weights.relations_remembered``); the
        # collector's full passes read only what the generation allocates (``collector``)
        twin = _TwinNoise(reference, candidate, notes, tolerance) if noise_budget else None
        with relations_remembered(), older_objects_set_aside():
            return _decode_and_compare(reference, candidate, prompt, notes, steps, tokenizer,
                                       tolerance, atol, rtol, options, diff_forward, twin)
    finally:
        for model, saved in zip((reference, candidate), modes, strict=True):
            for name, module in model.named_modules():
                module.training = saved.get(name, module.training)


def _decode_and_compare(reference: torch.nn.Module, candidate: torch.nn.Module,
                        prompt: torch.Tensor, notes: list[str], steps: int, tokenizer: Any,
                        tolerance: Tolerance, atol: float | None, rtol: float | None,
                        options: Mapping[str, Any],
                        diff_forward: Callable[..., DiffResult],
                        twin: _TwinNoise | None = None) -> DiffResult:
    notes.append(f"generation: {steps} token(s) decoded greedily from a prompt of "
                 f"{prompt.shape[1]} token(s), each side with its own key/value cache; the "
                 "prefill and every one-token step compared node by node, and every layer's "
                 "cached keys and values after each step")
    quick = QuickSteps(reference, candidate, tolerance, options.get("name_map"))
    ref_cache: Any = None
    cand_cache: Any = None
    allocated: dict[tuple[int, str], int] = {}  # the candidate's sequence length, per tensor
    fed = prompt
    position = 0
    step_rows: list[StepDiff] = []
    cache_rows: list[CacheDiff] = []
    results: list[DiffResult] = []
    ref_tokens: list[int] = []
    cand_tokens: list[int] = []
    forced_from: int | None = None
    proven: set[tuple[int, str]] = set()  # the cached tensors whose layout the prefill proved
    first_unproven: tuple[int, str] | None = None
    failure: DiffResult | None = None
    crash = ""
    for step in range(steps):
        before = _snapshot(ref_cache)  # for the hints that re-run the reference's step
        ref_kw = call_keywords(reference, ref_cache)
        cand_kw = call_keywords(candidate, cand_cache)
        recordings: tuple[CallLog, CallLog] | None = None
        quick_failed = False  # (the quick comparison did not pass the step's nodes)
        result: DiffResult | None = None
        states = quick.states() if step else ((), ())  # before the step's own hooks are added
        with captured_outputs(reference, candidate) as sides:
            try:
                if step == 0:
                    result = diff_forward(reference, candidate, {"input_ids": fed}, atol=atol,
                                          rtol=rtol, forward_keywords=(ref_kw, cand_kw),
                                          noise_budget=twin is not None, **options)
                    if twin is not None:
                        twin.step(fed, None)
                else:
                    recordings = quick.record({"input_ids": fed}, ref_kw, cand_kw)
                    noise = twin.step(fed, recordings[0]) if twin is not None else None
                    quick_failed = not quick.passes(*recordings, {"input_ids": fed}, states,
                                                    noise)
                    if quick_failed:
                        result = _full_step(diff_forward, reference, candidate, fed,
                                            recordings, atol, rtol, (ref_kw, cand_kw), options)
            except InputError as e:
                ref_out, _ = sides()
                if not ref_out or step == 0:
                    raise
                step_rows.append(_crashed_step(step, position, fed, ref_out, str(e)))
                crash = f"the candidate failed at step {step}: {e}"
                notes.append(crash)
                break
            ref_out, cand_out = sides()
        if twin is not None and step == 0:
            # the forward's diff ran the reference's float64 copy, not it (and a model
            # compared with itself ran as the candidate only): each prefill once more
            ref_out = [_prefill_again(reference, fed, ref_kw)]
            if reference is candidate or not cand_out:
                cand_out = [_prefill_again(candidate, fed, cand_kw)]
        ref_logits, ref_cache = logits_and_cache("reference", ref_out[0])
        cand_logits, cand_cache = logits_and_cache("candidate", cand_out[0])
        ref_token = int(ref_logits[0, -1].argmax())
        cand_token = int(cand_logits[0, -1].argmax())
        filled = position + fed.shape[1]
        layer_rows, compared = _compare_caches(step, ref_cache, cand_cache, filled, tolerance,
                                               allocated,
                                               twin.cache_noise(ref_cache) if twin else None)
        cache_rows += layer_rows
        if not compared and step == 0:
            notes.append(_unreadable_note(ref_cache, cand_cache))
        logits_err = float((cand_logits[0, -1].to(ref_logits.dtype)
                            - ref_logits[0, -1]).abs().max())
        # A cached tensor is held to the reference's in the layout it matched after the
        # prefill; one that matched none there holds another quantity or order (keys
        # before their rotation, Meta's order within a head): read by a guessed layout,
        # it fails nothing alone, and the step that reads it fails if it is wrong (probe
        # round m: correct Meta-layout Llamas FAILED at step 0)
        if step == 0:
            proven = {(r.layer, r.kind) for r in layer_rows if r.passed}
        layer_rows = [r if r.passed or (r.layer, r.kind) in proven
                      else dataclasses.replace(r, note=_UNPROVEN) for r in layer_rows]
        cache_finding = next((f"layer {r.layer} {r.kind}" for r in layer_rows
                              if not r.passed and r.note != _UNPROVEN), "")
        unproven = next((f"layer {r.layer} {r.kind}" for r in layer_rows
                         if r.note == _UNPROVEN), "")
        if unproven and first_unproven is None:
            first_unproven = (step, unproven)
        # The logits as the models returned them decide too: a port may change them after
        # its last recorded node (in place, NaN), where no node-level pair sees it.
        logits_part = _logits_part(ref_logits, cand_logits, tolerance,
                                   bool(options.get("allow_nonfinite")),
                                   twin.logits_noise(ref_logits) if twin else 0.0)
        if result is None and recordings is not None and (
                cache_finding or ref_token != cand_token or logits_part):
            # every node agrees, but not the caches, logits or tokens: the full diff
            result = _full_step(diff_forward, reference, candidate, fed, recordings, atol,
                                rtol, (ref_kw, cand_kw), options)
        # (not where the quick comparison passed, and the caches, logits or tokens sent
        # the step to the full diff)
        nodes_unread = twin is not None and quick_failed and not quick.over_budget
        nodes_passed = result is None or result.passed
        if twin is not None and result is not None and step > 0:
            # the full diff's nodes keep the default budgets, which rounding in the
            # candidate's dtype exceeds: the nodes pass where the quick comparison held
            # them to their noise, and the node named is the first it found over it
            # (none: the step's caches or logits name it). (The prefill's diff ran with
            # the noise budget: no hint to measure it.)
            nodes_passed = not quick.over_budget
            result = _named_at(result, quick.first_over if quick.over_budget else None)
        d = result.first_divergence if result is not None else None
        passed = nodes_passed and not cache_finding and not logits_part
        if nodes_unread and _NODES_UNREAD not in notes:
            # the full diff's nodes are held to the default budgets, which rounding in the
            # candidate's dtype exceeds: they show where, the logits and caches decide
            notes.append(_NODES_UNREAD)
        hints: tuple[str, ...] = ()
        if not passed and step > 0 and failure is None:  # the first divergent step's
            hints = step_hints(StepContext(
                step=step, position=position, fed=fed, reference=reference,
                reference_cache=before, reference_logits=ref_logits,
                candidate_logits=cand_logits, caches=layer_rows,
                reference_layers=cache_layers(ref_cache),
                candidate_layers=cache_layers(cand_cache),
                tolerance=tolerance, divergence=d))
        step_rows.append(StepDiff(
            step, position, int(fed.shape[1]), ref_token, cand_token, ref_token == cand_token,
            logits_err, passed, d.reference_node if d else "", d.candidate_node if d else "",
            *(_where_used(result, d.reference_node) or (d.module, d.layer)
              if d and result is not None else ("", "")),
            d.op if d else "",
            d.local_max_abs_err if d else None, cache_finding, hints,
            _piece(tokenizer, ref_token), _piece(tokenizer, cand_token)))
        if result is not None:
            result.notes = [n for n in result.notes if not _step_only(n)]
            results.append(result)
            if failure is None and not passed:
                failure = _at_step(result, step, hints, layer_rows, logits_err)
        ref_tokens.append(ref_token)
        cand_tokens.append(cand_token)
        if ref_token != cand_token and forced_from is None:
            forced_from = step
        position = filled
        fed = torch.tensor([[ref_token]], dtype=prompt.dtype)
    if forced_from is not None:
        notes.append(f"the chosen tokens part at step {forced_from} (the reference chose "
                     f"{ref_tokens[forced_from]}, the candidate {cand_tokens[forced_from]}); "
                     "from there both sides were fed the reference's tokens (teacher "
                     "forcing), so later steps are still compared")
    if first_unproven is not None:
        notes.append(f"after step {first_unproven[0]}, the candidate's cached "
                     f"{first_unproven[1]} match the reference's in no layout tried, from the "
                     "prefill on: its cache holds another quantity or order (keys before "
                     "their rotation, another order within a head); compared only where a "
                     "step reads them")
    crashed = bool(crash)
    if failure is None and crashed:
        from introspect.diff.records import Divergence

        row = step_rows[-1]
        failure = dataclasses.replace(results[-1], first_divergence=Divergence(
            f"step {row.step}", "raised", "", f"step {row.step}", "error", 0.0, "", row.hints,
            crash, row.step))
    shown = failure or results[0]
    for result in results:
        notes += [n for n in result.notes if n not in notes]
    prompt_ids = [int(t) for t in prompt[0]]
    generated = Generated(tuple(prompt_ids), tuple(ref_tokens), tuple(cand_tokens),
                          _pieces(tokenizer, prompt_ids, ref_tokens),
                          _pieces(tokenizer, prompt_ids, cand_tokens),
                          _decode(tokenizer, prompt_ids))
    passed = failure is None and not crashed
    return dataclasses.replace(shown, passed=passed, notes=notes, step_rows=step_rows,
                               cache_rows=cache_rows, generated=generated)


def _logits_part(reference: torch.Tensor, candidate: torch.Tensor,
                 tolerance: Tolerance, allow_nonfinite: bool = False,
                 noise: float = 0.0) -> bool:
    """The last position's logits over their budget (its atol at least ``noise_factor``
    times ``noise``, their rounding noise in the candidate's dtype), or NaN or Inf in the
    candidate's (unless allowed, and the reference's are too)."""
    from introspect.diff.ops.compare.stats import measure

    budget = tolerance.budget(compare_dtype(str(reference.dtype).removeprefix("torch."),
                                            str(candidate.dtype).removeprefix("torch.")))
    budget = dataclasses.replace(budget, atol=max(budget.atol,
                                                  tolerance.noise_factor * noise))
    ref, cand = reference[0, -1], candidate[0, -1]
    if ref.shape != cand.shape:
        return True
    found, _ = measure(cand, ref, budget, None)
    if allow_nonfinite:
        return bool(found.mismatched)
    return bool(found.mismatched or found.nonfinite or found.reference_nonfinite)


def _full_step(diff_forward: Callable[..., DiffResult], reference: torch.nn.Module,
               candidate: torch.nn.Module, fed: torch.Tensor,
               logs: tuple[CallLog, CallLog], atol: float | None,
               rtol: float | None, keywords: tuple[dict[str, Any], dict[str, Any]],
               options: Mapping[str, Any]) -> DiffResult:
    """The full diff of a step already run and recorded (the models do not run again):
    the recordings built from the step's logs."""
    recordings = (logs[0].recording(), logs[1].recording())
    for recording in recordings:
        write_metadata(recording)
    return diff_forward(reference, candidate, {"input_ids": fed}, atol=atol, rtol=rtol,
                        forward_keywords=keywords, recordings=recordings, **options)


_NODES_UNREAD = ("noise budget: a step whose values the quick comparison could not read "
                 "node by node (a value changed in place, another layout) is judged on its "
                 "logits and caches, each held to its noise; its node tables use the default "
                 "budgets")


def _named_at(result: DiffResult, node: str | None) -> DiffResult:
    """A step's result whose first divergence is ``node``'s row (None: no node's: the
    step's caches or logits then name it, ``_at_step``)."""
    from introspect.diff.records import Divergence

    row = next((r for r in result.rows if node and r.reference_node == node), None)
    divergence = None if row is None else Divergence(
        row.reference_node, row.candidate_node, row.module, row.layer, row.op,
        float(row.max_abs_err or 0.0),
        "atol at least the noise factor x its rounding noise in the candidate's dtype", ())
    return dataclasses.replace(result, first_divergence=divergence)


def _prefill_again(model: torch.nn.Module, fed: torch.Tensor,
                   keywords: Mapping[str, Any]) -> Any:
    """A model's prefill, called once more for its logits and cache (with the noise budget,
    the forward's diff ran the reference's float64 copy instead). The cache it is handed
    is None: a prefill starts a cache of its own each time, so nothing runs twice on one."""
    from introspect.diff.ops.explain import accepted_inputs

    with torch.no_grad():
        return model(**accepted_inputs(model, {"input_ids": fed}), **keywords)


def _snapshot(cache: Any) -> Any:
    """A copy of the reference's cache before a step (its hints re-run the step on it)."""
    if cache is None:
        return None
    try:
        return copy.deepcopy(cache)
    except Exception:  # a cache that cannot be copied: no hints that re-run the step
        return None


# ---------------------------------------------------------------------------------------
# Noise in the candidate's dtype (``noise_budget``)


class _TwinNoise:
    """The reference cast to the candidate's dtype, decoding in lockstep with it on the
    same tokens with a cache of its own: what rounding alone in that dtype moves each
    value by, step by step. A float64 reference, as the forward's ``noise_budget`` runs
    it, would need its own cache too; here the reference's values stay what its own call
    computed, and each compared value's atol is at least ``noise_factor`` times how far
    the twin's is from it: the logits, each cached tensor, and each node of a one-token
    step (by call, where the two logs make the same calls). The prefill's nodes get the
    forward's own ``noise_budget`` (the reference in float64, each node's local noise)."""

    def __init__(self, reference: torch.nn.Module, candidate: torch.nn.Module,
                 notes: list[str], tolerance: Tolerance) -> None:
        from introspect.diff.copies import cast_copy

        dtype = next((p.dtype for p in candidate.parameters() if p.is_floating_point()),
                     torch.float32)
        self.model = cast_copy(reference, dtype, what="noise_budget", always=True).eval()
        self.dtype = dtype
        self.cache: Any = None
        self.logits: torch.Tensor | None = None
        notes.append(
            f"noise budget: the reference cast to {str(dtype).removeprefix('torch.')} decoded "
            "beside it on the same tokens with its own cache; each step's logits, cached "
            "tensors and nodes are held to at least "
            f"{tolerance.noise_factor:g}x how far that copy's are from the reference's (the "
            "prefill's nodes: the reference in float64, as the forward's --noise-budget)")

    def step(self, fed: torch.Tensor, reference_log: CallLog | None) -> dict[int, float]:
        """Run the twin's step; each reference call's noise by its index in
        ``reference_log`` (none for the prefill, whose nodes the forward's noise budgets)."""
        from introspect.diff.generation.call_log import log_forward
        from introspect.diff.ops.explain import accepted_inputs

        got: list[Any] = []
        handle = self.model.register_forward_hook(lambda module, args, output:
                                                  got.append(output))
        try:
            inputs = accepted_inputs(self.model, {"input_ids": fed})
            keywords = call_keywords(self.model, self.cache)
            if reference_log is None:
                with torch.no_grad():
                    self.model(**inputs, **keywords)
                log = None
            else:
                log = log_forward(self.model, inputs, keywords)
        finally:
            handle.remove()
        self.logits, self.cache = logits_and_cache("reference", got[0])
        if log is None or reference_log is None or log.targets != reference_log.targets:
            return {}
        noise: dict[int, float] = {}
        for index, (mine, theirs) in enumerate(zip(log.values, reference_log.values,
                                                   strict=False)):
            if isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor) \
                    and mine.shape == theirs.shape and theirs.is_floating_point() \
                    and theirs.numel():
                noise[index] = _largest_difference(mine, theirs)
        return noise

    def logits_noise(self, reference: torch.Tensor) -> float:
        if self.logits is None or self.logits.shape != reference.shape:
            return 0.0
        return _largest_difference(self.logits[0, -1], reference[0, -1])

    def cache_noise(self, reference: Any) -> dict[tuple[int, str], float]:
        noise = {}
        for layer, (mine, theirs) in enumerate(zip(cache_layers(self.cache) or [],
                                                   cache_layers(reference) or [],
                                                   strict=False)):
            for kind, a, b in (("keys", mine[0], theirs[0]), ("values", mine[1], theirs[1])):
                if a.shape == b.shape:
                    noise[(layer, kind)] = _largest_difference(a, b)
        return noise


def _largest_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    with torch.no_grad():
        found = float((a.detach().double() - b.detach().double()).abs().max())
    return found if math.isfinite(found) else 0.0


# ---------------------------------------------------------------------------------------
# The caches


def _compare_caches(step: int, reference: Any, candidate: Any, filled: int,
                    tolerance: Tolerance, allocated: dict[tuple[int, str], int],
                    noise: Mapping[tuple[int, str], float] | None = None,
                    ) -> tuple[list[CacheDiff], bool]:
    """Every layer's keys and values; ``allocated`` holds each candidate tensor's length
    along its sequence axis at the step before: a static cache keeps it, a concatenated one
    grows it by the step's tokens (longer than the reference's is then a finding).
    ``noise``: each cached tensor's rounding noise in the candidate's dtype, by (layer,
    kind): its atol is at least ``noise_factor`` times it."""
    ref_layers = cache_layers(reference)
    cand_layers = cache_layers(candidate)
    if not ref_layers or not cand_layers:
        return [], False
    rows = []
    pairs = zip(ref_layers, cand_layers, strict=False)  # unequal counts: a row below
    for layer, (ref_pair, cand_pair) in enumerate(pairs):
        for kind, ref, cand in (("keys", ref_pair[0], cand_pair[0]),
                                ("values", ref_pair[1], cand_pair[1])):
            budget = tolerance.node_budget(compare_dtype(str(ref.dtype).removeprefix("torch."),
                                                         str(cand.dtype).removeprefix("torch.")))
            if noise and (layer, kind) in noise:
                budget = dataclasses.replace(budget, atol=max(
                    budget.atol, tolerance.noise_factor * noise[(layer, kind)]))
            found = compare_cached(ref.detach(), cand.detach(), budget, filled)
            note = "" if found.layout else ("no layout of the candidate's tensor holds the "
                                            f"reference's {filled} position(s)")
            passed = found.passed
            before = allocated.get((layer, kind))
            if passed and found.allocated > filled and step > 0 and before is not None \
                    and found.allocated != before:  # grown, not pre-allocated
                passed = False
                note = (f"the candidate's cache grew to {found.allocated} positions; the "
                        f"reference holds {filled}")
            allocated[(layer, kind)] = found.allocated
            rows.append(CacheDiff(step, layer, kind, shape_text(ref),
                                  shape_text(cand), found.layout, filled,
                                  found.max_abs_err, passed, note))
    if len(ref_layers) != len(cand_layers):
        rows.append(CacheDiff(step, min(len(ref_layers), len(cand_layers)), "layers", "", "",
                              "", filled, None, False,
                              f"the reference caches {len(ref_layers)} layer(s), the "
                              f"candidate {len(cand_layers)}"))
    return rows, True


_UNPROVEN = "no layout matched the reference's after the prefill: not held to it"


def _unreadable_note(reference: Any, candidate: Any) -> str:
    unread = [f"the {side}'s ({type(c).__name__})" for side, c in
              (("reference", reference), ("candidate", candidate))
              if not cache_layers(c)]
    return (f"caches not compared: {' and '.join(unread)} cache holds no keys and values "
            "introspect can read (HF Cache, a tuple of (keys, values) per layer, or objects "
            "with k_cache/v_cache)")


# ---------------------------------------------------------------------------------------
# Rows and the result


def _crashed_step(step: int, position: int, fed: torch.Tensor, ref_out: list[Any],
                  message: str) -> StepDiff:
    ref_logits, _ = logits_and_cache("reference", ref_out[0])
    ref_token = int(ref_logits[0, -1].argmax())
    return StepDiff(step, position, int(fed.shape[1]), ref_token, -1, False, float("inf"),
                    False, "", "", "", "", "", None, "", crash_hints(message))


def _step_only(note: str) -> bool:
    """A note about one step's recording that says nothing of the models: the cache off
    (it is on here), the cache's tensors (constants of each step's graph) paired by name."""
    return CACHE_OFF_NOTE in note or ("by name only" in note and all(
        name.startswith("_tensor_constant")
        for name in note.split(": ", 1)[-1].split(", ")))


def _at_step(result: DiffResult, step: int, hints: tuple[str, ...],
             layer_rows: list[CacheDiff], logits_err: float) -> DiffResult:
    """The step's result with its first divergence (a node's, else a cached tensor's,
    else the logits as returned)."""
    d = result.first_divergence
    if d is not None:
        module, layer = _where_used(result, d.reference_node) or (d.module, d.layer)
        rows, layers = result.rows, result.layer_rows
        if layer != d.layer and result.reference is not None:
            # the layer table blames where the last line does (positions made beside the
            # mask are blamed in the first layer that reads them)
            rows = [dataclasses.replace(r, layer=layer, module=module)
                    if r.reference_node == d.reference_node else r for r in rows]
            layers = table_of_layers(rows, result.reference.records)
        return dataclasses.replace(result, rows=rows, layer_rows=layers,
                                   first_divergence=dataclasses.replace(
            d, step=step, module=module, layer=layer,
            hints=tuple(dict.fromkeys([*hints, *d.hints]))))
    from introspect.diff.records import Divergence

    row = next((r for r in layer_rows if not r.passed and r.note != _UNPROVEN), None)
    if row is None:
        detail = (f"at step {step}, the logits the candidate returned differ from the "
                  f"reference's (max abs error {logits_err:.3g}) while every recorded node "
                  "agrees: they were changed after the model's last recorded op (in place, "
                  "or outside torch)")
        return dataclasses.replace(result, first_divergence=Divergence(
            "logits", "logits", "", "output", "output", logits_err,
            "atol/rtol of the logits' dtype", hints, detail, step))
    what = f"cache.layer.{row.layer}.{row.kind}"
    detail = (f"after step {step}, layer {row.layer}'s cached {row.kind} differ from the "
              f"reference's ({row.note or f'max abs error {row.max_abs_err:.3g}'}; candidate "
              f"{row.candidate_shape}, reference {row.reference_shape}); the step's own "
              "outputs still agree: the next step reads them")
    budget = "atol/rtol of the cache's dtype"
    return dataclasses.replace(result, first_divergence=Divergence(
        what, what, "cache", f"layer {row.layer}", "cache", float(row.max_abs_err or 0.0),
        budget, hints, detail, step))


def _where_used(result: DiffResult, node: str) -> tuple[str, str] | None:
    """Positions made beside the mask, at the model's top: blamed where they are used
    (GPT-2's ``wpe``, Llama's ``rotary_emb``), the first module of a layer reading them."""
    graph = result.reference
    if graph is None:
        return None
    records = {r.name: r for r in graph.records}
    start = records.get(node)
    if start is None or (start.layer not in ("mask", "inputs", "")
                         and "." in start.module):
        return None
    nodes = {n.name: n for n in graph.gm.graph.nodes}
    seen, queue = {node}, [node]
    while queue:
        for user in nodes[queue.pop(0)].users:
            record = records.get(user.name)
            if record is None or user.name in seen:
                continue
            if record.layer not in ("mask", "inputs", "outputs", "") and record.module:
                return record.module, record.layer
            seen.add(user.name)
            queue.append(user.name)
    return None


def _pieces(tokenizer: Any, prompt: list[int], tokens: list[int]) -> tuple[str, ...]:
    """Each token as the text it adds after the prompt and the tokens before it (spaces
    included, as the tokenizer joins them)."""
    if tokenizer is None:
        return ()
    texts = [_decode(tokenizer, prompt + tokens[:i]) for i in range(len(tokens) + 1)]
    return tuple(after[len(before):] if after.startswith(before) else _piece(tokenizer, t)
                 for before, after, t in zip(texts[:-1], texts[1:], tokens, strict=True))


def _piece(tokenizer: Any, token: int) -> str:
    return _decode(tokenizer, [token])


def _decode(tokenizer: Any, tokens: list[int]) -> str:
    if tokenizer is None:
        return ""
    try:
        return str(tokenizer.decode(tokens))
    except Exception:  # a tokenizer that cannot decode an id: no text
        return ""


__all__ = ["diff_generation"]
