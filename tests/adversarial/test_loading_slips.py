"""A key map that reads one weight of a block from the layer before (an off-by-one in a
port's loader). The op level pairs a node by the values of the weights it reads, so a
Llama's ``o_proj`` or a GPT-2's ``c_proj`` or ``ln_1`` loaded from the block before was
named in that block, whose code and weights are right (probe round j), and a block loaded
whole from the block before was named in it too, where it agrees. The FAIL is named now in
the layer the candidate's block holds the weights of, with a hint naming the slipped
weight (``modules.blocks``). The ports are ``ports/llama_key_map.py`` (Meta's names, its
own RMSNorm and rotary table) and ``ports/gpt2_folded_norm.py`` (nanoGPT style); ports
with stacked weights and no module per layer (``ports/llama_scan.py``,
``ports/stacked_layers.py``) are named by the index of the slice (``modules.stacked``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import transformers

import introspect
from tests.adversarial.corpus import as_reference, port


def _perturbed(reference: torch.nn.Module) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # (random init leaves every norm at 1, every bias at 0)
        for parameter in reference.parameters():
            if parameter.ndim == 1:
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return reference.eval()


def _inputs(length: int = 12) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 1000, (2, length), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones(2, length, dtype=torch.long)}


def _llama(layers: int, width: int, ports: str):
    """A random Llama, its norms perturbed, and the port file that ports it."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=1000, hidden_size=width, intermediate_size=2 * width,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64)
    return _perturbed(transformers.LlamaModel(config)), port(ports)


@pytest.fixture(scope="module")
def llama():
    return _llama(5, 128, "llama_key_map.py")


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=1000,
                                     n_positions=64)
    return _perturbed(transformers.GPT2Model(config)), port("gpt2_folded_norm.py")


def test_the_port_with_no_slip_passes(llama):
    reference, ports = llama
    result = introspect.diff(reference, ports.correct(reference), _inputs(), nodes=False)
    assert result.passed, result.summary()


@pytest.mark.parametrize("nodes", [False, True])
@pytest.mark.parametrize("build, layer, source, weight", [
    ("wo_from_block_before", "layers.2", "layers.1", "blocks.2.attn.wo.weight"),
    ("attn_norm_from_block_before", "layers.3", "layers.2", "blocks.3.attn_norm.weight"),
    ("ffn_norm_from_block_before", "layers.1", "layers.0", "blocks.1.ffn_norm.weight")])
def test_a_weight_from_the_block_before_is_named_where_it_sits(llama, build, layer, source,
                                                               weight, nodes):
    reference, ports = llama
    result = introspect.diff(reference, getattr(ports, build)(reference), _inputs(),
                             nodes=nodes)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == layer, divergence
    assert divergence.module.startswith(f"{layer}."), divergence
    assert divergence.candidate_module.startswith(f"blocks.{layer[-1]}."), divergence
    hint = divergence.hints[0]
    assert weight in hint and f"a weight loaded from {source} into {layer}" in hint, hint


def test_a_block_loaded_whole_from_the_block_before_is_named_where_it_sits(llama):
    reference, ports = llama
    result = introspect.diff(reference, ports.block_copied_from_block_before(reference),
                             _inputs(), nodes=False)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == "layers.3", divergence
    assert "no block of the candidate holds layers.3's: layers.2's weights loaded into " \
        "layers.3" in divergence.hints[0], divergence.hints


@pytest.mark.parametrize("nodes", [False, True])
@pytest.mark.parametrize("build, weight", [
    ("mlp_swapped_between_blocks", "mlp.gate_proj.weight"),
    ("wo_swapped_between_blocks", "self_attn.o_proj.weight")])
def test_weights_two_blocks_traded_are_named_swapped(llama, build, weight, nodes):
    """Blocks 1 and 2 trade a weight: each holds the other's, so neither is a slip (each
    reference weight held once), and the FAIL, in layers.1, where the first of the two
    runs, had no hint (probe round m)."""
    reference, ports = llama
    result = introspect.diff(reference, getattr(ports, build)(reference), _inputs(),
                             nodes=nodes)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == "layers.1", divergence
    hint = divergence.hints[0]
    assert hint.startswith("weights swapped between layers.1 and layers.2"), hint
    assert f"layers.1.{weight}" in hint and f"layers.2.{weight}" in hint, hint


@pytest.mark.parametrize("module, into", [("attn_proj", 3), ("ln_1", 2), ("ln_2", 1)])
def test_a_gpt2_weight_from_the_block_before_is_named_where_it_sits(gpt2, module, into):
    reference, ports = gpt2
    model = ports.correct(reference)
    with torch.no_grad():  # (its own layer's weight left as it was loaded: a bias too)
        for name in ("weight", "bias"):
            getattr(getattr(model.h[into], module), name).copy_(
                getattr(getattr(model.h[into - 1], module), name))
    result = introspect.diff(reference, model, _inputs(), nodes=False)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == f"h.{into}", divergence
    assert divergence.candidate_module.startswith(f"h.{into}."), divergence
    assert any(f"a weight loaded from h.{into - 1} into h.{into}" in h
               for h in divergence.hints), divergence.hints
    # (its Linear holds the Conv1D's weight transposed, as it should: probe round l was
    # told "a transposed weight")
    assert not any("a transposed weight" in h for h in divergence.hints), divergence.hints


@pytest.mark.parametrize("build", ["correct", "eps_in_layer_2"])
def test_blocks_cut_elsewhere_than_the_references_are_no_slip(minilm, build):
    """A port whose block 3 begins with layer 2's last LayerNorm holds every weight once
    (``ports/shifted_blocks.py``, probe round k): an eps fault there is layer 2's, with no
    hint of a weight loaded into the wrong layer (one was given, and layer 3 named, before
    a slip had to leave its twin unheld)."""
    model = getattr(port("shifted_blocks.py"), build)(as_reference(minilm))
    result = introspect.diff(minilm.model, model, introspect.tokenize(minilm.tokenizer),
                             nodes=False)
    if build == "correct":
        assert result.passed, result.summary()
        return
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == "encoder.layer.2", divergence
    assert divergence.candidate_module == "stages.3.prev_norm", divergence
    assert not any("a weight loaded from" in h for h in divergence.hints), divergence.hints


@pytest.mark.parametrize("build, layer, module", [
    ("key_of_layer_5_from_layer_0", "encoder.layer.5", "stages.5.k"),
    ("last_norm_of_layer_3_from_layer_2", "encoder.layer.3", "stages.4.prev_norm")])
def test_a_slip_in_blocks_cut_elsewhere_is_named_where_it_sits(minilm, build, layer, module):
    """Probe round l: the stage holding layer 0's weights all but its last LayerNorm was
    paired, once the outputs failed, with layer 0's output and named (a guess: the next
    stage holds that LayerNorm); and a LayerNorm slipped into a stage's ``prev_norm``
    was named in the layer it came from, the slot of every other stage holding the layer
    before its own (``blocks._by_slot``)."""
    model = getattr(port("shifted_blocks.py"), build)(as_reference(minilm))
    result = introspect.diff(minilm.model, model, introspect.tokenize(minilm.tokenizer),
                             nodes=False)
    assert not result.passed
    divergence = result.first_divergence
    assert (divergence.layer, divergence.candidate_module) == (layer, module), divergence
    assert any("a weight loaded from" in h for h in divergence.hints), divergence.hints


@pytest.fixture(scope="module")
def deep_llama():
    return _llama(24, 64, "llama_stages.py")


@pytest.mark.parametrize("fault", [None, 17])
def test_stages_ending_at_a_residual_between_modules(deep_llama, fault):
    """A stage ending at the post-attention residual, which HF hands its norm and no
    module of its returns: module evidence paired it with the layer's output, a few
    percent from it at depth (the MLP's part), and a correct 24-layer port FAILED at
    layers.6 (probe round l). It is paired with the residual now (``pairing``'s
    ``_taken_instead``), and a fault in layer 17's MLP norm, in stage 18, is named there."""
    reference, ports = deep_llama
    model = ports.correct(reference) if fault is None \
        else ports.ffn_norm_eps_in_layer(reference, fault)
    result = introspect.diff(reference, model, _inputs(), nodes=False)
    if fault is None:
        assert result.passed, result.summary()
        return
    assert not result.passed
    assert result.first_divergence.layer == f"layers.{fault}", result.first_divergence


@pytest.fixture(scope="module")
def llama_scan():
    return _llama(5, 128, "llama_scan.py")


@pytest.mark.parametrize("build, layer, hint", [
    ("correct", None, None),
    ("wo_from_layer_before", "layers.3",
     "wo[3] holds layers.2.self_attn.o_proj.weight's values: a weight loaded from layers.2 "
     "into layers.3"),
    ("ffn_norm_from_layer_before", "layers.4",
     "ffn_norm[4] holds layers.3.post_attention_layernorm.weight's values: a weight loaded "
     "from layers.3 into layers.4"),
    ("down_from_layer_before", "layers.2", "a weight loaded from layers.1 into layers.2"),
    ("layer_copied_from_layer_before", "layers.2",
     "hold layers.1's at index 2, as at index 1, and none holds layers.2's"),
    ("eps_fault", "layers.3", None)])
def test_a_slice_of_a_stacked_weight_from_the_layer_before(llama_scan, build, layer, hint):
    """Probe round l: a port with stacked weights (a loop over ``wo[i]``, no module per
    layer) whose ``wo[3]`` holds layer 2's values was named in layer 2, its nodes paired
    there by the weight they read, with "left unloaded" hints for weights its stacks hold.
    Each index of the stack now stands for a block; an eps fault is named in its layer,
    with no slip."""
    reference, ports = llama_scan
    result = introspect.diff(reference, getattr(ports, build)(reference), _inputs(),
                             nodes=False)
    if layer is None:
        assert result.passed, result.summary()
        return
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == layer, divergence
    assert not any("left unloaded" in h for h in divergence.hints), divergence.hints
    if hint is None:
        assert not any("a weight loaded from" in h for h in divergence.hints), divergence
    else:
        assert any(hint in h for h in divergence.hints), divergence.hints


@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=5,
                                     num_attention_heads=4, intermediate_size=256,
                                     max_position_embeddings=64)
    return _perturbed(transformers.BertModel(config)), port("stacked_layers.py")


@pytest.mark.parametrize("build, layer", [("wo_from_layer_before", "encoder.layer.2"),
                                          ("layer_copied_from_layer_before", "encoder.layer.1")])
def test_a_stacked_bert_slice_from_the_layer_before(bert, build, layer):
    """The BERT of a JAX scan: ``wo[2]`` from layer 1 was named in layer 1; index 1 loaded
    whole from layer 0 was named at the embeddings, its nodes paired by structure with the
    candidate's layer 0, which holds the same weights."""
    reference, ports = bert
    inputs = {**_inputs(), "token_type_ids": torch.zeros(2, 12, dtype=torch.long)}
    model = getattr(ports, build)(SimpleNamespace(model=reference, config=reference.config))
    result = introspect.diff(reference, model, inputs, nodes=False)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == layer, divergence
    assert "a weight loaded from" in divergence.hints[0] or "loaded into" in \
        divergence.hints[0], divergence.hints


@pytest.fixture(scope="module")
def llama_pairs():
    return _llama(6, 128, "llama_pairs.py")


@pytest.mark.parametrize("build, layer, hint", [
    ("correct", None, None),
    ("second_half_from_layer_1", "layers.3",
     "pairs.1.second holds layers.1's weights, as its pairs.0.second does, and no block of "
     "the candidate holds layers.3's"),
    ("second_half_from_first", "layers.3",
     "pairs.1.second holds layers.2's weights, as its pairs.1.first does"),
    ("wo_of_second_from_first", "layers.3",
     "pairs.1.second.attn.wo.weight holds layers.2.self_attn.o_proj.weight's values"),
    ("wo_of_first_from_pair_before", "layers.2",
     "pairs.1.first.attn.wo.weight holds layers.1.self_attn.o_proj.weight's values")])
def test_a_slip_in_a_module_holding_two_layers(llama_pairs, build, layer, hint):
    """Probe round l: a module holding two layers holds no one layer's weights, so it
    was no block, and its slips were named in the layer they came from. Where most
    blocks of a stack hold no one layer's, each module inside them is a block."""
    reference, ports = llama_pairs
    result = introspect.diff(reference, getattr(ports, build)(reference), _inputs(),
                             nodes=False)
    if layer is None:
        assert result.passed, result.summary()
        return
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == layer, divergence
    assert hint in divergence.hints[0], divergence.hints
