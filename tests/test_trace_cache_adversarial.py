"""The trace cache never serves one model's graph to another that differs from it.

Each case builds two models that differ only through one mechanism a cache key could
miss (a hook, an instance override, a class patch, a patched module global, a registry
entry, a mutated config, a class made by ``exec`` or in a test file), traces both in one
process with the cache on, and checks that the second is never a hit and that each
traced graph computes what its own eager model computes. An installed HF model is still
served from the cache.
"""

from __future__ import annotations

import functools
import types

import pytest
import torch
import transformers
from transformers.models.bert import modeling_bert

from introspect.models.load import load_model
from introspect.tracing import cache as trace_cache
from introspect.tracing.tracer import trace_module
from tests.conftest import make_batch

INPUTS = make_batch(2, 9, padded=True)


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch):
    monkeypatch.delenv("INTROSPECT_NO_CACHE", raising=False)
    trace_cache.clear_memory()
    yield
    trace_cache.clear_memory()


@pytest.fixture
def hits(monkeypatch):
    """Every lookup that found a graph, as the key it was found under."""
    found: list[str] = []
    recall = trace_cache.recall

    def spy(key: str):
        entry = recall(key)
        if entry is not None:
            found.append(key)
        return entry

    monkeypatch.setattr(trace_cache, "recall", spy)
    return found


def _tiny(attn: str = "sdpa", head: str = "base") -> torch.nn.Module:
    """bert-tiny with every LayerNorm and bias moved off (1, 0), the same every call."""
    model = load_model("bert-tiny", head=head, attn=attn).model
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return model


def _eager(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(**INPUTS).last_hidden_state


def _traced(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return trace_module(model, INPUTS).gm(**INPUTS)["last_hidden_state"]


def _tanh_intermediate(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """BertIntermediate.forward with the tanh GELU: a port's classic fault."""
    return torch.nn.functional.gelu(self.dense(hidden_states), approximate="tanh")


def test_an_installed_hf_model_is_served_from_the_cache(hits):
    first, second = _tiny(), _tiny()
    with torch.no_grad():
        second.encoder.layer[1].output.dense.weight.mul_(1.5)  # other weights, same graph
    assert torch.equal(_traced(first), _eager(first))
    assert hits == []
    assert torch.equal(_traced(second), _eager(second))
    assert len(hits) == 1  # the second model took the first one's graph, on its own weights
    assert trace_cache.why_uncacheable(first) is None


def _served_apart(plain, changed, hits, *, traced_follows_eager: bool = True) -> None:
    """``changed`` differs from ``plain`` eagerly; tracing both never shares a graph."""
    plain_eager, changed_eager = _eager(plain), _eager(changed)
    assert not torch.allclose(plain_eager, changed_eager)  # the mechanism really acts
    assert torch.equal(_traced(plain), plain_eager)
    changed_traced = _traced(changed)
    assert hits == []  # never served the plain model's graph
    if traced_follows_eager:
        assert torch.equal(changed_traced, changed_eager)
    assert trace_cache.cache_key(changed, INPUTS, True) is None


def _with_hook(kind: str):
    model = _tiny()
    target = model.encoder.layer[1].output
    if kind == "forward":
        target.register_forward_hook(lambda module, args, output: output * 1.01)
    else:
        target.register_forward_pre_hook(lambda module, args: (args[0] * 1.01, *args[1:]))
    return model


@pytest.mark.parametrize("kind", ["forward", "pre"])
def test_a_hooked_model_is_never_cached(hits, kind):
    # fx calls forward itself and skips hooks (the diff records eagerly instead); what
    # the cache owes is never to hand the hooked model the plain model's entry.
    _served_apart(_tiny(), _with_hook(kind), hits, traced_follows_eager=False)
    assert "hook" in trace_cache.why_uncacheable(_with_hook(kind))


def test_a_global_module_hook_turns_the_cache_off(hits):
    plain = _tiny()
    trace_module(plain, INPUTS)
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, output: output)
    try:
        assert trace_cache.cache_key(plain, INPUTS, True) is None
        trace_module(plain, INPUTS)
        assert hits == []
    finally:
        handle.remove()
    trace_module(plain, INPUTS)
    assert len(hits) == 1


def _override(kind: str) -> torch.nn.Module:
    """bert-tiny whose layer 1 intermediate runs the tanh GELU, set on the instance."""
    model = _tiny()
    module = model.encoder.layer[1].intermediate
    if kind == "function":
        module.forward = lambda hidden_states: _tanh_intermediate(module, hidden_states)
    elif kind == "bound method":
        module.forward = types.MethodType(_tanh_intermediate, module)
    elif kind == "partial":
        module.forward = functools.partial(_tanh_intermediate, module)
    elif kind == "callable object":
        class Forward:
            def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
                return _tanh_intermediate(module, hidden_states)
        module.forward = Forward()
    elif kind == "torch built-in":  # at home in torch, but set as the activation's forward
        module.intermediate_act_fn.forward = torch.tanh
    elif kind == "activation swapped":  # a torch built-in, but not the one HF set
        module.intermediate_act_fn.act = functools.partial(torch.nn.functional.gelu,
                                                           approximate="tanh")
    return model


@pytest.mark.parametrize("kind", ["function", "bound method", "partial", "callable object",
                                  "torch built-in", "activation swapped"])
def test_an_instance_override_is_never_cached(hits, kind):
    _served_apart(_tiny(), _override(kind), hits)


def test_a_private_instance_attribute_is_keyed():
    plain, flagged = _tiny(), _tiny()
    flagged.encoder.layer[1].intermediate._approx = "tanh"  # read by nothing in HF
    assert trace_cache.cache_key(flagged, INPUTS, True) \
        != trace_cache.cache_key(plain, INPUTS, True)
    flagged.encoder.layer[1].intermediate._approx = {"by id": lambda x: x}
    assert trace_cache.cache_key(flagged, INPUTS, True) is None  # not a plain value


def test_a_class_patch_is_never_served(hits, monkeypatch):
    model = _tiny()
    plain_eager = _eager(model)
    assert torch.equal(_traced(model), plain_eager)
    with monkeypatch.context() as patch:
        patch.setattr(modeling_bert.BertIntermediate, "forward", _tanh_intermediate)
        patched_eager = _eager(model)
        assert not torch.allclose(plain_eager, patched_eager)
        assert torch.equal(_traced(model), patched_eager)
        assert hits == []
        assert "patched" in trace_cache.why_uncacheable(model)
    assert torch.equal(_traced(model), plain_eager)
    assert len(hits) == 1  # put back, the entry of the unpatched class serves again


def test_kernels_condition_on_an_activation_is_served_but_a_replaced_one_is_not(hits,
                                                                               monkeypatch):
    # transformers 5.25 leaves kernels' own kernel_condition on GELUActivation (called only by
    # kernels.kernelize, never by forward): the installed model is served. A condition of
    # the user's under that name, or a kernelized (instance-swapped) forward, is refused.
    from transformers.activations import GELUActivation

    model = _tiny()
    trace_module(model, INPUTS)
    trace_module(model, INPUTS)
    assert len(hits) == 1
    monkeypatch.setattr(GELUActivation, "kernel_condition",
                        staticmethod(lambda module: True), raising=False)
    assert trace_cache.cache_key(model, INPUTS, True) is None
    assert "kernel_condition is patched" in trace_cache.why_uncacheable(model)
    monkeypatch.undo()
    assert trace_cache.cache_key(model, INPUTS, True) is not None
    activation = model.encoder.layer[0].intermediate.intermediate_act_fn
    monkeypatch.setattr(activation, "forward",
                        types.MethodType(lambda self, x: torch.tanh(x), activation),
                        raising=False)
    assert trace_cache.cache_key(model, INPUTS, True) is None
    assert torch.equal(_traced(model), _eager(model))


def test_a_class_patched_with_another_installed_method_is_never_served(hits, monkeypatch):
    model = _tiny()
    trace_module(model, INPUTS)
    # BertOutput.forward and BertSelfOutput.forward are the same code under two names:
    # still a patch, still refused (only the class's own definition passes).
    monkeypatch.setattr(modeling_bert.BertOutput, "forward",
                        modeling_bert.BertSelfOutput.forward)
    assert trace_cache.cache_key(model, INPUTS, True) is None
    assert "BertSelfOutput.forward" in trace_cache.why_uncacheable(model)


def test_a_plain_class_attribute_set_at_run_time_is_keyed(monkeypatch):
    model = _tiny()
    before = trace_cache.cache_key(model, INPUTS, True)
    monkeypatch.setattr(modeling_bert.BertLayer, "use_the_fault", True, raising=False)
    assert trace_cache.cache_key(model, INPUTS, True) not in (None, before)


def _scaled_eager_attention(module, query, key, value, attention_mask, **kwargs):
    """HF's eager attention with the scores scaled once more (a patched module global)."""
    kwargs["scaling"] = kwargs.get("scaling", query.shape[-1] ** -0.5) * 1.5
    return modeling_bert_eager(module, query, key, value, attention_mask, **kwargs)


modeling_bert_eager = modeling_bert.eager_attention_forward


def test_a_patched_module_global_is_never_served(hits, monkeypatch):
    model = _tiny(attn="eager")
    plain_eager = _eager(model)
    assert torch.equal(_traced(model), plain_eager)
    monkeypatch.setattr(modeling_bert, "eager_attention_forward", _scaled_eager_attention)
    patched_eager = _eager(model)
    assert not torch.allclose(plain_eager, patched_eager)
    assert torch.equal(_traced(model), patched_eager)
    assert hits == []
    assert "eager_attention_forward" in trace_cache.why_uncacheable(model)


def test_a_module_global_swapped_for_another_installed_function_misses(monkeypatch):
    model = _tiny(attn="eager")
    before = trace_cache.cache_key(model, INPUTS, True)
    monkeypatch.setattr(modeling_bert, "eager_attention_forward",
                        transformers.integrations.sdpa_attention.sdpa_attention_forward)
    assert trace_cache.cache_key(model, INPUTS, True) not in (None, before)


def test_an_attention_function_registered_over_sdpa_is_never_served(hits, monkeypatch):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def scaled(module, query, key, value, attention_mask, **kwargs):
        kwargs["scaling"] = query.shape[-1] ** -0.5 * 1.5
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    model = _tiny()
    plain_eager = _eager(model)
    assert torch.equal(_traced(model), plain_eager)
    registry = ALL_ATTENTION_FUNCTIONS._global_mapping
    monkeypatch.setitem(registry, "sdpa", scaled)  # changed in place: the same dict
    patched_eager = _eager(model)
    assert not torch.allclose(plain_eager, patched_eager)
    assert torch.equal(_traced(model), patched_eager)
    assert hits == []


def test_a_config_mutated_after_construction_is_keyed_by_its_current_values(hits):
    plain, changed = _tiny(), _tiny()
    changed.config.output_hidden_states = True  # read by forward, after construction
    first, second = trace_module(plain, INPUTS), trace_module(changed, INPUTS)
    assert "hidden_states" not in first.output_names
    assert "hidden_states" in second.output_names
    assert hits == []
    changed.config._attn_implementation = "eager"  # a private field, not in to_dict()
    eager_graph = trace_module(changed, INPUTS)
    assert hits == []
    assert "scaled_dot_product_attention" in second.gm.code
    assert "scaled_dot_product_attention" not in eager_graph.gm.code


def test_an_environment_variable_is_keyed(monkeypatch):
    model = _tiny()
    before = trace_cache.cache_key(model, INPUTS, True)
    monkeypatch.setenv("INTROSPECT_TEST_SWITCH", "1")
    assert trace_cache.cache_key(model, INPUTS, True) not in (None, before)


_NOTEBOOK_CELL = '''
class BertIntermediate(modeling_bert.BertIntermediate):
    def forward(self, hidden_states):
        return torch.nn.functional.gelu(self.dense(hidden_states), approximate="tanh")
'''


@pytest.mark.parametrize("module_name", ["__main__", "transformers.models.bert.modeling_bert"])
def test_a_class_made_by_exec_is_never_cached(hits, module_name):
    # A notebook cell, and one that even claims to be HF's module: neither is at home.
    namespace = {"modeling_bert": modeling_bert, "torch": torch, "__name__": module_name}
    exec(_NOTEBOOK_CELL, namespace)  # noqa: S102 - what a notebook does
    changed = _tiny()
    layer = changed.encoder.layer[1]
    replacement = namespace["BertIntermediate"](changed.config)
    replacement.load_state_dict(layer.intermediate.state_dict())
    layer.intermediate = replacement.eval()
    _served_apart(_tiny(), changed, hits)
    assert "not" in trace_cache.why_uncacheable(changed)


class _PortLayer(torch.nn.Module):
    """A port's layer whose GELU is chosen by a private attribute (issue 20's example)."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = torch.nn.Linear(8, 8)
        self._approx = "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.dense(x), approximate=self._approx)


class _Port(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 8)
        self.layers = torch.nn.ModuleList(_PortLayer() for _ in range(3))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_port_is_never_cached_and_its_private_fault_is_traced(hits):
    inputs = {"input_ids": torch.arange(18).reshape(2, 9)}
    torch.manual_seed(0)
    plain = _Port().eval()
    faulty = _Port().eval()
    faulty.load_state_dict(plain.state_dict())
    faulty.layers[2]._approx = "tanh"  # only the third layer: a replay would miss it
    assert trace_cache.cache_key(plain, inputs, True) is None
    assert "never cached" in trace_cache.why_uncacheable(plain)
    with torch.no_grad():
        for model in (plain, faulty, plain, faulty):
            traced = trace_module(model, inputs).gm(**inputs)["output"]
            assert torch.equal(traced, model(**inputs))
        assert not torch.equal(faulty(**inputs), plain(**inputs))
    assert hits == []


def test_only_layers_of_installed_unpatched_classes_are_replayed(monkeypatch):
    from introspect import scratch
    from introspect.tracing import replay as layer_replay

    replayed: list[str] = []
    replay = layer_replay.replay

    def counted(record, path, mapping, tracer):
        replayed.append(path)
        return replay(record, path, mapping, tracer)

    monkeypatch.setattr(layer_replay, "replay", counted)
    hf = _tiny()
    trace_module(hf, INPUTS, cache=False)
    assert replayed == ["encoder.layer.1"]  # HF's layers: replayed
    replayed.clear()
    trace_module(scratch.BertModel.from_hf(hf).eval(), INPUTS, cache=False)
    assert replayed == ["encoder.layer.1"]  # introspect's own BERT: replayed
    replayed.clear()
    hf.encoder.layer[1].intermediate._approx = "tanh"  # a private difference: traced
    trace_module(hf, INPUTS, cache=False)
    assert replayed == []
    port = _Port()
    trace_module(port, {"input_ids": torch.arange(18).reshape(2, 9)}, cache=False)
    assert replayed == []  # a port's layers, alike as they look, are each traced


def test_a_patched_method_of_an_hf_registry_is_never_served(hits, monkeypatch):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import AttentionInterface

    def scaled(module, query, key, value, attention_mask, **kwargs):
        kwargs["scaling"] = query.shape[-1] ** -0.5 * 1.5
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    model = _tiny()
    plain_eager = _eager(model)
    assert torch.equal(_traced(model), plain_eager)
    # Not a class of the model, not a module global: the class of an object HF's code
    # reads (ALL_ATTENTION_FUNCTIONS), patched.
    monkeypatch.setattr(AttentionInterface, "get_interface",
                        lambda self, name, default: scaled)
    patched_eager = _eager(model)
    assert not torch.allclose(plain_eager, patched_eager)
    assert torch.equal(_traced(model), patched_eager)
    assert hits == []
    assert "AttentionInterface" in trace_cache.why_uncacheable(model)


def test_a_generation_config_is_keyed_by_its_values():
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100)
    model = transformers.GPT2LMHeadModel(config).eval()
    inputs = {"input_ids": torch.arange(8).reshape(2, 4)}
    before = trace_cache.cache_key(model, inputs, True)
    assert before is not None
    model.generation_config.max_length = 7
    assert trace_cache.cache_key(model, inputs, True) not in (None, before)
