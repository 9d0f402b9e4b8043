"""Module evidence's pairing reads less, to the same result: the rough ranking
(``pairing._Samples.nearest``) measures a value in full against the first boundaries by
their sampled gap, ties in their order, as sorting every gap gave, though most gaps are only
bounded from below; the boundaries inside a region (``pairing.Boundaries.inside``) are the
scan of every boundary's holders."""

from __future__ import annotations

import copy
import importlib
import math

import pytest
import torch

from introspect.run.capture import capture_calls
from introspect.run.truth import run_truth

pairing = importlib.import_module("introspect.diff.modules.pairing")


@pytest.fixture(scope="module")
def faulty_calls(tiny, port, inputs):
    """The reference's calls and a faulty port's (tanh GELU in layer 0) on bert-tiny."""
    faulty = copy.deepcopy(port).eval()
    faulty.encoder.layer[0].intermediate.intermediate_act_fn = \
        torch.nn.GELU(approximate="tanh")
    tiny.eval()
    with capture_calls(tiny) as reference:
        run_truth(tiny, inputs.tensors)
    with capture_calls(faulty) as candidate:
        run_truth(faulty, inputs.tensors)
    return reference, candidate


def _sorted_in_full(mine, same, sample, count):
    """Every sampled gap read, then sorted (the ranking before ``nearest``)."""
    table, _, rows = same[0].samples._table(same, sample)
    gaps = pairing._largest_gaps(table[[rows[id(b.value)] for b in same]], mine)
    return [same[i] for i in sorted(range(len(same)), key=gaps.__getitem__)[:count]]


def _boundaries(values):
    samples = pairing._Samples()
    return [pairing.Boundary(f"m{i}", "output", v, samples=samples)
            for i, v in enumerate(values)]


def test_decoys_near_on_every_bounding_element_are_read_in_full_and_lose():
    """Decoys equal to the value on every ``_ROUGH``-th element (a bound of 0) and far
    elsewhere: the four read first by bound are all decoys, the nearest is not among them."""
    generator = torch.Generator().manual_seed(0)
    value = torch.randn(6000, generator=generator)
    sample = pairing._sample_index(value.numel())
    mine = value[sample].double()
    values = []
    for i in range(8):  # decoys: far off the bounding columns only
        decoy = value.clone()
        decoy[sample] += 3.0 + i
        decoy[sample[::pairing._ROUGH]] = value[sample[::pairing._ROUGH]]
        values.append(decoy)
    values += [value + 0.5, value + 0.25, value - 0.25, value + 1.0,
               value.clone().fill_(float("nan"))]
    same = _boundaries(values)
    found = same[0].samples.nearest(value, same, sample, 4)
    assert found == _sorted_in_full(mine, same, sample, 4)
    # the tie (+0.25 and -0.25) in their order, then 0.5 and 1.0: no decoy
    assert [b.module for b in found] == ["m9", "m10", "m8", "m11"]


def test_ties_and_nan_keep_the_full_sorts_order():
    generator = torch.Generator().manual_seed(1)
    value = torch.randn(3, 700, generator=generator)
    sample = pairing._sample_index(value.numel())
    mine = value.reshape(-1)[sample].double()
    offsets = [0.5, 0.5, 0.25, math.nan, 0.5, 0.25, 2.0, 0.5, 0.5, 0.125]
    same = _boundaries([value + d for d in offsets])
    for count in (1, 2, 4, 6, len(same)):
        assert same[0].samples.nearest(value, same, sample, count) == \
            _sorted_in_full(mine, same, sample, count)


def test_gaps_kept_for_a_value_rank_as_the_full_sort_in_any_subset_as_the_table_grows():
    """A value's gaps are measured once (``_Samples._gaps_of``): ranked against subsets of
    the boundaries, against boundaries added to the table since, and once edited in place
    (its version moves: measured again), it ranks as the full sort of each does."""
    generator = torch.Generator().manual_seed(3)
    value = torch.randn(6000, generator=generator)
    sample = pairing._sample_index(value.numel())
    offsets = [0.5, 0.25, 2.0, 0.125, 1.0, 0.75, 0.3, 0.6]
    same = _boundaries([value + d * torch.randn(6000, generator=generator) for d in offsets])
    for subset in (same[:3], same[2:], same[::2], same):
        mine = value[sample].double()
        assert same[0].samples.nearest(value, subset, sample, 2) == \
            _sorted_in_full(mine, subset, sample, 2)
    more = [pairing.Boundary(f"n{i}", "output", value + d, samples=same[0].samples)
            for i, d in enumerate([0.01, 3.0])]  # (a row nearer than all: added after)
    for subset in (same + more, more + same[:2]):
        assert same[0].samples.nearest(value, subset, sample, 3) == \
            _sorted_in_full(value[sample].double(), subset, sample, 3)
    value.copy_(same[2].value)  # edited: its own gaps are measured again
    found = same[0].samples.nearest(value, same + more, sample, 3)
    assert found == _sorted_in_full(value[sample].double(), same + more, sample, 3)
    assert found[0] is same[2]


def test_a_bound_equal_to_the_fourth_gap_is_read_and_its_tie_keeps_its_place():
    """The first boundary is off by 0.5 everywhere (its bound is its gap); four after it
    are off by 0.5 only between the bounding elements (a bound of 0): all five tie, and the
    first keeps its place though it is read last."""
    generator = torch.Generator().manual_seed(2)
    value = torch.randint(-1000, 1000, (5000,), generator=generator) / 1024  # + 0.5 exact
    sample = pairing._sample_index(value.numel())
    mine = value[sample].double()
    between = value.clone()
    between[sample] += 0.5
    between[sample[::pairing._ROUGH]] = value[sample[::pairing._ROUGH]]
    same = _boundaries([value + 0.5] + [between.clone() for _ in range(4)])
    found = same[0].samples.nearest(value, same, sample, 4)
    assert [b.module for b in found] == ["m0", "m1", "m2", "m3"]
    assert found == _sorted_in_full(mine, same, sample, 4)


def test_real_boundaries_rank_as_the_full_sort(faulty_calls):
    """Every value of a faulty port's calls against the reference's boundaries of its shape:
    the first four are the full sort's, in its order."""
    reference, candidate = faulty_calls
    boundaries = pairing.reference_boundaries(reference.of_mode("autograd"))
    ranked = 0
    for call in candidate.of_mode("autograd"):
        for leaf in call.inputs + call.outputs:
            same = [b for b in boundaries if b.value.shape == leaf.value.shape]
            if not same:
                continue
            sample = pairing._sample_index(leaf.value.numel())
            mine = leaf.value.reshape(-1)[sample].double()
            found = same[0].samples.nearest(leaf.value, same, sample, 4)
            assert found == _sorted_in_full(mine, same, sample, 4), (call.name, leaf.path)
            ranked += len(same) > 4
    assert ranked > 50


def test_the_boundaries_inside_a_region_are_the_scan_of_their_holders(faulty_calls):
    reference, _ = faulty_calls
    boundaries = pairing.reference_boundaries(reference.of_mode("autograd"))
    names = {m for b in boundaries for m in b.holders}
    regions = {"", "encoder.lay", "encoder.layer.1.attention.self.q", "nowhere"} | names | {
        n.rpartition(".")[0] for n in names}
    for region in regions:
        for returned in (False, True):
            scanned = [b for b in boundaries if any(
                m == region or not region or m.startswith(f"{region}.")
                for m in (b.returned_by if returned else b.holders))]
            assert boundaries.inside(region, returned) == scanned, (region, returned)
            assert pairing._in_region(list(boundaries), region, returned) == scanned
    assert boundaries.inside("") == list(boundaries)
    assert boundaries.inside("encoder.lay") == []  # a name's prefix, no module's path


def test_the_boundaries_of_a_shape_are_the_scan_of_the_region(faulty_calls):
    reference, _ = faulty_calls
    boundaries = pairing.reference_boundaries(reference.of_mode("autograd"))
    shapes = {tuple(b.value.shape) for b in boundaries} | {(3, 5)}
    for region in ("", "encoder.layer.0", "encoder.layer.1.intermediate", "nowhere"):
        inside = boundaries.inside(region)
        for shape in shapes:
            scanned = [b for b in inside if tuple(b.value.shape) == shape
                       and b.value.is_floating_point()]
            assert inside.floating_of_shape(shape) == scanned, (region, shape)
    assert any(len(boundaries.inside("").floating_of_shape(s)) > 1 for s in shapes)


def test_the_weights_under_a_module_are_the_scan_of_every_path(tiny, port):
    relations = pairing.relate_parameters(tiny, port)
    plain = dict(relations)  # a mapping without the index: the scan
    modules = {name for name, _ in port.named_modules()} | {"encoder.lay", "nowhere"}
    for module in modules:
        assert relations.owned(module) == pairing.owned_relations(module, plain), module
        assert pairing.region_of(_Named(module), relations) == \
            pairing.region_of(_Named(module), plain), module
    assert relations.owned("encoder.lay") == []  # a name's prefix, no module's path
    assert len(relations.owned("")) == len(plain)


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


def test_probed_elements_are_read_where_they_lie():
    from introspect.run.capture import picked

    value = torch.arange(24.0, requires_grad=True).reshape(2, 3, 4)
    for view in (value, value.transpose(0, 2), value[:, 1:], value.permute(1, 2, 0)[::2]):
        index = torch.tensor([0, 3, view.numel() - 1])
        taken = picked(view, index)
        assert torch.equal(taken, view.detach().reshape(-1)[index])
        assert not taken.requires_grad


def _common_path_column_by_column(names):
    """Every name's parts compared column by column (``common_path`` before it took the
    first and last path of the unique names)."""
    parts = [n.split(".") if n else [] for n in names]
    common: list[str] = []
    for column in zip(*parts, strict=False):
        if len(set(column)) != 1:
            break
        common.append(column[0])
    return ".".join(common)


def test_common_path_is_the_column_by_column_scan():
    import random

    draw = random.Random(0)
    pool = ["", "a", "a.b", "a.b.c", "a.c", "a.b.d", "b", "a.bc", "a.b.c.d", "ab", "a.b.c"]
    for _ in range(5000):
        names = [draw.choice(pool) for _ in range(draw.randint(0, 6))]
        assert pairing.common_path(names) == _common_path_column_by_column(names), names
    # a weight related to every weight of its value repeats its owners: one read each
    owners = ["encoder.layer.3.output.LayerNorm"] * 400 + ["encoder.layer.3.attention.output"]
    assert pairing.common_path(owners) == "encoder.layer.3"


def test_a_weight_holding_minus_zero_where_the_reference_holds_zero_is_related():
    """``torch.equal`` reads -0.0 as 0.0, and so does the key on a large weight's grid: a
    weight equal to the reference's was related to nothing where the grid met a zero."""
    reference = torch.nn.Linear(300, 200)
    with torch.no_grad():
        reference.weight[0, 0] = 0.0  # (the first element is on every grid)
        reference.weight[199, 299] = 0.0
    candidate = copy.deepcopy(reference)
    with torch.no_grad():
        candidate.weight[0, 0] = -0.0
        candidate.weight[199, 299] = -0.0
    relations = pairing.relate_parameters(reference, candidate)
    assert relations["weight"] == {"weight"} and relations["bias"] == {"bias"}
    assert "weight" not in relations.same_bytes  # equal values, not the same bytes
    assert relations.same_bytes == {}  # (the bias, small, is related by its key alone)
