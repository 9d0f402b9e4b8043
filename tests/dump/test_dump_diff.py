"""introspect.diff_dump: a port's dump aligned by value and measured against a capture.

The dumps here are made from a capture's own values, laid out as other frameworks lay
them out (heads split, transposed, batch dropped, renamed, shuffled), and from the NumPy
port in examples/numpy_port, which imports neither torch nor introspect.
"""

from __future__ import annotations

import random

import pytest
import torch

from introspect.dump import diff_dump, read_capture, read_dump
from introspect.dump.formats import Dump
from introspect.errors import InputError


def _dump(values: dict[str, torch.Tensor], *, ordered: bool = True,
          integers: dict[str, torch.Tensor] | None = None) -> Dump:
    return Dump("test", values, {k: str(v.dtype).split(".")[-1] for k, v in values.items()},
                ordered, integers or {})


def _renamed(cap, names=None):
    names = names or [e.name for e in cap.entries]
    return {f"t{i}": cap.values[n] for i, n in enumerate(names)}


def test_a_dump_of_the_reference_itself_passes_at_zero(tiny_capture):
    result = diff_dump(tiny_capture, _dump(_renamed(tiny_capture),
                                           integers=dict(tiny_capture.inputs)))
    assert result.passed and result.max_abs_err == 0.0
    assert result.alignment.coverage == 1.0
    assert all(r.matched_by == "value" for r in result.rows)


def test_shuffled_names_without_order_still_align_by_value(tiny_capture):
    names = [e.name for e in tiny_capture.entries]
    random.Random(0).shuffle(names)
    result = diff_dump(tiny_capture, _dump(_renamed(tiny_capture, names), ordered=False))
    assert result.passed
    pairs = {r.candidate_node: r.reference_node for r in result.rows}
    assert all(pairs[f"t{i}"] == n for i, n in enumerate(names))
    assert any("no order" in n for n in result.notes)


def test_transposed_and_head_split_dumps_align(tiny_capture):
    heads = 2  # bert-tiny
    values = {}
    for e in tiny_capture.entries:
        v = tiny_capture.values[e.name]
        if e.op == "Linear" and v.dim() == 3 and "query" in e.name:
            B, S, H = v.shape
            v = v.reshape(B, S, heads, H // heads).transpose(1, 2)  # (B, nh, S, hd)
        elif e.op == "scaled_dot_product_attention":
            B, nh, S, hd = v.shape
            v = v.transpose(1, 2).reshape(B, S, nh * hd)  # heads merged
        elif e.op == "LayerNorm":
            v = v.transpose(0, 1)  # sequence-first, as some frameworks keep it
        values[e.name + ".port"] = v.contiguous()
    result = diff_dump(tiny_capture, _dump(values))
    assert result.passed, result.summary()
    notes = {r.candidate_node: r.note for r in result.rows}
    assert any("permuted" in n for n in notes.values())
    assert all(r.reference_node == r.candidate_node.removesuffix(".port") for r in result.rows)


def test_a_batch_of_one_may_drop_its_batch_dim(tiny_models):
    import introspect
    from introspect.dump import capture

    loaded = tiny_models("base")
    cap = capture(loaded.model, introspect.tokenize(loaded.tokenizer, ["I love cats!"]))
    values = {f"x{i}": cap.values[e.name].squeeze(0) for i, e in enumerate(cap.entries)}
    result = diff_dump(cap, _dump(values))
    assert result.passed and result.alignment.coverage == 1.0


def test_a_fault_is_named_at_the_first_tensor_over_budget(tiny_capture):
    values = _renamed(tiny_capture)
    names = [e.name for e in tiny_capture.entries]
    target = next(i for i, e in enumerate(tiny_capture.entries)
                  if e.layer == "encoder.layer.1" and e.op == "LayerNorm")
    for i in range(target, len(names)):  # the fault, and everything after it, is off
        values[f"t{i}"] = values[f"t{i}"] * 1.01 + 0.01
    result = diff_dump(tiny_capture, _dump(values))
    assert not result.passed
    assert result.first_divergence.candidate_node == f"t{target}"
    assert result.first_divergence.reference_node == names[target]
    assert result.first_divergence.layer == "encoder.layer.1"


def test_a_tensor_of_no_reference_size_is_unmatched_and_says_so(tiny_capture):
    values = _renamed(tiny_capture) | {"scores": torch.zeros(2, 2, 9, 13)}
    result = diff_dump(tiny_capture, _dump(values))
    row = next(r for r in result.rows if r.candidate_node == "scores")
    assert row.status == "unmatched" and "no reference node holds" in row.note
    assert result.passed  # what cannot be compared does not fail the port


def test_a_dump_of_other_inputs_is_refused_with_the_difference(tiny_capture):
    ids = tiny_capture.inputs["input_ids"].clone()
    ids[0, 2] += 1
    with pytest.raises(InputError, match=r"differs from the reference's input_ids: at \(0, 2\)"):
        diff_dump(tiny_capture, _dump(_renamed(tiny_capture), integers={"ids": ids}))
    with pytest.raises(InputError, match="made from other inputs"):
        diff_dump(tiny_capture, _dump(_renamed(tiny_capture),
                                      integers={"ids": torch.zeros(1, 5, dtype=torch.long)}))
    with pytest.raises(InputError, match="no tensor of the dump"):
        diff_dump(tiny_capture, _dump({"x": torch.zeros(3, 7)}))


def test_the_budget_follows_the_dumps_dtype(tiny_capture):
    low = {k: v.to(torch.bfloat16) for k, v in _renamed(tiny_capture).items()}
    result = diff_dump(tiny_capture, _dump(low))
    assert result.passed, result.summary()
    assert {r.rtol for r in result.rows} == {1.6e-2}
    assert not diff_dump(tiny_capture, _dump(low), rtol=0.0, atol=1e-6).passed


def test_noise_budget_works_against_a_capture(tiny_capture):
    wide = {k: v.double() for k, v in _renamed(tiny_capture).items()}
    assert diff_dump(tiny_capture, _dump(wide), noise_budget=True).passed
    bare = type(tiny_capture)(tiny_capture.entries, tiny_capture.values, tiny_capture.inputs)
    with pytest.raises(InputError, match="capture it with --noise"):
        diff_dump(bare, _dump(wide), noise_budget=True)


def test_a_name_map_is_accepted_and_checked(tiny_capture):
    first = tiny_capture.entries[0].name
    result = diff_dump(tiny_capture, _dump(_renamed(tiny_capture)), name_map={"t0": first})
    assert result.rows[0].matched_by == "name"
    with pytest.raises(InputError, match="which the dump does not hold"):
        diff_dump(tiny_capture, _dump(_renamed(tiny_capture)), name_map={"nope": first})


def test_unreadable_dumps_are_one_clear_error(tmp_path):
    (tmp_path / "garbage.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(InputError, match="cannot read dump"):
        read_dump(tmp_path / "garbage.safetensors")
    with pytest.raises(InputError, match="does not exist"):
        read_dump(tmp_path / "missing.npz")
    with pytest.raises(InputError, match="expected a .safetensors or .npz"):
        (tmp_path / "x.txt").write_text("x")
        read_dump(tmp_path / "x.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no .npy file"):
        read_dump(tmp_path / "empty")


def test_a_folder_of_npy_files_is_ordered_by_its_order_file(tmp_path, tiny_capture):
    import numpy as np

    names = [e.name for e in tiny_capture.entries]
    for i, n in enumerate(names):
        np.save(tmp_path / f"z{len(names) - i:03d}.npy", tiny_capture.values[n].numpy())
    assert not read_dump(tmp_path).ordered
    (tmp_path / "order.txt").write_text(
        "\n".join(f"z{len(names) - i:03d}" for i in range(len(names))))
    dump = read_dump(tmp_path)
    assert dump.ordered and list(dump.values)[0] == f"z{len(names):03d}"
    assert diff_dump(tiny_capture, dump).passed


def test_numpy_port_passes_and_its_faults_are_found(tmp_path, minilm_capture_file):
    """The worked example: a NumPy BERT (no torch) diffed against the real MiniLM."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[2] / "examples" / "numpy_port" / "bert_numpy.py"
    reference = read_capture(minilm_capture_file)
    expected = {None: None, "gelu-tanh": "L3.gelu", "kv-swapped": "L2.context",
                "position-offset": "emb.sum"}
    for fault, tensor in expected.items():
        out = tmp_path / f"{fault}.npz"
        subprocess.run([sys.executable, str(script), "--capture", str(minilm_capture_file),
                        "-o", str(out), *(["--fault", fault] if fault else [])],
                       check=True, capture_output=True)
        result = diff_dump(reference, read_dump(out))
        if fault is None:
            assert result.passed, result.summary()
            assert result.alignment.dump_coverage == 1.0  # every dumped tensor paired
            assert result.alignment.coverage_text == (
                "63 of the reference's 81 nodes paired; 63 of the dump's 63 tensors paired")
        else:
            assert not result.passed
            assert result.first_divergence.candidate_node == tensor, result.summary()


def test_a_dump_divergence_gets_tested_hints_from_the_live_reference(minilm,
                                                                    minilm_capture_file,
                                                                    tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[2] / "examples" / "numpy_port" / "bert_numpy.py"
    out = tmp_path / "tanh.npz"
    subprocess.run([sys.executable, str(script), "--capture", str(minilm_capture_file), "-o",
                    str(out), "--fault", "gelu-tanh"], check=True, capture_output=True)
    result = diff_dump(read_capture(minilm_capture_file), read_dump(out),
                       reference_model=minilm.model)
    assert any("tanh approximation of GELU" in h for h in result.first_divergence.hints)
