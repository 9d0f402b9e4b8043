"""Pairs proven by a value relation (issue 20, item 4): ports as people write them.

- a llama2.c-style Llama, loaded as its export maps HF weights (wq/wk rows permuted within
  each head for interleaved rotary), with as many heads as tokens (8) on a padded batch,
  passes; its heads kept as (B, S, nh, hd) are compared to HF's (B, nh, S, hd) in the
  right layout; a really wrong weight still fails in its layer;
- a nanoGPT-style GPT-2 against HF's Conv1D, whose rows are flattened to (B*S, F): the
  errors count real tokens only;
- a weight held reshaped, and an offset embedding table, pair as anchors, named;
- a pair found by structure alone is never blamed unless its difference reaches an output.
"""

from __future__ import annotations

import torch
import torch.fx
from torch import nn

import introspect
from introspect.diff.ops.compare.axes import BATCH, ROWS, TOKENS
from introspect.diff.ops.compare.padding import Padding
from introspect.diff.ops.divergence import confirm_failures
from introspect.diff.records import (
    BY_STRUCTURE,
    BY_WEIGHTS,
    STATUS_FAIL,
    STATUS_UNCONFIRMED,
    NodeDiff,
)
from tests.bounds import above, below
from tests.diff import llama2c_port, nanogpt_gpt2_port
from tests.fixtures.families import perturb_vectors, tiny_model


def _perturbed(model: nn.Module) -> nn.Module:
    """Norms and biases moved by N(0, 0.1²) (``perturb_vectors``)."""
    return perturb_vectors(model, scale=0.1)


def _padded_inputs(length: int, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (2, length), generator=g)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, 5:] = 0
    ids[1, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _llama() -> nn.Module:
    # 8 heads (as llama-tiny), 2 key/value heads, head size 8; the texts have 8 tokens.
    model = tiny_model("llama", head="causal-lm", hidden_size=64, num_attention_heads=8,
                       num_key_value_heads=2)
    return _perturbed(model)


def _compared(result) -> object:
    nodes = result.nodes
    return nodes[nodes["max_abs_err"].notna()]


# -- llama2.c ---------------------------------------------------------------------------
def test_the_llama2c_port_itself_agrees_with_hf_on_real_tokens_only():
    reference, inputs = _llama(), _padded_inputs(8)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        expected = reference(**inputs).logits
        for attention in ("sdpa", "einsum"):
            got = llama2c_port.build(reference, attention=attention)(inputs["input_ids"])
            assert below((got - expected)[real].abs().max(), 1e-5, attention)
            # no padding mask: garbage at the pads
            assert above((got - expected)[~real].abs().max(), 1e-2, "pads")


def test_a_llama2c_port_with_permuted_wq_wk_passes_when_heads_equal_tokens():
    reference, inputs = _llama(), _padded_inputs(8)
    result = introspect.diff(reference, llama2c_port.build(reference), inputs)
    assert result.passed and result.first_divergence is None
    # Tight (issue 36): 7.6e-6 = 2**-17 measured, one float32 ulp of a value in [64, 128), a
    # 1.3x margin (3.8e-6 on make test's second path). Not derived: the node table gives no
    # node's scale; tests/bounds.py at ~100 and n = 64 would allow ~4e-4. Left for the lead.
    assert below(_compared(result)["max_abs_err"].max(), 1e-5)
    assert (result.nodes["status"] == STATUS_UNCONFIRMED).sum() == 0
    # The permuted projections are anchors, named in their rows and in the notes.
    for layer in (0, 1):
        for proj, ours in (("q_proj", "wq"), ("k_proj", "wk")):
            row = result.nodes[result.nodes["reference_node"]
                               == f"model_layers_{layer}_self_attn_{proj}"].iloc[0]
            assert row["candidate_node"] == f"layers_{layer}_attention_{ours}"
            assert row["matched_by"] == BY_WEIGHTS and row["local_max_abs_err"] == 0.0
            assert row["max_abs_err"] == 0.0 if layer == 0 else \
                below(row["max_abs_err"], 1e-6, proj)
            assert "rows of each head of 8 interleaved" in row["note"]
    named = [n for n in result.notes if "interleaved" in n]
    assert named and named[0].startswith("4 candidate weight(s) are the reference's")


def test_heads_kept_as_b_s_nh_hd_are_compared_in_hf_layout_when_nh_equals_s():
    reference, inputs = _llama(), _padded_inputs(8)
    result = introspect.diff(reference, llama2c_port.build(reference, attention="einsum"),
                             inputs)
    assert result.passed and result.first_divergence is None
    attention = result.nodes[result.nodes["op"] == "scaled_dot_product_attention"]
    assert len(attention) == 2 and (attention["candidate_node"].str.startswith("einsum")).all()
    assert (attention["note"] == "reshape and permute (0, 2, 1, 3)").all()
    assert below(attention["max_abs_err"].max(), 1e-6)
    assert above(attention["pad_max_abs_err"].min(), 1e-2, "pads")  # padded queries differ, apart


def test_a_wrong_value_weight_in_the_llama2c_port_fails_in_its_layer():
    reference, inputs = _llama(), _padded_inputs(8)
    result = introspect.diff(reference, llama2c_port.build(reference, "wv_perturbed", 1),
                             inputs)
    assert not result.passed
    first = result.first_divergence
    assert (first.layer, first.module) == ("layers.1", "model.layers.1.self_attn.v_proj")


def test_wk_left_unpermuted_in_the_llama2c_port_fails_in_its_layer():
    reference, inputs = _llama(), _padded_inputs(8)
    result = introspect.diff(reference, llama2c_port.build(reference, "wk_unpermuted", 1),
                             inputs)
    assert not result.passed
    assert result.first_divergence.layer == "layers.1"
    failing = result.nodes[result.nodes["status"] == STATUS_FAIL]
    assert set(failing["layer"]) <= {"layers.1", ""}


def test_attention_probabilities_of_swapped_q_k_fail_in_their_own_layout():
    """(B, nh, S, S) when nh == S: the layout that fits another pair of those shapes (the
    values (B, S, nh, hd)) must not be forced on the probabilities, which differ under
    every layout: they fail as they are, in their layer."""
    reference = _perturbed(tiny_model("llama", head="causal-lm", attn="eager",
                                            hidden_size=64, num_attention_heads=8,
                                            num_key_value_heads=2))
    inputs = _padded_inputs(8)
    correct = introspect.diff(reference, llama2c_port.build(reference, attention="einsum"),
                              inputs)
    assert correct.passed
    assert (correct.nodes["note"] == "reshape and permute (0, 2, 1, 3)").sum() == 4
    result = introspect.diff(
        reference, llama2c_port.build(reference, "qk_swapped", 1, attention="einsum"), inputs)
    assert not result.passed
    assert result.first_divergence.layer == "layers.1"
    probs = result.nodes[(result.nodes["status"] == STATUS_FAIL)
                         & (result.nodes["shape"] == "(2, 8, 8, 8)")]
    assert len(probs) == 1 and probs.iloc[0]["note"] == ""
    assert set(result.nodes.loc[result.nodes["status"] == STATUS_FAIL, "layer"]) == {"layers.1"}


# -- GPT-2: rows flattened to (B*S, F) ----------------------------------------------------
def _gpt2() -> nn.Module:
    return _perturbed(tiny_model("gpt2", head="causal-lm"))


def test_a_nanogpt_port_on_a_padded_batch_reports_the_real_token_error_only():
    reference, inputs = _gpt2(), _padded_inputs(9)
    result = introspect.diff(reference, nanogpt_gpt2_port.build(reference), inputs)
    assert result.passed and result.first_divergence is None
    compared = _compared(result)
    flattened = compared[compared["op"] == "addmm"]
    assert len(flattened) == 8 and (flattened["shape"].str.startswith("(18, ")).all()
    assert below(compared["max_abs_err"].max(), 1e-6)  # 5e-3 when padded rows counted
    assert below(compared["mean_abs_err"].max(), 1e-7, "mean")
    assert above(flattened["pad_max_abs_err"].max(), 1e-4, "pads")  # they differ, apart
    assert below(result.layers["max_abs_err"].max(), 1e-6, "layers")


def test_a_wrong_bias_in_the_nanogpt_port_fails_in_its_layer():
    reference, inputs = _gpt2(), _padded_inputs(9)
    result = introspect.diff(reference, nanogpt_gpt2_port.build(reference, "fc_bias_off", 1),
                             inputs)
    assert not result.passed
    first = result.first_divergence
    assert (first.layer, first.module) == ("h.1", "transformer.h.1.mlp.c_fc")
    assert below(abs(first.local_max_abs_err - 0.05), 1e-6)


# -- padding from the layout ----------------------------------------------------------
def test_padding_follows_the_token_axis_not_the_first_axis_of_size_s():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    padding = Padding(mask)
    heads_first = padding.mask_for((2, 4, 4, 3), (BATCH, None, TOKENS, None))
    assert heads_first.shape == (2, 1, 4, 1)
    assert heads_first[1, 0, :, 0].tolist() == [False, False, True, True]
    tokens_first = padding.mask_for((2, 4, 4, 3), (BATCH, TOKENS, None, None))
    assert tokens_first.shape == (2, 4, 1, 1)
    rows = padding.mask_for((8, 5), (ROWS, None))
    assert rows.shape == (8, 1) and rows[:, 0].tolist() == [False] * 6 + [True] * 2
    assert padding.mask_for((8, 5)) is None  # from the shape alone: no batch axis


# -- reshaped weights and offset tables ----------------------------------------------------
class _Reference(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(50, 16)
        self.positions = nn.Embedding(20, 16)  # RoBERTa-style: entries 0, 1 never used
        self.norm = nn.LayerNorm(16)
        self.proj = nn.Linear(16, 16, bias=False)
        self.out = nn.Linear(16, 16)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1]) + 2
        x = self.norm(self.tokens(input_ids) + self.positions(positions))
        return self.out(torch.tanh(self.proj(x)))


class _Port(nn.Module):
    """The same model with the position table cut to the rows used, and ``proj`` held as
    (heads, head size, in) for an einsum."""

    def __init__(self, reference: _Reference) -> None:
        super().__init__()
        self.tokens = nn.Embedding.from_pretrained(reference.tokens.weight.detach().clone())
        self.positions = nn.Embedding.from_pretrained(
            reference.positions.weight.detach()[2:].clone())
        self.norm = nn.LayerNorm(16)
        self.norm.load_state_dict(reference.norm.state_dict())
        self.proj = nn.Parameter(reference.proj.weight.detach().reshape(4, 4, 16).clone())
        self.out = nn.Linear(16, 16)
        self.out.load_state_dict(reference.out.state_dict())

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        B, S = input_ids.shape
        positions = torch.arange(S)
        x = self.norm(self.tokens(input_ids) + self.positions(positions))
        h = torch.einsum("bsi,hdi->bshd", x, self.proj)  # (B, S, nh, hd)
        return self.out(torch.tanh(h.reshape(B, S, 16)))


def _toy() -> tuple[_Reference, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    reference = _perturbed(_Reference()).eval()
    return reference, {"input_ids": torch.randint(0, 50, (2, 6))}


def test_a_reshaped_weight_and_an_offset_embedding_table_are_anchors_named_in_the_notes():
    reference, inputs = _toy()
    result = introspect.diff(reference, _Port(reference).eval(), inputs)
    assert result.passed and below(result.nodes["max_abs_err"].max(), 1e-6)
    rows = result.nodes.set_index("reference_node")
    assert rows.loc["positions", "matched_by"] == BY_WEIGHTS
    assert "offset embedding table" in rows.loc["positions", "note"]
    assert rows.loc["proj", "matched_by"] == BY_WEIGHTS and rows.loc["proj", "candidate_node"] \
        == "einsum"
    assert any("offset embedding table" in n for n in result.notes)
    assert any("proj is the reference's reshaped" in n or "reference's reshaped: proj" in n
               for n in result.notes)


def test_the_search_for_reshaped_weights_reads_only_weights_of_their_size(monkeypatch):
    """A reshape keeps the number of values: the token (800 values) and position (320)
    tables cannot be ``proj`` (256) reshaped, so their bytes are not read for it (reading
    every matrix made ``--generate`` on GPT-2 2.5x slower), and ``proj`` still relates."""
    from introspect.diff.ops.align import weights

    keyed: list[int] = []
    real_key = weights._vector_key

    def counting_key(rows: torch.Tensor) -> tuple[object, ...]:
        keyed.append(rows.numel())
        return real_key(rows)

    monkeypatch.setattr(weights, "_vector_key", counting_key)
    reference, inputs = _toy()
    result = introspect.diff(reference, _Port(reference).eval(), inputs)
    assert result.passed
    assert result.nodes.set_index("reference_node").loc["proj", "matched_by"] == BY_WEIGHTS
    assert 256 in keyed and not {800, 320} & set(keyed)


def test_a_wrong_reshaped_weight_still_fails_at_its_op():
    reference, inputs = _toy()
    port = _Port(reference).eval()
    with torch.no_grad():
        port.proj[1, 2, 3] += 0.1
    result = introspect.diff(reference, port, inputs)
    assert not result.passed
    assert result.first_divergence.reference_node == "proj"


# -- a structure-only pair is never blamed on its own ------------------------------------
def _chain_graph() -> object:
    def f(x):
        a = x * 2
        b = a + 1
        return torch.tanh(b)

    class _Graph:
        gm = torch.fx.symbolic_trace(f)

    return _Graph()


def _row(name: str, matched_by: str, status: str, mismatched: int) -> NodeDiff:
    return NodeDiff(name, name, "", "layer", "op", "(2,)", "float32", 0.1 if mismatched else 0.0,
                    0.1, 0.1, mismatched, 0, 0.1 if status == STATUS_FAIL else 0.0, 0.1, 0.1,
                    1 if status == STATUS_FAIL else 0, 0.0, 1e-5, 1e-6, status, matched_by,
                    "", 0, 0)


def test_a_structure_only_failure_needs_its_difference_to_reach_an_output():
    graph = _chain_graph()
    names = [n.name for n in graph.gm.graph.nodes if n.op == "call_function"]  # mul, add, tanh
    for matched_by in (BY_STRUCTURE, BY_WEIGHTS):  # nothing after it differs: never blamed
        rows = [_row(names[0], matched_by, STATUS_FAIL, 3),
                _row(names[1], BY_WEIGHTS, "ok", 0),
                _row(names[2], BY_WEIGHTS, "ok", 0)]
        assert confirm_failures(rows, graph)[0].status == STATUS_UNCONFIRMED, matched_by
    rows = [_row(names[0], BY_STRUCTURE, STATUS_FAIL, 3), _row(names[1], BY_STRUCTURE, "drift", 3),
            _row(names[2], BY_WEIGHTS, "ok", 0)]  # a later structure-only pair differs ...
    confirmed = confirm_failures(rows, graph)[0]  # ... but no output nor proven pair does
    assert confirmed.status == STATUS_UNCONFIRMED and "reaches no output" in confirmed.note
    for matched_by in (BY_STRUCTURE, BY_WEIGHTS):
        rows = [_row(names[0], matched_by, STATUS_FAIL, 3),
                _row(names[1], BY_WEIGHTS, "drift", 3),  # a pair proven by weights differs
                _row(names[2], BY_WEIGHTS, "ok", 0)]  # (not the output: a classifier's
        # logits can hide a tanh GELU under their budget): the same quantity, by proof
        assert confirm_failures(rows, graph)[0].status == STATUS_FAIL, matched_by
    rows = [_row(names[0], BY_STRUCTURE, STATUS_FAIL, 3), _row(names[1], BY_STRUCTURE, "drift", 3),
            _row(names[2], BY_WEIGHTS, "drift", 3)]  # the output differs: blamed
    assert confirm_failures(rows, graph)[0].status == STATUS_FAIL


# -- a projection permuted with its bias ---------------------------------------------------
class _Projected(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(50, 16)
        self.proj = nn.Linear(16, 16)
        self.out = nn.Linear(16, 16)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.proj(self.tokens(input_ids))))


class _Interleaved(_Projected):
    """``proj``'s rows (and bias) interleaved within heads of 4, put back after it."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.tokens(input_ids))  # (B, S, 16), each head interleaved
        B, S, _ = h.shape
        h = h.view(B, S, 4, 2, 2).transpose(3, 4).reshape(B, S, 16)  # half-split again
        return self.out(torch.tanh(h))


def _interleaved_pair(bias_off: float = 0.0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    reference = _perturbed(_Projected()).eval()
    port = _Interleaved().eval()
    port.load_state_dict(reference.state_dict())
    with torch.no_grad():
        port.proj.weight.copy_(llama2c_port.interleave_rows(reference.proj.weight, 4))
        order = llama2c_port.interleave_rows(torch.arange(16.0).unsqueeze(1), 4).squeeze(1)
        port.proj.bias.copy_(reference.proj.bias[order.long()])
        port.proj.bias[5] += bias_off
    return reference, port


def test_a_projection_permuted_with_its_bias_is_an_anchor_and_passes():
    reference, port = _interleaved_pair()
    inputs = {"input_ids": torch.randint(0, 50, (2, 6))}
    result = introspect.diff(reference, port, inputs)
    assert result.passed and below(result.nodes["max_abs_err"].max(), 1e-6)
    proj = result.nodes.set_index("reference_node").loc["proj"]
    assert proj["matched_by"] == BY_WEIGHTS and proj["local_max_abs_err"] == 0.0
    assert "rows of each head of 4 interleaved" in proj["note"]
    relations = {r.candidate: r.kind for r in result.alignment.relations}
    assert relations["proj.weight"] == relations["proj.bias"] == "permuted"
    assert not any("by name only" in n for n in result.notes)


def test_a_wrong_bias_of_a_permuted_projection_fails_there():
    reference, port = _interleaved_pair(bias_off=0.05)
    result = introspect.diff(reference, port, {"input_ids": torch.randint(0, 50, (2, 6))})
    assert not result.passed
    assert result.first_divergence.reference_node == "proj"
