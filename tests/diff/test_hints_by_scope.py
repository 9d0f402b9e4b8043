"""A FAIL's hints tried inside the failing module first (``hypotheses._by_scope``).

Where module evidence fails and no node tables are asked for, the candidate's smallest
failing module is recorded alone on the reference's values (``ops.inside``). Its value at
the divergence then depends on nothing outside that module, so a hypothesis changing only
modules outside it (another layer's weight in the query, a mask's fill) cannot be what the
candidate computes differently there: those run only where none inside reproduces the
value. At BERT-base 2 x 9 a tanh GELU's hints ran 204 variants of the layer (0.46 s of a
2.0 s FAIL), now 3.

Ports are ``tests/ports`` (other hands' styles), on MiniLM (pretrained: its norms and
biases are not the identity).
"""

from __future__ import annotations

import importlib

import pytest

import introspect
from introspect.diff.hypotheses import explain_divergence
from tests.diff.test_hypotheses import context_for
from tests.ports.batch import port_batch

hypotheses = importlib.import_module("introspect.diff.hypotheses")  # (``diff`` shadows it)

LAYER = 2
# fault -> (the reference's failing module, a word its hint must hold)
INSIDE = {
    "gelu_tanh": ("intermediate.intermediate_act_fn", "tanh"),
    "ln_eps": ("attention.output.LayerNorm", "eps"),
    "weight_transposed": ("attention.output.dense", "transposed"),
}


@pytest.fixture(scope="module")
def batch(minilm):
    return port_batch(minilm.tokenizer)


@pytest.fixture
def stages(monkeypatch):
    """Each call of ``_by_scope`` (its scope, and how many hypotheses each stage holds),
    and each stage ``_reproduced`` ran."""
    seen: dict[str, list] = {"scopes": [], "ran": []}
    split, pruned = hypotheses._by_scope, hypotheses._pruned

    def by_scope(every, scope):
        out = split(every, scope)
        seen["scopes"].append((scope, [len(s) for s in out]))
        return out

    def pruned_spy(context, site, base, quantity, stage, held):
        seen["ran"].append(len(stage))
        return pruned(context, site, base, quantity, stage, held)

    monkeypatch.setattr(hypotheses, "_by_scope", by_scope)
    monkeypatch.setattr(hypotheses, "_pruned", pruned_spy)
    return seen


def _diffed(minilm, batch, style: str, fault: str):
    port = importlib.import_module(f"tests.ports.{style}").build(minilm.model, fault,
                                                                 layer=LAYER)
    result = introspect.diff(minilm.model, port, batch, nodes=False)
    assert not result.passed
    return result.first_divergence


@pytest.mark.parametrize("fault", list(INSIDE))
@pytest.mark.parametrize("style", ["hf_like", "nanogpt_style"])
def test_a_fault_inside_the_failing_module_is_explained_by_its_hypotheses_alone(
        minilm, batch, stages, style, fault):
    module, word = INSIDE[fault]
    divergence = _diffed(minilm, batch, style, fault)
    assert divergence.module == f"encoder.layer.{LAYER}.{module}", divergence
    assert divergence.hints and all(word in h.lower() for h in divergence.hints
                                    if "reproduces" in h), divergence.hints
    assert any("reproduces" in h for h in divergence.hints), divergence.hints
    (scope, sizes), = stages["scopes"]
    assert scope == f"encoder.layer.{LAYER}.{module}"
    inside, outside = sizes
    assert outside > 3 * inside  # most variants change something outside the module
    assert stages["ran"] == [inside]  # the rest never ran: one inside reproduced


@pytest.mark.parametrize("fault", list(INSIDE))
def test_the_hints_are_those_every_hypothesis_gives(minilm, batch, monkeypatch, fault):
    scoped = _diffed(minilm, batch, "hf_like", fault).hints
    monkeypatch.setattr(hypotheses, "_by_scope", lambda every, scope: [every])
    assert _diffed(minilm, batch, "hf_like", fault).hints == scoped


def test_a_module_taking_values_its_model_computed_is_not_a_scope(minilm, batch, stages):
    """A mask's fill is computed by the port's model and handed to its attention as an
    input paired with none of the reference's: the attention's value depends on code
    outside it, and every hypothesis is tried at once."""
    divergence = _diffed(minilm, batch, "hf_like", "mask_fill")
    assert any("fill value" in h for h in divergence.hints), divergence.hints
    assert [scope for scope, _ in stages["scopes"]] == [""]


def test_the_rest_run_where_nothing_inside_the_scope_reproduces(tiny_models, stages):
    """A scope that holds none of the fault (a module reading what its model stashed on
    it would give one): the hypotheses outside it still find it."""
    loaded = tiny_models("base", "sdpa")
    reference, batch = loaded.model, port_batch(loaded.tokenizer)
    port = importlib.import_module("tests.ports.hf_like").build(
        reference, "weight_from_other_layer", layer=0)
    context = context_for(reference, port, "hf_like", batch, "layer_output", 0)
    wrong = "encoder.layer.0.intermediate.intermediate_act_fn"
    hints = explain_divergence(type(context)(**{**context.__dict__, "scope": wrong}))
    assert hints and all("another layer" in h for h in hints), hints
    (scope, (inside, outside)), = stages["scopes"]
    assert scope == wrong and stages["ran"] == [inside, outside]


def test_hypotheses_split_by_the_modules_their_change_sits_in(tiny_models):
    loaded = tiny_models("base", "sdpa")
    reference, tiny_batch = loaded.model, port_batch(loaded.tokenizer)
    port = importlib.import_module("tests.ports.hf_like").build(reference, "gelu_tanh")
    context = context_for(reference, port, "hf_like", tiny_batch, "intermediate", 0)
    site = hypotheses.locate(context)
    every = [h for family in hypotheses.FAMILIES for h in family.hypotheses(site)]
    assert hypotheses._by_scope(every, "") == [every]
    inside, outside = hypotheses._by_scope(every, "encoder.layer.0.attention.self")
    assert {h.family for h in inside} >= {"mask", "softmax", "scale", "attention"}
    assert not {h.family for h in outside} & {"mask", "softmax", "scale", "attention"}
    # a weight by the module reading it: the query's inside, the FFN's outside
    weights = {h.replaces: h in inside for h in every
               if h.family == "weights" and "layer.1." in h.what}
    assert weights["attention.self.query.weight"]
    assert not weights["intermediate.dense.weight"]
    assert all(not h.changes for h in inside if h.family == "structure")  # said nowhere
    # the encoder hands a layer its input: a scope inside the layer rules that out
    fed = [h for h in every if "which reads its output" in h.what]
    assert fed and all(h in outside for h in fed)
