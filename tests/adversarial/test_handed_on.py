"""What the candidate's code between two modules hands on, where the reference hands the
value on unchanged (``modules.handed_on``): a loop scaling layer 3's output by 1 + 2e-6 on
its way to layer 4 moved the whole models' float64 run by 0.58 of its mean budget, and
PASSED. Held in the candidate's own plain call to what layer 3 returned, it fails at the
reference's layer that takes it; a loop handing it on as it is, as ``h * 3 / 3``, or with
the padding zeroed passes."""

from __future__ import annotations

import pytest

import introspect
from introspect.diff.modules.handed_on import HANDED_ON, MOVED_ALIKE
from tests.adversarial.corpus import port
from tests.fixtures.families import grouped_llama, tiny_inputs
from tests.ports import llama2c


@pytest.fixture(scope="module")
def ports():
    return port("layer_glue.py")


@pytest.mark.parametrize("twin", ["correct", "there_and_back", "padding_zeroed"])
def test_a_loop_handing_each_layer_on_passes(mini, ports, twin):
    reference, inputs = mini
    result = introspect.diff(reference.model, getattr(ports, twin)(reference), inputs,
                             nodes=False)
    assert result.passed, result.summary()
    assert not result.modules.note.str.startswith(HANDED_ON).any()


@pytest.mark.parametrize("nodes", [False, True])
@pytest.mark.parametrize("where, owner", [("faulty", ""), ("faulty_in_encoder", "encoder"),
                                          ("faulty_slightly", "")])
def test_a_loop_scaling_a_layers_output_fails_at_the_next_layer(mini, ports, where, owner,
                                                                nodes):
    reference, inputs = mini
    result = introspect.diff(reference.model, getattr(ports, where)(reference), inputs,
                             nodes=nodes)
    assert not result.passed
    assert (result.outputs["status"] == "ok").all()  # (under the outputs' budget)
    rows = result.modules[result.modules.note.str.startswith(HANDED_ON)]
    assert len(rows) == 1, result.modules.note.tolist()
    row = rows.iloc[0]
    assert row.status == "fail" and row.candidate_module == owner
    assert row.reference_module == "encoder.layer.4" and row.layer == "encoder.layer.4"
    taker = "encoder.layer.4" if owner else "layers.4"
    assert row.note.startswith(
        f"{HANDED_ON} {taker} (args.0): it took what {taker.replace('4', '3')} returned, as "
        "the reference's encoder.layer.4 takes what its encoder.layer.3 returned, "
        "unchanged; "), row.note
    slight = where == "faulty_slightly"  # (its largest gap within budget: its mean is not)
    assert (MOVED_ALIKE in row.note) == slight and row.max_abs_err > row.limit
    first = result.first_divergence
    assert first.layer == "encoder.layer.4", first
    assert first.budget.split(" ", 1)[1].startswith("on average") == slight, first.budget
    assert ("local mean abs error" in result.summary()) == slight


@pytest.mark.parametrize("fault, passed", [(None, True), ("handed_scaled", False)])
def test_a_llama_loop_scaling_what_it_hands_a_block(fault, passed):
    # llama2.c's port (tests/ports): its own blocks in its own loop, against HF's Llama
    reference = grouped_llama()
    result = introspect.diff(reference, llama2c.build(reference, fault, 2),
                             tiny_inputs("llama"), nodes=False)
    assert result.passed == passed, result.summary()
    if not passed:
        first = result.first_divergence
        assert first.layer == "layers.2" and first.module == "layers.2", first
        assert first.detail.startswith("module evidence: the code of the candidate "
                                       f"(Transformer) in its autograd call: "
                                       f"{HANDED_ON} layers.2 (args.0): it took what "
                                       "layers.1 returned"), first.detail


def test_a_value_rounded_between_layers_is_named_where_it_is_handed_on():
    """``ports/fp16_glue.py``: layer 3's output stored in float16 on its way to layer 4.
    The first divergence is the value handed on, not layer 4's query Linear that the
    recording ran on it (module evidence found that Linear the reference's)."""
    from tests.adversarial.corpus import first_divergence, run_port

    done = run_port("fp16_glue.py", "faulty")
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    first = first_divergence(done.stdout)
    assert "encoder.layer.4" in first and "value handed on" in first, done.stdout
    assert "it took what blocks.3 returned" in done.stdout, done.stdout
    assert run_port("fp16_glue.py", "correct").returncode == 0
