"""introspect.dump.capture: what a capture holds, and that it survives the file."""

from __future__ import annotations

import json

import pytest
import torch

from introspect.dump import capture, capture_bytes, read_capture, read_dump
from introspect.dump.capture import LAYOUT_OPS
from introspect.dump.formats import index_csv, index_json
from introspect.errors import InputError


def test_capture_keeps_computing_nodes_in_graph_order(tiny_capture):
    indices = [e.index for e in tiny_capture.entries]
    assert indices == sorted(indices)
    assert not any(e.op in LAYOUT_OPS for e in tiny_capture.entries)
    assert {e.layer for e in tiny_capture.entries} == {
        "embeddings", "encoder.layer.0", "encoder.layer.1", "pooler"}
    ops = {e.op for e in tiny_capture.entries}
    assert {"Linear", "LayerNorm", "scaled_dot_product_attention", "add"} <= ops


def test_captured_values_are_the_models(tiny_models, tiny_capture):
    loaded = tiny_models("base")
    with torch.no_grad():
        out = loaded.model(**tiny_capture.inputs)
    last = [e for e in tiny_capture.entries if e.layer == "encoder.layer.1"][-1]
    assert torch.equal(tiny_capture.values[last.name], out.last_hidden_state)
    pooled = [e for e in tiny_capture.entries if e.layer == "pooler"][-1]
    assert torch.equal(tiny_capture.values[pooled.name], out.pooler_output)


def test_layer_outputs_and_chosen_layers(tiny_models):
    import introspect

    loaded = tiny_models("base")
    inputs = introspect.tokenize(loaded.tokenizer)
    layers = capture(loaded.model, inputs, select="layers")
    assert [e.layer for e in layers.entries] == [
        "embeddings", "encoder.layer.0", "encoder.layer.1", "pooler"]
    one = capture(loaded.model, inputs, layers=["1"])
    assert {e.layer for e in one.entries} == {"encoder.layer.1"}
    with pytest.raises(InputError, match="no layer 'encoder.layer.7'"):
        capture(loaded.model, inputs, layers=["7"])
    with pytest.raises(InputError, match="unknown selection"):
        capture(loaded.model, inputs, select="some")


def test_capture_round_trips_through_the_file(tmp_path, tiny_capture):
    path = tmp_path / "ref.safetensors"
    path.write_bytes(capture_bytes(tiny_capture))
    again = read_capture(path)
    assert [e.name for e in again.entries] == [e.name for e in tiny_capture.entries]
    assert again.entries == tiny_capture.entries
    assert all(torch.equal(again.values[k], v) for k, v in tiny_capture.values.items())
    assert all(torch.equal(again.inputs[k], v) for k, v in tiny_capture.inputs.items())
    assert again.texts == tiny_capture.texts and again.tokens == tiny_capture.tokens
    assert again.noise == tiny_capture.noise and again.noise
    assert set(again.metadata) == {"introspect", "torch", "transformers"}
    assert read_dump(path).ordered  # the order travels in the metadata


def test_capture_bytes_are_deterministic(tiny_models):
    import introspect

    loaded = tiny_models("base")
    inputs = introspect.tokenize(loaded.tokenizer)
    assert capture_bytes(capture(loaded.model, inputs)) == capture_bytes(
        capture(loaded.model, inputs))


def test_index_describes_every_tensor(tiny_capture):
    document = json.loads(index_json(tiny_capture))
    assert [t["name"] for t in document["tensors"]] == [e.name for e in tiny_capture.entries]
    assert document["inputs"]["input_ids"] == list(tiny_capture.inputs["input_ids"].shape)
    lines = index_csv(tiny_capture).splitlines()
    assert lines[0] == "name,index,module,layer,op,shape,dtype,bytes"
    assert len(lines) == len(tiny_capture.entries) + 1


def test_a_plain_dump_is_not_a_capture(tmp_path):
    import numpy as np

    np.savez(tmp_path / "port.npz", x=np.zeros((2, 3), np.float32))
    with pytest.raises(InputError, match="not a capture"):
        read_capture(tmp_path / "port.npz")
