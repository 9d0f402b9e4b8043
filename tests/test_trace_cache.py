"""The trace cache: hits give the same graph on the new model's weights; misses; no files."""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest
import torch

from introspect.models.load import load_model
from introspect.tracing import cache as trace_cache
from introspect.tracing.tracer import trace_module
from tests.conftest import make_batch
from tests.test_fast_trace import _node_rows


@pytest.fixture(autouse=True)
def cache_folder(tmp_path, monkeypatch):
    """An empty cache in memory, and the folder an earlier version kept entries in."""
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


def test_a_hit_is_the_same_graph_on_the_new_models_own_weights(cache_folder):
    model, inputs = _model(), make_batch(2, 9, padded=True)
    traced = trace_module(model, inputs)
    assert len(trace_cache._MEMORY) == 1
    other = _with_other_weights(model)
    hit = trace_module(other, inputs)
    assert len(trace_cache._MEMORY) == 1  # a hit, no second entry
    assert _same_graph(hit, traced)
    assert _same_graph(hit, trace_module(other, inputs, cache=False))
    with torch.no_grad():
        for m, result in ((model, traced), (other, hit)):  # never the other model's weights
            expected = m(**inputs).last_hidden_state
            assert torch.equal(result.gm(**inputs)["last_hidden_state"], expected)
        assert not torch.equal(hit.gm(**inputs)["last_hidden_state"],
                               traced.gm(**inputs)["last_hidden_state"])
    assert hit.gm is not traced.gm and hit.gm.graph is not traced.gm.graph
    assert not cache_folder.parent.exists()  # nothing written anywhere


def test_a_changed_config_shape_or_mode_misses(cache_folder):
    model, inputs = _model(), make_batch(2, 9, padded=True)
    trace_module(model, inputs)
    trace_module(_model(layer_norm_eps=1e-5), inputs)
    trace_module(model, make_batch(3, 9, padded=True))
    trace_module(model.train(), inputs)
    model.eval()
    trace_module(model.double(), {k: v for k, v in inputs.items()})
    assert len(trace_cache._MEMORY) == 5


def test_the_opt_out_leaves_no_trace(cache_folder, monkeypatch):
    monkeypatch.setenv("INTROSPECT_NO_CACHE", "1")
    model, inputs = _model(), make_batch(2, 9, padded=True)
    first, second = trace_module(model, inputs), trace_module(model, inputs)
    assert not cache_folder.parent.exists()
    assert not trace_cache._MEMORY
    assert _same_graph(first, second)


def test_the_cache_folder_is_never_read_written_nor_pruned(cache_folder, monkeypatch):
    # An earlier version pruned every *.json beyond 256 in its folder, user files included
    # (45 of 300 lost). Pointed at a folder of 300 user files, nothing is touched now.
    monkeypatch.setenv("INTROSPECT_CACHE_DIR", str(cache_folder.parent))
    cache_folder.mkdir(parents=True)
    user_files = {}
    for i in range(300):
        path = (cache_folder if i % 2 else cache_folder.parent) / f"{i:03d}_results.json"
        path.write_text(json.dumps({"run": i}))
        os.utime(path, (1_000_000 + i, 1_000_000 + i))  # older than anything the cache makes
        user_files[path] = path.read_bytes()
    model = _model()
    for size in range(3, 8):
        trace_module(model, make_batch(2, size, padded=True))
    assert len(trace_cache._MEMORY) == 5
    found = sorted(p for p in cache_folder.parent.rglob("*") if p.is_file())
    assert found == sorted(user_files)
    assert all(path.read_bytes() == data for path, data in user_files.items())


@pytest.mark.parametrize("entry", ["os.system", "torch.os.system", "garbage", "truncated",
                                   "missing module"])
def test_a_crafted_or_damaged_file_where_entries_were_kept_runs_nothing(cache_folder, entry,
                                                                       monkeypatch, tmp_path):
    # Entries of the earlier disk layer's format, under the exact name it would have read
    # for this model: one naming os.system (also through torch's own ``os``), one naming a
    # module that does not exist, damaged ones. Nothing is read; the model is traced.
    monkeypatch.chdir(tmp_path)
    model, inputs = _model(), make_batch(2, 9, padded=True)
    key = trace_cache.cache_key(model, inputs, True)
    assert key is not None
    target = {"os.system": ["os", "system"], "torch.os.system": ["torch", "os.system"],
              "missing module": ["torch.no_such_module", "f"]}.get(entry, ["os", "system"])
    node = {"op": "call_function", "name": "boom", "target": {"object": target},
            "args": {"tuple": ["touch pwned"]}, "kwargs": {"dict": []}, "type": None,
            "meta": {}}
    text = json.dumps({"format": 3, "key": key, "nodes": [node], "values": [],
                       "input_names": list(inputs), "output_names": ["output"],
                       "decisions": [], "notes": [], "records": []})
    if entry == "garbage":
        text = "\x80\x04not json at all"
    elif entry == "truncated":
        text = text[: len(text) // 2]
    for folder in (cache_folder, Path(tmp_path) / "own" / "graphs"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{key}.json").write_text(text)
    monkeypatch.setenv("INTROSPECT_CACHE_DIR", str(Path(tmp_path) / "own"))
    traced = trace_module(model, inputs)
    assert "boom" not in {n.name for n in traced.gm.graph.nodes}
    assert _same_graph(traced, trace_module(model, inputs, cache=False))
    with torch.no_grad():
        assert torch.equal(traced.gm(**inputs)["last_hidden_state"],
                           model(**inputs).last_hidden_state)
    assert not (Path(tmp_path) / "pwned").exists()
    assert (cache_folder / f"{key}.json").read_text() == text  # left as it was


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


def test_a_port_is_never_cached_whatever_its_attributes(cache_folder):
    inputs = {"input_ids": torch.ones(2, 4, dtype=torch.long)}
    plain = trace_module(_Flagged({"fault": None}), inputs).gm.code
    assert "tanh" in trace_module(_Flagged({"fault": "tanh"}), inputs).gm.code
    assert trace_module(_Flagged({"fault": None}), inputs).gm.code == plain
    scaled = _Flagged({"fault": None}, types.SimpleNamespace(scale=True))
    assert "mul" in trace_module(scaled, inputs).gm.code
    assert "mul" not in trace_module(
        _Flagged({"fault": None}, types.SimpleNamespace(scale=False)), inputs).gm.code
    assert not trace_cache._MEMORY
    assert trace_cache.cache_key(scaled, inputs, True) is None
    assert "tests.test_trace_cache._Flagged is not from an installed package" \
        in trace_cache.why_uncacheable(scaled)


def test_a_forward_set_on_the_instance_is_never_cached(cache_folder):
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
    assert not trace_cache._MEMORY


def test_a_hit_carries_the_records_of_a_fresh_trace(cache_folder):
    model, inputs = _model(), make_batch(2, 9, padded=True)
    traced = trace_module(model, inputs)
    hit = trace_module(_with_other_weights(model), inputs)
    assert hit.records == traced.records  # every field, the shapes and params included
    assert hit.records == trace_module(model, inputs, cache=False).records
    assert len(hit.records) == len(hit.gm.graph.nodes)


def test_a_cached_graph_is_never_shared(cache_folder):
    model, inputs = _model(), make_batch(2, 9, padded=True)
    traced = trace_module(model, inputs)
    first = trace_module(model, inputs)
    for node in list(first.gm.graph.nodes):  # a user's graph surgery on the first hit
        node.meta["touched"] = True
    second, third = trace_module(model, inputs), trace_module(model, inputs)
    assert len({id(r.gm.graph) for r in (traced, first, second, third)}) == 4
    assert not any("touched" in n.meta for n in second.gm.graph.nodes)
    assert _same_graph(second, traced) and _same_graph(third, traced)


def test_no_code_is_generated_until_the_graph_is_called_or_read(cache_folder):
    model, inputs = _model(), make_batch(2, 9, padded=True)
    trace_module(model, inputs)
    traced = trace_module(model, inputs)  # a hit
    generated = type(traced.gm).forward is not type(traced.gm)._lazy_forward
    assert not generated  # tables, drawings and the diff's Interpreter need no code
    with torch.no_grad():
        assert torch.equal(traced.gm(**inputs)["last_hidden_state"],
                           model(**inputs).last_hidden_state)
    assert "def forward(self, input_ids" in traced.gm.code


def test_memory_keeps_the_most_recently_used_entries(cache_folder, monkeypatch):
    monkeypatch.setattr(trace_cache, "MEMORY_ENTRIES", 2)
    model = _model()
    first, second, third = (make_batch(2, n, padded=True) for n in (5, 6, 7))
    keys = [trace_cache.cache_key(model, b, True) for b in (first, second, third)]
    trace_module(model, first)
    trace_module(model, second)
    trace_module(model, first)  # a hit: the first is now the most recent
    trace_module(model, third)  # a third entry: the least recently used (second) goes
    assert sorted(trace_cache._MEMORY) == sorted([keys[0], keys[2]])
