"""Caches read per layer and compared by value, whatever their layout."""

from __future__ import annotations

import pytest
import torch

from introspect.diff.generation.caches import cache_layers, compare_cached
from introspect.diff.tolerance import Budget
from tests.bounds import below

BUDGET = Budget(1e-5, 1.3e-6)


@pytest.fixture
def reference():
    return torch.randn(1, 2, 5, 4, generator=torch.Generator().manual_seed(0))  # (B, nkv, S, hd)


def test_same_layout(reference):
    found = compare_cached(reference, reference.clone(), BUDGET)
    assert found.passed and found.max_abs_err == 0.0 and found.layout == "same layout"


def test_sequence_first_and_preallocated(reference):
    static = torch.zeros(1, 16, 2, 4)  # (B, max_len, nkv, hd)
    static[:, :5] = reference.transpose(1, 2)
    found = compare_cached(reference, static, BUDGET)
    assert found.passed and found.allocated == 16
    assert found.layout == "permute (0, 2, 1, 3), sequence axis pre-allocated to 16 (5 filled)"
    assert found.tail is not None and not found.tail.any()


def test_heads_merged_and_repeated(reference):
    merged = reference.transpose(1, 2).reshape(1, 5, 8)  # (B, S, nkv * hd)
    assert compare_cached(reference, merged, BUDGET).layout.endswith("heads merged")
    repeated = reference.repeat_interleave(3, dim=1)  # (B, nh, S, hd): GQA heads stored
    found = compare_cached(reference, repeated, BUDGET)
    assert found.passed and "key/value heads repeated x3" in found.layout


def test_a_difference_fails_in_any_layout(reference):
    static = torch.zeros(1, 16, 2, 4)
    static[:, :5] = reference.transpose(1, 2)
    static[0, 3, 1, 2] += 1e-3  # one value of one cached key
    found = compare_cached(reference, static, BUDGET)
    # 1e-3 added to a value of ~1 in float32: off by one rounding of the sum, 6e-8 (6e-5 of it)
    assert not found.passed and below(abs(found.max_abs_err / 1e-3 - 1), 1e-3, "1e-3 found")
    assert found.layout.startswith("permute (0, 2, 1, 3)")


def test_too_short_fits_no_layout(reference):
    found = compare_cached(reference, reference[:, :, :4], BUDGET)
    assert not found.passed and found.layout == "" and found.max_abs_err is None


def test_cache_forms_are_read():
    k, v = torch.ones(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)
    assert cache_layers(((k, v), (k, v)))[1][0] is k  # legacy tuple per layer

    class Layer:
        def __init__(self) -> None:
            self.k_cache, self.v_cache = k, v

    assert len(cache_layers([Layer(), Layer(), Layer()])) == 3  # a port's own objects

    class Own(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(torch.nn.Module() for _ in range(2))
            for block in self.blocks:
                block.register_buffer("cache_k", k)
                block.register_buffer("cache_v", v)

    assert [p[1] is v for p in cache_layers(Own())] == [True, True]
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.update(k, v, 0)
    cache.update(k + 1, v, 1)
    assert torch.equal(cache_layers(cache)[1][0], k + 1)
    assert cache_layers(None) is None and cache_layers("nothing") is None


def test_one_object_holding_every_layer_in_lists_is_read():
    """A static cache as ports write it (probe round n): one object, ``k_cache`` a list of
    each layer's preallocated keys; it was "no keys and values introspect can read"."""
    k, v = torch.ones(1, 2, 8, 4), torch.zeros(1, 2, 8, 4)

    class StaticCache:
        def __init__(self) -> None:
            self.k_cache = [k, k + 1, k + 2]
            self.v_cache = [v, v, v]
            self.length = 5

    layers = cache_layers(StaticCache())
    assert layers is not None and len(layers) == 3
    assert torch.equal(layers[2][0], k + 2) and layers[0][1] is v


def test_a_layers_keys_values_and_length_are_read():
    """``(k, v, length)`` per layer (probe round n): the two tensors are the pair."""
    k, v = torch.ones(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)
    layers = cache_layers([(k, v, 3), (k, v, 3)])
    assert layers is not None and [p[0] is k for p in layers] == [True, True]
    # two tensors of other shapes, or a third tensor, are no layer's pair
    assert cache_layers([(k, v[..., :2], 3)]) is None
    assert cache_layers([(k, v, k)]) is None


def test_one_pair_of_tensors_with_the_layers_first_is_read_per_layer():
    """``self.k = torch.zeros(layers, B, S_max, nh, hd)`` (probe round n): read as one
    layer's keys, it matched the reference's in no layout ("18 cached tensors in no
    layout", "keys before their rotation" said of a GPT-2)."""
    k, v = torch.randn(3, 1, 16, 2, 4), torch.randn(3, 1, 16, 2, 4)

    class Preallocated:
        def __init__(self) -> None:
            self.k, self.v, self.pos = k, v, 5

    layers = cache_layers(Preallocated())
    assert layers is not None and len(layers) == 3
    assert torch.equal(layers[1][0], k[1]) and torch.equal(layers[2][1], v[2])
    # a layer's own five-dimensional keys, in a list of layers, stay whole
    assert cache_layers([Preallocated(), Preallocated()])[0][0] is k
