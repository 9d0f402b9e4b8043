"""diff(..., generate=N): parity step by step, node by node, through greedy decoding.

The ports are written here, each with its own cache (tests/generate/gpt2_concat.py: a
(B, S, nh, hd) cache grown by concatenation; tests/generate/llama_static.py: a
pre-allocated static cache, rotary and grouped-query attention; the walkthrough's
examples/generation/gpt2_cached.py); each injected bug must fail at the right step, in
the right layer and node, with the right hint.
"""

from __future__ import annotations

import pytest
import torch

import introspect
from introspect.errors import InputError
from tests.generate import gpt2_concat, llama_static

from .conftest import PROMPT


def _generate(reference, candidate, steps=3):
    return introspect.diff(reference, candidate, {"input_ids": PROMPT}, generate=steps)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_generate_8_against_itself_passes_at_zero(name, request):
    model = request.getfixturevalue(name)
    result = _generate(model, model, 8)
    assert result.passed, result.summary()
    assert result.first_divergence is None
    steps = result.steps
    assert list(steps["step"]) == list(range(8))
    assert list(steps["position"]) == [0, 5, 6, 7, 8, 9, 10, 11]
    assert list(steps["fed_tokens"]) == [5] + [1] * 7
    assert (steps["logits_max_abs_err"] == 0.0).all()
    assert steps["tokens_agree"].all()
    caches = result.caches
    assert len(caches) == 8 * 2 * 2  # steps x layers x (keys, values)
    assert (caches["max_abs_err"] == 0.0).all() and caches["passed"].all()
    assert set(caches["layout"]) == {"same layout"}
    assert list(caches[caches["step"] == 7]["filled"])[0] == 12
    # the tokens are the model's own greedy generation with its cache
    with torch.no_grad():
        expected = model.generate(PROMPT, max_new_tokens=8, do_sample=False,
                                  pad_token_id=0, eos_token_id=None)[0, 5:].tolist()
    assert list(result.generated.reference) == expected == list(result.generated.candidate)


def test_correct_ports_pass(gpt2, llama, gpt2_example):
    for reference, port in ((gpt2, gpt2_concat.GPT2(gpt2)),
                            (gpt2, gpt2_example.build(gpt2)),
                            (llama, llama_static.Llama.from_hf(llama))):
        result = _generate(reference, port, 4)
        assert result.passed, result.summary()
        assert result.caches["passed"].all()
        assert result.steps["tokens_agree"].all()


def test_cache_layouts_are_read_by_value(gpt2, llama):
    concat = _generate(gpt2, gpt2_concat.GPT2(gpt2), 2).caches
    assert set(concat["layout"]) == {"permute (0, 2, 1, 3)"}  # (B, S, nh, hd) for HF's
    static = _generate(llama, llama_static.Llama.from_hf(llama), 2).caches
    assert set(static["layout"]) == {"permute (0, 2, 1, 3), sequence axis pre-allocated to "
                                     f"32 ({n} filled)" for n in (5, 6)}


def test_one_object_holding_every_layers_cache_in_lists_is_compared(gpt2):
    """Probe round n: a static cache as one object whose ``k_cache``/``v_cache`` are lists
    of each layer's tensors went uncompared ("caches not compared")."""
    result = _generate(gpt2, gpt2_concat.GPT2(gpt2, static=True), 3)
    assert result.passed, result.summary()
    assert not any(note.startswith("caches not compared") for note in result.notes)
    caches = result.caches
    assert len(caches) and caches["passed"].all()
    assert set(caches["layout"]) == {"permute (0, 2, 1, 3), sequence axis pre-allocated to "
                                     f"64 ({n} filled)" for n in (5, 6, 7)}


# (bug, step, where the step first diverges, text of the hint; None: no hint expected)
GPT2_BUGS = [
    ("positions-off-by-one", 1, "transformer.wpe",
     "positions are not advanced with the cache at step 1 (off by +1): it used position 6 "
     "where the reference used 5"),
    ("update-twice", 1, "cache: layer 0 keys",
     "cache is updated twice at step 1: layer 0's cached keys after step 1 hold 7 positions"),
    ("not-updated", 1, "cache: layer 0 keys",
     "cache is not updated at step 1: layer 0's cached keys after step 1 hold 5 positions"),
    ("wrong-axis", 1, "step 1", "concatenated on the wrong axis"),
]
LLAMA_BUGS = [
    ("positions-restart", 1, "model.layers.0.self_attn",
     "rotary embeddings are at the wrong offset at step 1: position 0 where the reference's "
     "are at 5 (positions not advanced with the cache: restart at 0)"),
    ("positions-off-by-one", 1, "model.layers.0.self_attn",
     "position 4 where the reference's are at 5 (positions not advanced with the cache: off "
     "by -1)"),
    ("rotary-key-offset", 1, "model.layers.0.self_attn",
     "caches its keys at the wrong rotary offset at step 1: keys of layer 0 are the "
     "reference's rotated to position 0 instead of 5"),
    ("not-updated", 1, "cache: layer 0 keys",
     "cache is not updated at step 1: the slot of position 5 in layer 0's cached keys"),
    ("mask-as-prompt", 1, "model.layers.0.self_attn",
     "applies the causal mask to its length-1 query as if it were a prompt"),
    ("gqa-tiled", 1, "model.layers.0.self_attn",
     "repeats key/value heads in the wrong order on the cached path"),
    ("attend-unfilled", 1, "model.layers.0.self_attn",
     "attention reads the pre-allocated, unfilled part of its static cache"),
]


def _check_bug(result, step, where, hint):
    assert not result.passed
    d = result.first_divergence
    assert d is not None and d.step == step, result.summary()
    rows = result.steps
    assert rows.iloc[0]["passed"]  # the prefill agrees: only the cached path is wrong
    first = rows[~rows["passed"]].iloc[0]
    assert first["step"] == step
    if where.startswith("cache: "):
        assert first["cache"] == where.removeprefix("cache: ") and not first["first_node"]
        assert d.module == "cache" and d.layer == f"layer {where.split()[2]}"
    elif where.startswith("step "):
        assert d.layer == where and d.op == "error"
        assert d.detail.startswith(f"the candidate failed at {where}: ") and "Sizes" in d.detail
    else:
        assert d.module == where or d.layer == where or d.module.startswith(where), \
            result.summary()
    found = [h for h in d.hints if hint in h] if hint else d.hints
    assert found if hint else not found, result.summary()
    assert tuple(first["hints"]) == tuple(h for h in d.hints if h in first["hints"])


@pytest.mark.parametrize(("bug", "step", "where", "hint"), GPT2_BUGS,
                         ids=[b[0] for b in GPT2_BUGS])
def test_gpt2_concatenated_cache_bugs(gpt2, bug, step, where, hint):
    _check_bug(_generate(gpt2, gpt2_concat.GPT2(gpt2, bug)), step, where, hint)


@pytest.mark.parametrize(("bug", "step", "where", "hint"), LLAMA_BUGS,
                         ids=[b[0] for b in LLAMA_BUGS])
def test_llama_static_cache_bugs(llama, bug, step, where, hint):
    _check_bug(_generate(llama, llama_static.Llama.from_hf(llama, bug)), step, where, hint)


def test_walkthrough_port_with_positions_not_advanced(gpt2, gpt2_example):
    result = _generate(gpt2, gpt2_example.build_positions_not_advanced(gpt2), 4)
    _check_bug(result, 1, "transformer.wpe",
               "positions are not advanced with the cache at step 1 (restart at 0): it used "
               "position 0 where the reference used 5")
    assert list(result.steps["passed"]) == [True, False, False, False]
    assert result.steps.iloc[1]["cache"] == "layer 0 keys"  # cached at a wrong position
    # the layer table blames where the last line does, not the mask beside the positions
    failing = [row.layer for row in result.layer_rows if row.failing]
    assert failing and "mask" not in failing and result.first_divergence.layer in failing


def test_tokens_part_and_teacher_forcing_is_said(llama):
    result = _generate(llama, llama_static.Llama.from_hf(llama, "mask-as-prompt"), 4)
    parting = result.generated.first_parting
    assert parting is not None
    assert result.steps.iloc[parting]["reference_token"] != \
        result.steps.iloc[parting]["candidate_token"]
    assert any(f"part at step {parting}" in n and "teacher forcing" in n for n in result.notes)
    assert list(result.steps["step"]) == [0, 1, 2, 3]  # every step still compared


def test_bad_inputs_are_one_line_errors(gpt2):
    with pytest.raises(InputError, match="positive number of tokens"):
        introspect.diff(gpt2, gpt2, {"input_ids": PROMPT}, generate=-1)

    class NoCache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = gpt2

        def forward(self, input_ids):
            return self.inner(input_ids=input_ids).logits

    with pytest.raises(InputError, match="takes no past_key_values"):
        introspect.diff(gpt2, NoCache(), {"input_ids": PROMPT}, generate=2)
    with pytest.raises(InputError, match="prompt"):
        introspect.diff(gpt2, gpt2, {"input_ids": torch.zeros(1, 0, dtype=torch.long)},
                        generate=2)


def test_training_mode_is_run_in_eval_and_put_back(gpt2, gpt2_example):
    port = gpt2_example.build(gpt2).train()
    result = _generate(gpt2, port, 2)
    assert result.passed, result.summary()
    assert port.training and all(m.training for m in port.modules())
    assert not gpt2.training
    assert any("the candidate had module(s) in training mode" in n for n in result.notes)
