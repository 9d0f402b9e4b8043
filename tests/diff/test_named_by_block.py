"""``modules.blocks.named_by_block`` on the weights each candidate block holds: where it
moves a FAIL and where it must not (a stack run out of order, a weight the reference
shares across its layers, a FAIL outside any block, one already named by a slip)."""

from __future__ import annotations

from introspect.diff.modules.blocks import block_of, named_by_block
from introspect.diff.records import Divergence

WEIGHTS = ("attn.q", "attn.k", "attn.v", "attn.o", "norm")


def _reference(layers: int = 4) -> dict[str, str]:
    return {f"layers.{i}.{w}.weight": f"layers.{i}" for i in range(layers) for w in WEIGHTS}


def _relations(sources: dict[tuple[int, str], int] | None = None, layers: int = 4,
               ) -> dict[str, set[str]]:
    """Candidate ``blocks.i.w.weight`` -> the reference's ``layers.j.w.weight``."""
    sources = sources or {}
    return {f"blocks.{i}.{w}.weight": {f"layers.{sources.get((i, w), i)}.{w}.weight"}
            for i in range(layers) for w in WEIGHTS}


def _divergence(layer: str, candidate_module: str, hints: tuple[str, ...] = ()) -> Divergence:
    return Divergence("node", "cand_node", f"{layer}.attn", layer, "sdpa", 1.0, "atol 1e-05",
                      hints, candidate_module=candidate_module)


def test_blocks_are_found_at_their_index():
    assert block_of("blocks.2.attn.o") == "blocks.2"
    assert block_of("model.layers.10.mlp") == "model.layers.10"
    assert block_of("0.attn") == "0"
    assert block_of("embeddings.word") is None


def test_a_fail_named_by_a_slipped_weight_moves_to_its_block():
    moved = named_by_block(_divergence("layers.1", "blocks.2.attn"),
                           _relations({(2, "attn.o"): 1}), _reference())
    assert moved.layer == "layers.2" and moved.module == "layers.2.attn"
    assert moved.hints[0] == (
        "the candidate's blocks.2 holds layers.2's weights, but its blocks.2.attn.o.weight "
        "holds layers.1.attn.o.weight's values: a weight loaded from layers.1 into layers.2")


def test_a_fail_in_its_own_block_gets_the_slip_as_a_hint():
    named = named_by_block(_divergence("layers.3", "blocks.3.attn"),
                           _relations({(3, "norm"): 2}), _reference())
    assert named.layer == "layers.3"
    assert "a weight loaded from layers.2 into layers.3" in named.hints[0]


def test_a_block_that_is_another_blocks_twin_is_named_at_its_place():
    relations = _relations({(3, w): 2 for w in WEIGHTS})
    moved = named_by_block(_divergence("layers.2", "blocks.3.attn"), relations, _reference())
    assert moved.layer == "layers.3"
    assert "as its blocks.2 does" in moved.hints[0]
    # the twin that sits at its own place is not moved
    kept = named_by_block(_divergence("layers.2", "blocks.2.attn"), relations, _reference())
    assert kept.layer == "layers.2" and kept.hints == ()


def test_a_stack_run_out_of_order_is_left_where_its_values_name_it():
    relations = _relations({**{(1, w): 2 for w in WEIGHTS}, **{(2, w): 1 for w in WEIGHTS}})
    divergence = _divergence("layers.1", "blocks.1.attn", ("layers out of order",))
    assert named_by_block(divergence, relations, _reference()) == divergence


def test_a_weight_the_reference_shares_across_layers_is_no_slip():
    # (the reference's layers 1 to 3 read layer 0's norm: named_parameters names it once)
    reference = {name: layer for name, layer in _reference().items()
                 if not name.endswith("norm.weight") or name.startswith("layers.0.")}
    relations = {name: found for name, found in _relations().items()
                 if not name.endswith("norm.weight")}
    relations.update({f"blocks.{i}.norm.weight": {"layers.0.norm.weight"} for i in range(4)})
    divergence = _divergence("layers.2", "blocks.2.attn")
    assert named_by_block(divergence, relations, reference) == divergence


def test_outside_any_block_or_named_by_a_slip_already_nothing_moves():
    relations = _relations({(2, "attn.o"): 1})
    outside = Divergence("node", "cand", "embeddings", "embeddings", "add", 1.0, "", (),
                         candidate_module="embeddings")
    assert named_by_block(outside, relations, _reference()) == outside
    hinted = _divergence("layers.1", "blocks.2.attn",
                         ("...: a weight loaded from layers.1 into layers.2",))
    assert named_by_block(hinted, relations, _reference()) == hinted
    assert named_by_block(None, relations, _reference()) is None


def test_blocks_cut_elsewhere_hold_every_weight_once_and_no_slip():
    # (block i holds layer i-1's norm and layer i's attention: each weight held once)
    relations = _relations({(i, "norm"): i - 1 for i in range(1, 4)})
    del relations["blocks.0.norm.weight"]
    relations["tail.norm.weight"] = {"layers.3.norm.weight"}
    divergence = _divergence("layers.2", "blocks.3.norm")
    assert named_by_block(divergence, relations, _reference()) == divergence


def test_a_slip_leaves_out_the_hints_it_disproves():
    hints = ("layers out of order: the candidate runs layers.3 before layers.1",
             "weight layers.2.attn.o.weight differs ...: a weight left unloaded (still at "
             "its initial values)", "the attention scale differs")
    moved = named_by_block(_divergence("layers.1", "blocks.2.attn", hints),
                           _relations({(2, "attn.o"): 1}), _reference())
    assert moved.hints[1:] == ("the attention scale differs",), moved.hints


def test_blocks_named_with_their_index_are_a_stack():
    relations = {f"layer{i}.{w}.weight": {f"layers.{1 if (i, w) == (2, 'attn.o') else i}.{w}"
                                          ".weight"} for i in range(6) for w in WEIGHTS}
    moved = named_by_block(_divergence("layers.1", "layer2.attn"), relations, _reference(6))
    assert moved.layer == "layers.2", moved
    # three of a name are no stack (an FFN's w1, w2 and w3): nothing is moved
    relations = {f"ffn.w{i}.weight": {f"layers.{i}.attn.q.weight"} for i in (1, 2, 3)}
    relations["ffn.w2.weight"] = {"layers.1.attn.q.weight"}
    divergence = _divergence("layers.1", "ffn.w2")
    assert named_by_block(divergence, relations, _reference()) == divergence


def test_a_slip_in_blocks_cut_elsewhere_is_found_by_its_slot():
    """Each block's norm holds the layer before its own (a stage beginning with that
    layer's last norm); block 3's holds layer 1's, and layer 2's is held nowhere."""
    relations = {f"blocks.{i}.{w}.weight": {f"layers.{i}.{w}.weight"}
                 for i in range(4) for w in WEIGHTS if w != "norm"}
    relations.update({f"blocks.{i}.norm.weight": {f"layers.{i - 1}.norm.weight"}
                      for i in (1, 2)})
    relations["blocks.3.norm.weight"] = {"layers.1.norm.weight"}
    relations["tail.norm.weight"] = {"layers.3.norm.weight"}
    moved = named_by_block(_divergence("layers.1", "blocks.3.norm"), relations, _reference())
    assert moved.layer == "layers.2", moved
    assert "blocks.3.norm.weight holds layers.1.norm.weight's values, where its other " \
        "blocks' norm.weight holds the layer's before their own (here layers.2)" \
        in moved.hints[0], moved.hints
