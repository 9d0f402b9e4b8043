"""A residual added in place to a Linear's output (``h = linear(x); h += x``).

On a 3-D input ``nn.Linear`` returns a view of its matmul, and an in-place op on a view
replaces the view's autograd function: a tensor hook registered on it before never runs.
The recorder took each node's gradient by such a hook, so the Linear got none, and a
correct port FAILED its backward ("the gradient into encoder_layer_1_output_dense is
exactly zero in the candidate"). The view's gradient is now taken from its base's function
where its own hook did not run.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import introspect
from introspect.diff.backward.record import record_backward


@pytest.fixture(scope="module")
def tiny():
    """bert-tiny, its norms and biases perturbed, as a builder receives it, and inputs."""
    from introspect.models.load import load_model, tokenize
    from tests.adversarial.corpus import as_reference, perturb

    loaded = load_model("bert-tiny")
    perturb(loaded.model)
    return as_reference(loaded), dict(tokenize(loaded.tokenizer).tensors)


class _Residual(nn.Module):
    def __init__(self, in_place: bool) -> None:
        super().__init__()
        self.up, self.down, self.norm = nn.Linear(4, 8), nn.Linear(8, 4), nn.LayerNorm(4)
        self.in_place = in_place

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(torch.nn.functional.gelu(self.up(x)))
        if self.in_place:
            h += x
        else:
            h = h + x
        return self.norm(h)


def test_a_linear_output_changed_in_place_keeps_its_gradient():
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))
    grads = []
    for in_place in (True, False):
        torch.manual_seed(0)
        model = _Residual(in_place)
        recorded = record_backward(model, {"x": x}, lambda out, _: (out * torch.arange(4.0)).sum())
        grads.append(recorded.grads["down"])
    assert torch.equal(grads[0], grads[1])


class _Layer(nn.Module):
    """A BERT layer written with in-place residual adds (imports only torch)."""

    def __init__(self, config, scale_backward: float = 1.0) -> None:
        super().__init__()
        width = config.hidden_size
        self.heads = config.num_attention_heads
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.n1 = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.i = nn.Linear(width, config.intermediate_size)
        self.f = nn.Linear(config.intermediate_size, width)
        self.n2 = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.scale_backward = scale_backward

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        B, S, W = x.shape
        size = W // self.heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, S, self.heads, size).transpose(1, 2)

        scores = split(self.q(x)) @ split(self.k(x)).transpose(-1, -2) / size ** 0.5 + bias
        mixed = (scores.softmax(-1) @ split(self.v(x))).transpose(1, 2).reshape(B, S, W)
        a = self.o(mixed)
        a.add_(x)  # in place, on the Linear's output (a view of its matmul)
        x = self.n1(a)
        h = self.f(torch.nn.functional.gelu(self.i(x)))
        if self.scale_backward != 1.0:  # the forward unchanged, its backward scaled
            h = h * self.scale_backward + (h * (1 - self.scale_backward)).detach()
        h += x
        return self.n2(h)


class _Bert(nn.Module):
    def __init__(self, config, scaled_layer: int = -1) -> None:
        super().__init__()
        width = config.hidden_size
        self.words = nn.Embedding(config.vocab_size, width)
        self.places = nn.Embedding(config.max_position_embeddings, width)
        self.kinds = nn.Embedding(config.type_vocab_size, width)
        self.norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(_Layer(config, 1.01 if i == scaled_layer else 1.0)
                                    for i in range(config.num_hidden_layers))

    def forward(self, input_ids, attention_mask, token_type_ids):
        x = self.words(input_ids)
        x += self.kinds(token_type_ids)
        x += self.places(torch.arange(input_ids.shape[1]))
        x = self.norm(x)
        bias = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        for layer in self.layers:
            x = layer(x, bias)
        return {"last_hidden_state": x}


_NAMES = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
          "o": "attention.output.dense", "n1": "attention.output.LayerNorm",
          "i": "intermediate.dense", "f": "output.dense", "n2": "output.LayerNorm"}
_TOP = {"words": "embeddings.word_embeddings", "places": "embeddings.position_embeddings",
        "kinds": "embeddings.token_type_embeddings", "norm": "embeddings.LayerNorm"}


def _port(reference, scaled_layer=-1):
    model = _Bert(reference.config, scaled_layer)
    theirs = reference.model.state_dict()
    state = {}
    for key in model.state_dict():
        module, _, leaf = key.rpartition(".")
        if module in _TOP:
            state[key] = theirs[f"{_TOP[module]}.{leaf}"].clone()
        else:
            _, index, part = module.split(".")
            state[key] = theirs[f"encoder.layer.{index}.{_NAMES[part]}.{leaf}"].clone()
    model.load_state_dict(state)
    return model.eval()


def test_a_port_with_residuals_added_in_place_passes_its_backward(tiny):
    reference, inputs = tiny
    for nodes in (False, True):
        result = introspect.diff(reference.model, _port(reference), inputs, backward=True,
                                 nodes=nodes)
        assert result.passed and result.backward.passed, result.summary()


def test_its_backward_bug_still_fails_in_its_layer(tiny):
    reference, inputs = tiny
    result = introspect.diff(reference.model, _port(reference, scaled_layer=1), inputs,
                             backward=True, nodes=True)
    assert not result.backward.passed
    assert result.first_divergence.layer == "encoder.layer.1", result.first_divergence
