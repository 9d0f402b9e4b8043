"""``introspect.diff`` on BERT ports nobody here wrote (issue 10).

The ports live in ``tests/ports/`` and import nothing from introspect. Every correct port
must pass with no failing node; every injected fault must fail, name the layer and the
computing op (never a layout op) that hold it, keep its FAIL rows in that layer, and give
the right hint. ``EXPECTED`` is the one table of what is expected; ``KNOWN_WRONG`` lists
what today's engine gets wrong, each marked ``xfail(strict=True)`` so that a fix turns it
into an XPASS failure and the mark must go. ``scripts/port_scoreboard.py`` prints the same
judgement as a table.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib
from dataclasses import dataclass

import pytest

import introspect
from tests.ports.batch import port_batch

STYLES = ("hf_like", "nanogpt_style", "functional")
TINY_LAYER = 0  # bert-tiny has 2 layers; layers_out_of_order swaps the layer and the next
MINILM_LAYER = 2
LAYERS = {"bert-tiny": 2, "minilm": 6}

# fault -> (layer, module under that layer's path, hint keyword). "{L}" is the faulty
# encoder layer; alternatives are separated by "|". The module is where the reference
# computes what the fault breaks; the first divergence's module must start with it.
EXPECTED: dict[str, tuple[str, str, str]] = {
    "qk_swapped": ("encoder.layer.{L}", "attention.self", "swapped"),
    "kv_swapped": ("encoder.layer.{L}", "attention.self", "swapped"),
    "position_offset": ("embeddings", "", "position"),
    "token_type_ignored": ("embeddings", "", "token type"),
    "token_type_twice": ("embeddings", "", "token type"),
    "mask_missing": ("encoder.layer.{L}", "attention.self", "mask"),
    "mask_on_query_axis": ("encoder.layer.{L}", "attention.self", "mask"),
    "mask_fill": ("encoder.layer.{L}", "attention.self", "mask"),
    "softmax_wrong_dim": ("encoder.layer.{L}", "attention.self", "softmax"),
    "scale_1_over_d": ("encoder.layer.{L}", "attention.self", "scale"),
    "missing_residual": ("encoder.layer.{L}", "attention.output", "residual"),
    "pre_ln": ("encoder.layer.{L}", "attention", "pre-ln"),
    "ln_unbiased_var": ("encoder.layer.{L}", "attention.output", "unbiased"),
    "ln_eps": ("encoder.layer.{L}", "attention.output", "eps"),
    "gelu_tanh": ("encoder.layer.{L}", "intermediate", "tanh"),
    "pooler_no_tanh": ("pooler", "", "tanh"),
    "pooler_mean": ("pooler", "", "mean"),
    "layers_out_of_order": ("encoder.layer.{L}", "", "order"),
    "dropout_active": ("encoder.layer.{L}", "attention.self", "dropout"),
    "weight_transposed": ("encoder.layer.{L}", "attention.output", "transposed"),
    "weight_unloaded": ("encoder.layer.{L}", "intermediate", "unloaded"),
    "weight_from_other_layer": ("encoder.layer.{L}", "output", "another layer"),
}
# hf_like and nanogpt_style build the additive mask once for every layer (HF does too, in
# its "mask" layer), so their mask faults show from the first layer on.
MASK_BUILT_ONCE = {"hf_like", "nanogpt_style"}

LAYOUT_OPS = {"view", "reshape", "transpose", "permute", "contiguous", "expand", "unsqueeze",
              "squeeze", "flatten", "unflatten", "getitem", "split", "chunk", "t", "narrow",
              "select", "Dropout", "dropout", "clone", "to", "type_as", "float"}

CRITERIA = ("verdict", "layer", "op", "local", "hint")

# What each criterion means when it does not hold (the xfail reasons).
WHY = {
    "verdict": "the verdict is wrong (a correct port fails, or a fault passes)",
    "layer": "the first divergence is in another layer",
    "op": "the first divergence is a layout op, or outside the module holding the fault",
    "local": "FAIL rows in layers without the fault (local error not local)",
    "hint": "no hint names the fault",
}
# (style, fault or "correct") -> the criteria today's engine gets wrong, per model; measured
# with scripts/port_scoreboard.py. Each is an xfail(strict=True): a fix makes it XPASS, and
# the entry must go.
KNOWN_WRONG: dict[str, dict[tuple[str, str], str]] = {
    "bert-tiny": {
        ("functional", "weight_from_other_layer"): "local hint",
    },
    "minilm": {
    },
}


@dataclass(frozen=True)
class Case:
    style: str
    fault: str | None
    model: str  # "bert-tiny" or "minilm"

    @property
    def layer(self) -> int:
        return TINY_LAYER if self.model == "bert-tiny" else MINILM_LAYER

    @property
    def id(self) -> str:
        return f"{self.style}-{self.fault or 'correct'}-{self.model}"


@dataclass(frozen=True)
class Expectation:
    layer: str  # where the first divergence must be
    module: str  # prefix of its module path (relative to the reference's root)
    hint: str  # keyword, case-insensitive; alternatives by "|"
    fail_layers: tuple[str, ...]  # the only layers allowed to hold FAIL rows (fnmatch)


def expectation(case: Case) -> Expectation | None:
    """What the diff must report for a faulty case (None for a correct port)."""
    if case.fault is None:
        return None
    layer, module, hint = EXPECTED[case.fault]
    layer = layer.replace("{L}", str(case.layer))
    if case.fault.startswith("mask_") and case.style in MASK_BUILT_ONCE:
        # one wrong mask feeds every layer's attention: each layer fails on its own
        return Expectation("encoder.layer.0", "encoder.layer.0.attention.self", hint,
                           ("mask", "encoder.layer.*"))
    if case.fault == "pre_ln" and case.model == "bert-tiny":
        # bert-tiny's LayerNorms are the identity at init (weight 1, bias 0): the extra
        # LayerNorm a pre-LN layer puts before its attention meets an input already
        # normalised and changes nothing (LN(LN(x)) = LN(x) to 5e-7). The first value that
        # differs is the layer's output, where the pre-LN layer has no LayerNorm at all.
        module = "output.LayerNorm"
    allowed: tuple[str, ...] = (layer,)
    if case.fault == "layers_out_of_order":
        # Swapping layers L and L+1 rewires three inputs: L+1 reads the embeddings' (or
        # L-1's) output, L reads L+1's, and whatever follows reads L's, not L+1's: the
        # next layer or, after the last one (bert-tiny has two), the pooler.
        last = case.layer + 2 >= LAYERS[case.model]
        allowed += (f"encoder.layer.{case.layer + 1}",
                    "pooler" if last else f"encoder.layer.{case.layer + 2}")
    return Expectation(layer, layer + (f".{module}" if module else ""), hint, allowed)


@dataclass(frozen=True)
class Judgement:
    """One case through ``introspect.diff``: what it reported and which criteria hold."""

    passed: bool
    layer: str
    module: str
    op: str
    candidate_node: str
    layout: bool  # the blamed op is a layout op
    hints: tuple[str, ...]
    failing_layers: tuple[str, ...]  # layers holding FAIL rows
    coverage: float | None
    ok: dict[str, bool]  # criterion -> holds (correct ports: only "verdict")


def _op_name(op: str) -> str:
    return op.rsplit(".", 1)[-1]


def judge(case: Case, result) -> Judgement:
    """Check a ``DiffResult`` against the case's expectation."""
    d = result.first_divergence
    failing = tuple(dict.fromkeys(r.layer for r in result.failing))
    coverage = getattr(getattr(result, "alignment", None), "coverage", None)
    layer, module, op = (d.layer, d.module, d.op) if d else ("", "", "")
    hints = tuple(d.hints) if d else ()
    layout = _op_name(op) in LAYOUT_OPS
    want = expectation(case)
    if want is None:
        ok = {"verdict": result.passed and not failing}
    else:
        hint_words = want.hint.lower().split("|")
        ok = {
            "verdict": not result.passed,
            "layer": layer == want.layer,
            "op": bool(d) and not layout and module.startswith(want.module),
            "local": bool(failing) and all(any(fnmatch.fnmatchcase(f, a) for a in want.fail_layers)
                                           for f in failing),
            "hint": any(w in h.lower() for h in hints for w in hint_words),
        }
    return Judgement(result.passed, layer, module, op, d.candidate_node if d else "", layout,
                     hints, failing, coverage, ok)


@functools.cache
def _loaded(model: str):
    from introspect.models.load import load_model

    loaded = load_model(model, head="base")
    return loaded.model, port_batch(loaded.tokenizer)


def run_case(case: Case):
    """``introspect.diff(reference, port, inputs)`` for one case."""
    reference, batch = _loaded(case.model)
    port = importlib.import_module(f"tests.ports.{case.style}").build(
        reference, case.fault, layer=case.layer)
    return introspect.diff(reference, port, batch)


@functools.cache
def _judged(case: Case) -> Judgement:
    return judge(case, run_case(case))


def known_wrong(case: Case, criterion: str) -> str | None:
    """The xfail reason when today's engine gets ``criterion`` wrong on ``case``."""
    wrong = KNOWN_WRONG[case.model].get((case.style, case.fault or "correct"), "")
    return WHY[criterion] if criterion in wrong.split() else None


def _params(cases, criterion: str):
    for case in cases:
        marks = []
        reason = known_wrong(case, criterion)
        if reason:
            marks.append(pytest.mark.xfail(strict=True, reason=f"issue 10: {reason}"))
        if case.model == "minilm":
            marks.append(pytest.mark.slow)
        yield pytest.param(case, id=case.id, marks=marks)


def all_faults(style: str) -> tuple[str, ...]:
    return importlib.import_module(f"tests.ports.{style}").FAULTS


TINY_CORRECT = [Case(s, None, "bert-tiny") for s in STYLES]
TINY_FAULTS = [Case(s, f, "bert-tiny") for s in STYLES for f in all_faults(s)]
MINILM_CORRECT = [Case(s, None, "minilm") for s in STYLES]
MINILM_FAULTS = [Case("hf_like", "kv_swapped", "minilm"),
                 Case("functional", "position_offset", "minilm")]


def _explain(case: Case, j: Judgement) -> str:
    return (f"{case.id}: passed={j.passed} first divergence {j.op} in {j.module or j.layer} "
            f"(candidate {j.candidate_node}); FAIL rows in {list(j.failing_layers)}; "
            f"hints {list(j.hints)}")


@pytest.mark.parametrize("case", list(_params(TINY_CORRECT + MINILM_CORRECT, "verdict")))
def test_correct_port_passes_with_no_failing_node(case):
    j = _judged(case)
    assert j.ok["verdict"], _explain(case, j)


@pytest.mark.parametrize("case", list(_params(TINY_FAULTS + MINILM_FAULTS, "verdict")))
def test_fault_fails(case):
    j = _judged(case)
    assert j.ok["verdict"], _explain(case, j)


@pytest.mark.parametrize("case", list(_params(TINY_FAULTS + MINILM_FAULTS, "layer")))
def test_fault_is_found_in_its_layer(case):
    j = _judged(case)
    assert j.ok["layer"], f"expected {expectation(case)}; " + _explain(case, j)


@pytest.mark.parametrize("case", list(_params(TINY_FAULTS + MINILM_FAULTS, "op")))
def test_fault_is_blamed_on_a_computing_op_where_it_lives(case):
    j = _judged(case)
    assert j.ok["op"], f"expected {expectation(case)}; " + _explain(case, j)


@pytest.mark.parametrize("case", list(_params(TINY_FAULTS + MINILM_FAULTS, "local")))
def test_fault_fails_only_in_its_own_layer(case):
    j = _judged(case)
    assert j.ok["local"], f"expected {expectation(case)}; " + _explain(case, j)


@pytest.mark.parametrize("case", list(_params(TINY_FAULTS + MINILM_FAULTS, "hint")))
def test_fault_gets_the_right_hint(case):
    j = _judged(case)
    assert j.ok["hint"], f"expected {expectation(case)}; " + _explain(case, j)
