"""Ports in the style of public repositories, through ``introspect.diff`` (issue 20).

``tests/ports/`` holds four ports written here the way well-known repositories write their
models: nanoGPT's and minGPT's GPT-2, llama2.c's Llama (interleaved rotary, so its export
permutes HF's q/k rows within each head) and pytorchic-bert's BERT (a hand-written
LayerNorm). Each loads an HF model's weights as its own repository's loader does.

First plain torch: every correct port matches HF on the real tokens, and every fault
changes them. Then the diff: a correct port passes on padded and unpadded texts and when
the token count equals the number of heads (``nh == S``, where a (B, S, nh, hd) tensor and
HF's (B, nh, S, hd) have one shape); each fault fails in its own layer, the first
divergence at an op that computes (not a layout op) inside the module where HF computes
what the fault breaks, and a hint, if any, that names the fault.

References are random-init tiny models with every 1-D parameter (norm weights, biases)
perturbed, since their identity norms and zero biases hide faults; GPT-2 and Llama are
all initialised at std 0.1 (at 0.02 attention is nearly uniform and activations small: a
swapped query and key, or another GELU, then change nothing measurable).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import introspect
from introspect.diff.records import STATUS_FAIL
from tests import launch
from tests.bounds import above, below
from tests.fixtures.families import perturb_vectors, tiny_inputs, tiny_model
from tests.ports.batch import port_batch

ROOT = Path(__file__).resolve().parents[2]
LAYER = 1  # the faulty layer: every reference here has two (MiniLM: six, see MINILM_LAYER)
MINILM_LAYER = 2
PORTS = ("nanogpt_gpt2", "mingpt_gpt2", "llama2c", "pytorchic_bert")
REFERENCE = {"nanogpt_gpt2": "gpt2", "mingpt_gpt2": "gpt2", "llama2c": "llama",
             "pytorchic_bert": "bert-tiny"}

LAYOUT_OPS = {"view", "reshape", "transpose", "permute", "contiguous", "expand", "unsqueeze",
              "squeeze", "flatten", "unflatten", "getitem", "split", "chunk", "t", "narrow",
              "select", "Dropout", "dropout", "clone", "to", "type_as", "float", "unbind",
              "stack", "repeat", "repeat_interleave", "cat"}


@dataclass(frozen=True)
class Want:
    layer: str  # the first divergence's layer
    module: str  # a prefix of its module (the reference's path)
    hint: str  # a hint, if any is given, contains one of these words ("|"-separated)


# port -> fault -> where the diff must find it (LAYER is 1)
EXPECTED: dict[str, dict[str, Want]] = {
    "nanogpt_gpt2": {
        "gelu_erf": Want("h.1", "transformer.h.1.mlp", "erf"),
        "qk_swapped": Want("h.1", "transformer.h.1.attn", "swapped"),
        "no_causal_mask": Want("h.1", "transformer.h.1.attn", "causal"),
        "scale_1_over_d": Want("h.1", "transformer.h.1.attn", "scale"),
        "c_proj_untransposed": Want("h.1", "transformer.h.1.attn.c_proj", "transposed"),
        "missing_residual": Want("h.1", "transformer.h.1", "residual"),
        # GPT-2 sums token and position embeddings in its backbone's own forward
        "position_offset": Want("embeddings", "transformer", "position"),
    },
    "mingpt_gpt2": {
        "gelu_erf": Want("h.1", "transformer.h.1.mlp", "erf"),
        "kv_swapped": Want("h.1", "transformer.h.1.attn", "swapped"),
        "causal_triu": Want("h.1", "transformer.h.1.attn", "causal"),
        "scale_by_embd": Want("h.1", "transformer.h.1.attn", "scale"),
        "mlp_residual_missing": Want("h.1", "transformer.h.1", "residual"),
        "ln_swapped": Want("h.1", "transformer.h.1.ln_", "ln_1|ln_2|layernorm"),
    },
    "llama2c": {
        "unpermuted": Want("layers.1", "layers.1.self_attn", "rotary|permut|interleav"),
        "rotary_model_dim": Want("layers.1", "layers.1.self_attn", "rotary|frequenc"),
        "gqa_tiled": Want("layers.1", "layers.1.self_attn", "key/value heads"),
        "rms_eps": Want("layers.1", "layers.1.input_layernorm", "eps"),
        "no_causal_mask": Want("layers.1", "layers.1.self_attn", "causal"),
        "w1_w3_swapped": Want("layers.1", "layers.1.mlp", "gate|up_proj"),
        "scale_1_over_d": Want("layers.1", "layers.1.self_attn", "scale"),
        "missing_residual": Want("layers.1", "layers.1", "residual"),
    },
    "pytorchic_bert": {
        "qk_swapped": Want("encoder.layer.1", "encoder.layer.1.attention.self", "swapped"),
        "heads_split_transposed": Want("encoder.layer.1", "encoder.layer.1.attention.self",
                                       "head"),
        "scale_missing": Want("encoder.layer.1", "encoder.layer.1.attention.self", "scal"),
        "missing_residual": Want("encoder.layer.1", "encoder.layer.1.attention.output",
                                 "residual"),
        "gelu_tanh": Want("encoder.layer.1", "encoder.layer.1.intermediate", "tanh"),
        "ln_unbiased_var": Want("encoder.layer.1",
                                "encoder.layer.1.attention.output.LayerNorm", "unbiased"),
        # every norm at nn.LayerNorm's 1e-5: the embeddings' input varies least
        "ln_eps": Want("embeddings", "embeddings.LayerNorm", "eps"),
        "segment_ignored": Want("embeddings", "embeddings", "token type"),
    },
}


def port(name: str):
    return importlib.import_module(f"tests.ports.{name}")


@functools.cache
def reference(name: str, heads: int | None = None) -> torch.nn.Module:
    """A perturbed tiny reference (``heads`` overrides its number of heads)."""
    if name == "gpt2":
        extra = {"n_head": heads} if heads else {}
        return perturb_vectors(tiny_model("gpt2", head="causal-lm", initializer_range=0.1, **extra))
    if name == "llama":
        extra = {"num_attention_heads": heads} if heads else {}
        return perturb_vectors(tiny_model("llama", initializer_range=0.1, **extra))
    from introspect.models.load import load_model

    model = load_model(name, head="base").model  # a fresh copy: not the session fixture's
    if name == "minilm":
        return model
    with torch.no_grad():  # initialised at std 0.1 as the others, not BERT's 0.02
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(5.0)
    return perturb_vectors(model)


@functools.cache
def texts(name: str, kind: str) -> dict[str, torch.Tensor]:
    """``padded`` (the first row padded), ``unpadded`` (cut to the first row's real tokens)
    or ``nh_eq_S`` (cut to as many tokens as the reference has heads, one padded)."""
    if name in ("gpt2", "llama"):
        batch = tiny_inputs(name)
    else:
        from introspect.models.load import load_model

        batch = port_batch(load_model("bert-tiny", head="base").tokenizer)
    if kind == "padded":
        return batch
    if kind == "unpadded":
        real = int(batch["attention_mask"].sum(-1).min())
        cut = {k: v[:, :real].clone() for k, v in batch.items()}
        assert bool(cut["attention_mask"].all())
        return cut
    heads = heads_of(reference(name, 8 if name in ("gpt2", "llama") else None))
    cut = {k: v[:, :heads].clone() for k, v in batch.items()}
    cut["attention_mask"][0, -1] = 0
    cut["input_ids"][0, -1] = 0
    return cut


def heads_of(model: torch.nn.Module) -> int:
    c = model.config
    return getattr(c, "n_head", None) or c.num_attention_heads


def hf_output(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    out = model(**inputs)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def real_tokens_error(model: torch.nn.Module, candidate: torch.nn.Module,
                      inputs: dict[str, torch.Tensor]) -> float:
    with torch.no_grad():
        expected = hf_output(model, inputs)
        got = candidate(**inputs)
    real = inputs["attention_mask"].bool()
    return float((got - expected)[real].abs().max())


# -- plain torch: the ports themselves ------------------------------------------------------

@pytest.mark.parametrize("name", PORTS)
@pytest.mark.parametrize("kind", ["padded", "unpadded", "nh_eq_S"])
def test_a_correct_port_matches_hf_on_the_real_tokens(name, kind):
    ref_name = REFERENCE[name]
    model = reference(ref_name, 8 if kind == "nh_eq_S" and ref_name != "bert-tiny" else None)
    inputs = texts(ref_name, kind)
    if kind == "nh_eq_S":
        assert inputs["input_ids"].shape[1] == heads_of(model)
    assert below(real_tokens_error(model, port(name).build(model), inputs), 1e-5)


@pytest.mark.parametrize("name", PORTS)
def test_each_fault_changes_the_outputs_on_the_real_tokens(name):
    model = reference(REFERENCE[name])
    inputs = texts(REFERENCE[name], "padded")
    assert set(port(name).FAULTS) == set(EXPECTED[name])
    errors = {f: real_tokens_error(model, port(name).build(model, f, LAYER), inputs)
              for f in port(name).FAULTS}
    assert all([above(e, 5e-5, f) for f, e in errors.items()]), errors


@pytest.mark.parametrize("kind", ["padded", "unpadded", "nh_eq_S"])
def test_llama2c_with_hf_half_split_rotary_matches_hf(kind):
    model = reference("llama", 8 if kind == "nh_eq_S" else None)
    candidate = port("llama2c").build_half_split(model)
    assert below(real_tokens_error(model, candidate, texts("llama", kind)), 1e-5)


def test_the_llama2c_port_holds_q_and_k_permuted_within_each_head():
    # What makes the port correct although its wq differs from HF's q_proj: the same rows
    # in another order, pairs (i, i + hd/2) made adjacent within each head.
    model = reference("llama")
    built = port("llama2c").build(model)
    hf, mine = model.layers[0].self_attn.q_proj.weight, built.layers[0].attention.wq.weight
    hd = model.config.head_dim
    order = torch.arange(hf.shape[0]).view(-1, 2, hd // 2).transpose(1, 2).reshape(-1)
    assert not torch.equal(hf, mine) and torch.equal(hf[order], mine)


# -- through introspect.diff ----------------------------------------------------------------

@functools.cache
def judged(name: str, fault: str | None, kind: str = "padded", ref_name: str = "",
           layer: int = LAYER, builder: str = "build"):
    ref_name = ref_name or REFERENCE[name]
    model = reference(ref_name, 8 if kind == "nh_eq_S" and ref_name in ("gpt2", "llama")
                      else None)
    inputs = texts(ref_name, kind) if ref_name != "minilm" else minilm_texts(kind)
    return introspect.diff(model, getattr(port(name), builder)(model, fault, layer), inputs)


@functools.cache
def minilm_texts(kind: str) -> dict[str, torch.Tensor]:
    from introspect.models.load import load_model

    batch = port_batch(load_model("bert-tiny", head="base").tokenizer)  # the same vocab
    if kind == "padded":
        return batch
    heads = heads_of(reference("minilm"))
    assert batch["input_ids"].shape[1] >= heads
    cut = {k: v[:, :heads].clone() for k, v in batch.items()}
    cut["attention_mask"][0, -1] = 0
    cut["input_ids"][0, -1] = 0
    return cut


def explain(result) -> str:
    d = result.first_divergence
    failing = sorted({r.layer for r in result.rows if r.status == STATUS_FAIL})
    if d is None:
        return f"passed={result.passed}, no first divergence, FAIL rows in {failing}"
    return (f"passed={result.passed}; first divergence {d.op} in {d.module} (layer {d.layer}, "
            f"candidate {d.candidate_node}, local error {d.local_max_abs_err:.3g}); FAIL rows "
            f"in {failing}; hints {list(d.hints)}; notes {list(result.notes)}")


def assert_passes(result) -> None:
    assert result.passed and result.first_divergence is None, explain(result)
    assert not any(r.status == STATUS_FAIL for r in result.rows), explain(result)


def assert_found(result, want: Want) -> None:
    d = result.first_divergence
    assert not result.passed and d is not None, explain(result)
    assert d.layer == want.layer, f"expected layer {want.layer}; " + explain(result)
    op = d.op.rsplit(".", 1)[-1]
    assert op not in LAYOUT_OPS and d.module.startswith(want.module), (
        f"expected a computing op in {want.module}; " + explain(result))
    words = want.hint.lower().split("|")
    assert not d.hints or any(w in d.hints[0].lower() for w in words), (
        f"expected a hint naming {want.hint!r} or none; " + explain(result))


@pytest.mark.parametrize("name", PORTS)
@pytest.mark.parametrize("kind", ["padded", "unpadded", "nh_eq_S"])
def test_a_correct_port_passes(name, kind):
    assert_passes(judged(name, None, kind))


def test_nanogpt_as_released_ignores_the_mask_and_passes_on_the_real_tokens():
    # Padded on the right, the causal mask keeps every real token from the pads: the real
    # tokens agree, the padded positions do not (HF leaves them undefined). GPT-2's Conv1D
    # computes on rows flattened to (B·S, F): their padded rows must not count either.
    model, inputs = reference("gpt2"), texts("gpt2", "padded")
    candidate = port("nanogpt_gpt2").build_as_released(model)
    with torch.no_grad():
        assert not torch.allclose(hf_output(model, inputs), candidate(**inputs), atol=1e-3)
    assert below(real_tokens_error(model, candidate, inputs), 1e-5)
    result = introspect.diff(model, candidate, inputs)
    assert_passes(result)
    assert below(result.max_abs_err, 1e-4, "diff"), explain(result)


def test_scores_kept_on_the_module_leave_no_proxy_and_a_second_diff_passes():
    # pytorchic-bert keeps its attention probabilities on the module (self.scores = scores)
    model, inputs = reference("bert-tiny"), texts("bert-tiny", "padded")
    candidate = port("pytorchic_bert").build(model)
    for _ in range(2):
        assert_passes(introspect.diff(model, candidate, inputs))
        kept = [b.attn.scores for b in candidate.blocks]
        assert all(s is None or type(s) is torch.Tensor for s in kept), [type(s) for s in kept]
    with torch.no_grad():
        assert below(real_tokens_error(model, candidate, inputs), 1e-5)


# Faults the engine still blames elsewhere (issue 20's closing note): a residual left out
# has no node of its own to blame (the next compared node parts: GPT-2's ln_f, or a view
# in Llama's next norm), and a head split transposed gets the scale hint its side effect
# (1/sqrt(nh) for 1/sqrt(hd)) deserves.
KNOWN_MISSES = {
    ("mingpt_gpt2", "mlp_residual_missing"): "blamed in ln_f: the missing add has no node",
    ("llama2c", "missing_residual"): "blamed on type_as (a move) in the next norm",
    ("pytorchic_bert", "heads_split_transposed"): "the scale hint fires for a head split",
}


@pytest.mark.parametrize(("name", "fault"), [
    pytest.param(n, f, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[(n, f)]))
    if (n, f) in KNOWN_MISSES else (n, f) for n in PORTS for f in EXPECTED[n]])
def test_a_fault_fails_in_its_layer_at_its_op_with_a_right_hint_or_none(name, fault):
    assert_found(judged(name, fault), EXPECTED[name][fault])


@pytest.mark.parametrize("kind", ["padded", "unpadded", "nh_eq_S"])
def test_llama2c_with_hf_half_split_rotary_passes(kind):
    # HF's weights as they are, HF's rotary, but in llama2.c's (bs, seqlen, nh, hd) layout:
    # no permutation to recognise, only layouts to try
    assert_passes(judged("llama2c", None, kind, builder="build_half_split"))


@pytest.mark.parametrize("fault", ["gqa_tiled", "rms_eps", "no_causal_mask"])
def test_llama2c_with_hf_half_split_rotary_faults_are_found(fault):
    assert_found(judged("llama2c", fault, builder="build_half_split"),
                 EXPECTED["llama2c"][fault])


@pytest.mark.parametrize(("name", "fault"), [("llama2c", "unpermuted"),
                                             ("nanogpt_gpt2", "qk_swapped")])
def test_a_fault_is_found_when_the_heads_equal_the_tokens(name, fault):
    assert_found(judged(name, fault, "nh_eq_S"), EXPECTED[name][fault])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["padded", "nh_eq_S"])
def test_pytorchic_bert_passes_on_minilm(kind):
    assert_passes(judged("pytorchic_bert", None, kind, "minilm"))


@pytest.mark.slow
def test_pytorchic_bert_ln_eps_is_found_on_minilm():
    # a real checkpoint: the default 1e-5 of nn.LayerNorm for BERT's 1e-12
    want = Want("embeddings", "embeddings.LayerNorm", "eps")
    assert_found(judged("pytorchic_bert", "ln_eps", "padded", "minilm", MINILM_LAYER), want)


# -- through the CLI ------------------------------------------------------------------------

@pytest.mark.slow  # a process of its own each: ~20 s
@pytest.mark.parametrize(("model", "name"), [("llama-tiny", "llama2c"),
                                             ("bert-tiny", "pytorchic_bert")])
def test_the_cli_passes_a_correct_port_given_by_its_file(model, name):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                  "")])}
    done = launch.run([sys.executable, "-m", "introspect", "diff", "--model", model,
                       "--candidate", f"tests/ports/{name}.py:build", "--quiet"],
                      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "parity holds" in done.stdout + done.stderr
