"""The trace cache: hits give the same graph on the new model's weights; misses and damage."""

from __future__ import annotations

import json

import pytest
import torch

from introspect import trace_cache
from introspect.load import load_model
from introspect.tracer import trace_module
from tests.conftest import make_batch
from tests.test_fast_trace import _node_rows


@pytest.fixture(autouse=True)
def cache_folder(tmp_path, monkeypatch):
    """A cache of this test's own, empty in memory and on disk."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("INTROSPECT_CACHE_DIR", raising=False)
    monkeypatch.delenv("INTROSPECT_NO_CACHE", raising=False)
    trace_cache.clear_memory()
    yield tmp_path / "introspect" / "graphs"
    trace_cache.clear_memory()


def _model(seed: int = 0, **config):
    torch.manual_seed(seed)
    model = load_model("bert-tiny").model
    if config:
        import transformers

        changed = transformers.BertConfig(**{**model.config.to_dict(), **config})
        model = transformers.BertModel(changed).eval()
    return model


def _same_graph(a, b) -> bool:
    return _node_rows(a.gm) == _node_rows(b.gm) and a.gm.code == b.gm.code \
        and a.decisions == b.decisions and a.output_names == b.output_names


def _with_other_weights(model):
    other = _model()
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(torch.randn_like(parameter))
    return other


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_a_hit_is_the_same_graph_on_the_new_models_own_weights(cache_folder, where):
    model, inputs = _model(), make_batch(2, 9, padded=True)
    traced = trace_module(model, inputs)
    assert [p.suffix for p in cache_folder.iterdir()] == [".json"]
    if where == "disk":
        trace_cache.clear_memory()
    other = _with_other_weights(model)
    hit = trace_module(other, inputs)
    assert _same_graph(hit, traced)
    assert _same_graph(hit, trace_module(other, inputs, cache=False))
    with torch.no_grad():
        for m, result in ((model, traced), (other, hit)):  # never the other model's weights
            expected = m(**inputs).last_hidden_state
            assert torch.equal(result.gm(**inputs)["last_hidden_state"], expected)
        assert not torch.equal(hit.gm(**inputs)["last_hidden_state"],
                               traced.gm(**inputs)["last_hidden_state"])
    assert hit.gm is not traced.gm and hit.gm.graph is not traced.gm.graph


def test_a_changed_config_shape_or_mode_misses(cache_folder):
    model, inputs = _model(), make_batch(2, 9, padded=True)
    trace_module(model, inputs)
    trace_module(_model(layer_norm_eps=1e-5), inputs)
    trace_module(model, make_batch(3, 9, padded=True))
    trace_module(model.train(), inputs)
    model.eval()
    trace_module(model.double(), {k: v for k, v in inputs.items()})
    assert len(list(cache_folder.iterdir())) == 5


def test_another_version_misses_on_disk(cache_folder, monkeypatch):
    model, inputs = _model(), make_batch(2, 9, padded=True)
    trace_module(model, inputs)
    key = trace_cache.cache_key(model, inputs, True)
    assert trace_cache.read_entry(key) is not None
    monkeypatch.setattr(trace_cache, "_VERSIONS", [("0.0", "0.0", "0.0", "other")])
    assert trace_cache.read_entry(key) is None  # a file of another version is never used
    assert trace_cache.cache_key(model, inputs, True) != key


def test_the_opt_out_leaves_no_trace(cache_folder, monkeypatch):
    monkeypatch.setenv("INTROSPECT_NO_CACHE", "1")
    model, inputs = _model(), make_batch(2, 9, padded=True)
    first, second = trace_module(model, inputs), trace_module(model, inputs)
    assert not cache_folder.exists()
    assert not trace_cache._MEMORY
    assert _same_graph(first, second)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong key", "foreign function"])
def test_a_damaged_entry_is_ignored_and_traced_again(cache_folder, damage):
    model, inputs = _model(), make_batch(2, 9, padded=True)
    traced = trace_module(model, inputs)
    path = next(cache_folder.iterdir())
    text = path.read_text()
    if damage == "garbage":
        path.write_bytes(b"\x80\x04not json at all")
    elif damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "wrong key":
        path.write_text(text.replace(path.stem, "0" * 64))
    else:  # a function outside the modules a cached graph may name is never imported
        path.write_text(text.replace('["builtins", "getattr"]', '["os", "system"]'))
    assert path.read_bytes() != text.encode()
    trace_cache.clear_memory()
    again = trace_module(model, inputs)
    assert _same_graph(again, traced)
    assert json.loads(path.read_text())["key"] == path.stem  # rewritten whole


def test_an_entry_is_plain_json_naming_functions_by_module(cache_folder):
    trace_module(_model(), make_batch(2, 9, padded=True))
    document = json.loads(next(cache_folder.iterdir()).read_text())
    names = {tuple(n["target"]["object"]) for n in document["nodes"]
             if isinstance(n["target"], dict)}
    assert ("torch._C._nn", "scaled_dot_product_attention") in names \
        or any(name[1] == "scaled_dot_product_attention" for name in names)
    assert all(module.split(".")[0] in ("torch", "operator", "_operator", "builtins")
               for module, _ in names)


class _Flagged(torch.nn.Module):
    """A port whose control flow reads plain attributes, as hand-written ports do."""

    def __init__(self, opts: dict, mode=None) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.opts = opts
        self.mode = mode

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.linear(input_ids.float())
        if self.opts["fault"] == "tanh":
            x = torch.tanh(x)
        if self.mode is not None and self.mode.scale:
            x = x * 2
        return x


def test_attributes_in_containers_and_objects_key_the_graph(cache_folder):
    import types

    inputs = {"input_ids": torch.ones(2, 4, dtype=torch.long)}
    plain = trace_module(_Flagged({"fault": None}), inputs).gm.code
    assert "tanh" in trace_module(_Flagged({"fault": "tanh"}), inputs).gm.code
    assert trace_module(_Flagged({"fault": None}), inputs).gm.code == plain  # a hit again
    scaled = _Flagged({"fault": None}, types.SimpleNamespace(scale=True))
    assert "mul" in trace_module(scaled, inputs).gm.code
    assert "mul" not in trace_module(
        _Flagged({"fault": None}, types.SimpleNamespace(scale=False)), inputs).gm.code


def test_a_forward_set_on_the_instance_is_keyed_by_what_it_closes_over(cache_folder):
    inputs = {"input_ids": torch.ones(2, 4, dtype=torch.long)}

    def flagged(fault: str | None) -> torch.nn.Module:
        module = _Flagged({"fault": None})

        def forward(input_ids: torch.Tensor) -> torch.Tensor:
            x = module.linear(input_ids.float())
            return torch.sigmoid(x) if fault == "sigmoid" else x

        module.forward = forward
        return module

    assert "sigmoid" not in trace_module(flagged(None), inputs).gm.code
    assert "sigmoid" in trace_module(flagged("sigmoid"), inputs).gm.code


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_a_hit_carries_the_records_of_a_fresh_trace(cache_folder, where):
    model, inputs = _model(), make_batch(2, 9, padded=True)
    traced = trace_module(model, inputs)
    if where == "disk":
        trace_cache.clear_memory()
    hit = trace_module(_with_other_weights(model), inputs)
    assert hit.records == traced.records  # every field, the shapes and params included
    assert hit.records == trace_module(model, inputs, cache=False).records
    assert len(hit.records) == len(hit.gm.graph.nodes)


def test_a_graph_read_from_disk_is_handed_out_once_and_never_shared(cache_folder):
    model, inputs = _model(), make_batch(2, 9, padded=True)
    traced = trace_module(model, inputs)
    trace_cache.clear_memory()
    first = trace_module(model, inputs)  # takes the graph read from the file as it is
    for node in list(first.gm.graph.nodes):  # a user's graph surgery on the first hit
        node.meta["touched"] = True
    second, third = trace_module(model, inputs), trace_module(model, inputs)
    assert len({id(r.gm.graph) for r in (first, second, third)}) == 3
    assert not any("touched" in n.meta for n in second.gm.graph.nodes)
    assert _same_graph(second, traced) and _same_graph(third, traced)


def test_no_code_is_generated_until_the_graph_is_called_or_read(cache_folder):
    model, inputs = _model(), make_batch(2, 9, padded=True)
    traced = trace_module(model, inputs)
    generated = type(traced.gm).forward is not type(traced.gm)._lazy_forward
    assert not generated  # tables, drawings and the diff's Interpreter need no code
    with torch.no_grad():
        assert torch.equal(traced.gm(**inputs)["last_hidden_state"],
                           model(**inputs).last_hidden_state)
    assert "def forward(self, input_ids" in traced.gm.code


def test_the_disk_keeps_the_most_recently_used_entries(cache_folder, monkeypatch):
    import os
    import time

    monkeypatch.setattr(trace_cache, "DISK_ENTRIES", 2)
    model = _model()
    first, second, third = (make_batch(2, n, padded=True) for n in (5, 6, 7))
    trace_module(model, first)
    trace_module(model, second)
    keys = [trace_cache.cache_key(model, b, True) for b in (first, second, third)]
    for i, key in enumerate(keys[:2]):  # written long ago, the first the older
        os.utime(cache_folder / f"{key}.json", (time.time() - 100 + i, time.time() - 100 + i))
    trace_cache.clear_memory()
    trace_module(model, first)  # read from disk: the first is now the most recent
    trace_module(model, third)  # a third entry: the least recently used (second) goes
    assert sorted(p.stem for p in cache_folder.iterdir()) == sorted([keys[0], keys[2]])
