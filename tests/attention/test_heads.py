"""Head-by-head parity: a port with two heads' query projections swapped is found there.

The port is written here, independently of ``introspect.scratch``: a plain BERT encoder
reading HF's weights, with the query rows of head 3 and head 5 of layer 1 exchanged.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import introspect
from introspect.attention import compare_heads
from introspect.errors import InputError
from tests.bounds import below

from .conftest import PADDED_TEXTS

LAYERS, HEADS, HIDDEN = 3, 8, 64


class HandLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attention_out = nn.Linear(hidden, hidden)
        self.attention_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.up, self.down = nn.Linear(hidden, intermediate), nn.Linear(intermediate, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape
        nh, hd = self.heads, H // self.heads
        q = self.query(x).view(B, S, nh, hd).transpose(1, 2)  # (B, nh, S, hd)
        k = self.key(x).view(B, S, nh, hd).transpose(1, 2)
        v = self.value(x).view(B, S, nh, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # (B, nh, S, hd)
        x = self.attention_norm(x + self.attention_out(y.transpose(1, 2).reshape(B, S, H)))
        return self.output_norm(x + self.down(F.gelu(self.up(x))))


class HandPort(nn.Module):
    """BERT's encoder, by hand, loading an HF ``BertModel``'s weights by explicit names."""

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        config = hf.config
        H = config.hidden_size
        self.words = nn.Embedding(config.vocab_size, H)
        self.positions = nn.Embedding(config.max_position_embeddings, H)
        self.segments = nn.Embedding(config.type_vocab_size, H)
        self.embedding_norm = nn.LayerNorm(H, eps=1e-12)
        self.layers = nn.ModuleList(
            HandLayer(H, config.num_attention_heads, config.intermediate_size)
            for _ in range(config.num_hidden_layers))
        names = {"words": "embeddings.word_embeddings", "positions":
                 "embeddings.position_embeddings", "segments": "embeddings.token_type_embeddings",
                 "embedding_norm": "embeddings.LayerNorm"}
        per_layer = {"query": "attention.self.query", "key": "attention.self.key",
                     "value": "attention.self.value", "attention_out": "attention.output.dense",
                     "attention_norm": "attention.output.LayerNorm",
                     "up": "intermediate.dense", "down": "output.dense",
                     "output_norm": "output.LayerNorm"}
        for i in range(config.num_hidden_layers):
            names.update({f"layers.{i}.{ours}": f"encoder.layer.{i}.{theirs}"
                          for ours, theirs in per_layer.items()})
        source = hf.state_dict()
        with torch.no_grad():
            for name, tensor in self.state_dict().items():
                module, _, kind = name.rpartition(".")
                tensor.copy_(source[f"{names[module]}.{kind}"])

    def forward(self, input_ids, token_type_ids, attention_mask):
        S = input_ids.shape[1]
        positions = torch.arange(S, device=input_ids.device)
        x = self.words(input_ids) + self.positions(positions) + self.segments(token_type_ids)
        x = self.embedding_norm(x)
        keep = attention_mask[:, None, None, :].bool()  # (B, 1, 1, S) over the keys
        for layer in self.layers:
            x = layer(x, keep)
        return x


def swap_query_heads(port: HandPort, layer: int, a: int, b: int) -> HandPort:
    """Exchange the query rows (weights and bias) of heads ``a`` and ``b`` in ``layer``."""
    query = port.layers[layer].query
    hd = query.out_features // port.layers[layer].heads
    rows_a, rows_b = slice(a * hd, (a + 1) * hd), slice(b * hd, (b + 1) * hd)
    with torch.no_grad():
        for tensor in (query.weight, query.bias):
            saved = tensor[rows_a].clone()
            tensor[rows_a] = tensor[rows_b]
            tensor[rows_b] = saved
    return port


@pytest.fixture(scope="module")
def eight_heads():
    import transformers

    config = transformers.BertConfig(vocab_size=30522, hidden_size=HIDDEN,
                                     num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                     intermediate_size=128, attn_implementation="sdpa")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = transformers.BertModel(config).eval()
    return model


@pytest.fixture(scope="module")
def inputs(tiny_models):
    return introspect.tokenize(tiny_models().tokenizer, list(PADDED_TEXTS))


def test_the_faithful_port_agrees_on_every_head(eight_heads, inputs):
    parity = compare_heads(eight_heads, HandPort(eight_heads), inputs)
    assert parity.all_passed and parity.first_divergence is None
    assert below(float(parity.max_abs_err.max()), 1e-5)
    assert "all 3x8 heads within budget" in parity.summary()


def test_swapped_query_heads_are_found_at_that_layer_and_head(eight_heads, inputs):
    port = swap_query_heads(HandPort(eight_heads), layer=1, a=3, b=5)
    parity = compare_heads(eight_heads, port, inputs)
    assert parity.first_divergence == (1, 3)
    assert bool(parity.passed[0].all())  # nothing before layer 1 parts
    failing_in_layer_1 = (~parity.passed[1]).nonzero().flatten().tolist()
    assert failing_in_layer_1 == [3, 5]  # the other heads of layer 1 still agree
    assert "first divergent head: layer 1, head 3" in parity.summary()
    table = parity.frame()
    assert list(table.columns) == ["layer", "head", "max_abs_err", "passed"]
    assert len(table) == LAYERS * HEADS
    assert parity.csv().splitlines()[0] == "layer,head,max_abs_err,passed"
    assert "1,3," in parity.csv() and parity.csv().count("false") == int((~parity.passed).sum())


def test_side_by_side_heatmap_of_the_divergent_head(eight_heads, inputs):
    parity = compare_heads(eight_heads, swap_query_heads(HandPort(eight_heads), 1, 3, 5), inputs)
    svg = parity.svg()
    root = ElementTree.fromstring(svg)
    text = " ".join(root.itertext())
    assert "layer 1 · head 3" in text
    assert "reference" in text and "candidate" in text and "candidate − reference" in text
    assert svg == parity.svg(1, 3)  # byte-stable


def test_models_of_different_shapes_are_refused(eight_heads, tiny_models, inputs):
    with pytest.raises(InputError, match="cannot compare attention head by head"):
        compare_heads(eight_heads, tiny_models().model, inputs)


# Local parity (issue 23): each head is computed from the reference's inputs to its layer,
# so an error carried in from an earlier layer is not a divergent head.


def test_a_wrong_mlp_is_not_an_attention_fault(eight_heads, inputs):
    port = HandPort(eight_heads)
    port.layers[0].forward = _relu_forward(port.layers[0])  # layer 0's MLP is wrong
    parity = compare_heads(eight_heads, port, inputs)
    assert parity.local and parity.all_passed, parity.summary()
    assert "each head on the reference's inputs to its layer" in parity.summary()
    own = compare_heads(eight_heads, port, inputs, local=False)  # what the old parity said
    assert own.first_divergence is not None and own.first_divergence[0] == 1
    assert not own.local and "each model on its own run" in own.summary()


def test_swapped_heads_fail_only_in_their_layer(eight_heads, inputs):
    port = swap_query_heads(HandPort(eight_heads), layer=1, a=3, b=5)
    parity = compare_heads(eight_heads, port, inputs)
    assert parity.local
    assert (~parity.passed).nonzero().tolist() == [[1, 3], [1, 5]]  # layer 2 gets HF's input


def test_a_wrong_embedding_falls_back_to_each_models_own_run(eight_heads, inputs):
    port = HandPort(eight_heads)
    with torch.no_grad():
        port.embedding_norm.bias += 0.5  # layer 0's input differs: no pairing to trust
    parity = compare_heads(eight_heads, port, inputs)
    assert not parity.local
    assert "differ from the reference's" in parity.note and parity.note in parity.summary()


def _relu_forward(layer: HandLayer):
    def forward(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape
        nh, hd = layer.heads, H // layer.heads
        q = layer.query(x).view(B, S, nh, hd).transpose(1, 2)
        k = layer.key(x).view(B, S, nh, hd).transpose(1, 2)
        v = layer.value(x).view(B, S, nh, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        x = layer.attention_norm(x + layer.attention_out(y.transpose(1, 2).reshape(B, S, H)))
        return layer.output_norm(x + layer.down(F.relu(layer.up(x))))
    return forward


@pytest.mark.parametrize("fault", ["rotary-wrong-half", "gqa-tiled", "no-causal-mask"])
def test_llama_attention_faults_are_local_to_their_layer(fault):
    """Rotary attention: the position tables come in from outside the attention module."""
    from tests.fixtures.families import faulty_llama_attention, tiny_inputs, tiny_model

    model = tiny_model("llama")
    parity = compare_heads(model, faulty_llama_attention(model, 1, fault), tiny_inputs("llama"))
    assert parity.local and parity.first_divergence is not None
    assert {layer for layer, _ in (~parity.passed).nonzero().tolist()} == {1}


def test_a_port_that_cannot_take_the_references_inputs_gets_a_note_not_torchs_words(
        eight_heads, inputs, monkeypatch):
    """The local run fails inside the port's own code (its hand-written heads reshape what
    they are given): the parity falls back to each model's own run, and its note names
    that, not torch's words about the port's tensor sizes (probe round g)."""
    import importlib

    heads = importlib.import_module("introspect.attention.heads")

    def fails(*args, **kwargs):
        raise RuntimeError("The size of tensor a (32) must match the size of tensor b (256) "
                           "at non-singleton dimension 2")

    monkeypatch.setattr(heads, "local_probabilities", fails)
    parity = compare_heads(eight_heads, HandPort(eight_heads), inputs)
    assert not parity.local
    assert parity.note == ("the reference's inputs could not be put in the candidate's "
                           "layers (RuntimeError)")


def test_a_block_holding_its_attention_is_not_said_to_differ():
    """A GPT-2 port whose blocks are one module each (probe round o): what enters the
    module holding layer 0's attention is the block's input, before its norm, and the
    port agrees with the reference there. The reason said "the candidate's inputs to
    layer 0's attention differ from the reference's", which is untrue."""
    from introspect.attention.heads import local_probabilities
    from tests.fixtures.families import perturb_vectors, tiny_model
    from tests.ports import gpt2_flat_blocks

    reference = perturb_vectors(tiny_model("gpt2", head="causal-lm"), scale=0.1)
    generator = torch.Generator().manual_seed(0)
    inputs = {"input_ids": torch.randint(5, 100, (2, 7), generator=generator)}
    candidate = gpt2_flat_blocks.build(reference)
    with torch.no_grad():
        assert torch.allclose(reference(**inputs).logits, candidate(**inputs), atol=1e-5)
    probabilities, why = local_probabilities(reference, candidate, inputs)
    assert probabilities is None
    assert why.startswith("what enters the candidate's blocks.0, which holds layer 0's "
                          "attention, is the reference's "), why
    assert "differ from the reference's" not in why
