"""The independent ports, checked with plain torch before they are used to check the diff.

A correct port must match HF within fp32 noise; every injected fault must change the
outputs measurably (more than fp32's default atol), or it would test nothing.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.bounds import above, below
from tests.ports.batch import port_batch

STYLES = ("hf_like", "nanogpt_style", "functional", "torch_builtin")
# torch.testing's fp32 atol. As a floor for faults it is not a bound on rounding: a fault's
# effect is its arithmetic (the tanh GELU measured 1.32e-5, a 1.3x margin, the LayerNorm eps
# 2.4e-5), which another CPU moves only by its rounding: 1.29e-5 on make test's second path.
NOISE = 1e-5


def _module(style: str):
    return importlib.import_module(f"tests.ports.{style}")


def _outputs(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        out = model(**batch)
    if isinstance(out, dict):
        if "last_hidden_state" in out:
            return out["last_hidden_state"], out["pooler_output"]
        return out["hidden"], out["pooled"]
    return out[0], out[1]


def _error(reference, port, batch) -> float:
    """Largest |port - reference| over real tokens of the sequence output and the pooled one."""
    ref_seq, ref_pooled = _outputs(reference, batch)
    seq, pooled = _outputs(port, batch)
    real = batch["attention_mask"].bool()
    return max((seq - ref_seq)[real].abs().max().item(),
               (pooled - ref_pooled).abs().max().item())


@pytest.fixture(scope="module")
def tiny(tiny_models):
    loaded = tiny_models("base", "sdpa")
    return loaded.model, port_batch(loaded.tokenizer)


def test_the_batch_exercises_padding_and_both_segments(tiny):
    _, batch = tiny
    assert batch["input_ids"].shape[0] == 3
    assert (batch["attention_mask"] == 0).any()
    assert set(batch["token_type_ids"].unique().tolist()) == {0, 1}


@pytest.mark.numeric
@pytest.mark.parametrize("style", STYLES)
def test_correct_port_matches_hf_on_bert_tiny(tiny, style):
    reference, batch = tiny
    port = _module(style).build(reference)
    assert not port.training
    assert below(_error(reference, port, batch), NOISE, style)


@pytest.mark.parametrize("style", STYLES)
def test_every_fault_changes_the_outputs_on_bert_tiny(tiny, style):
    reference, batch = tiny
    module = _module(style)
    errors = {f: _error(reference, module.build(reference, f, layer=0), batch)
              for f in module.FAULTS}
    quiet = {f: err for f, err in errors.items() if not above(err, NOISE, f)}
    assert not quiet, f"faults that change nothing measurable: {quiet}"


@pytest.mark.parametrize("style", STYLES)
def test_active_dropout_makes_two_eval_runs_differ(tiny, style):
    reference, batch = tiny
    port = _module(style).build(reference, "dropout_active")
    assert not torch.equal(_outputs(port, batch)[0], _outputs(port, batch)[0])


@pytest.mark.parametrize("style", STYLES)
def test_ports_refuse_unknown_faults(tiny, style):
    with pytest.raises(ValueError, match="unknown fault 'typo'"):
        _module(style).build(tiny[0], "typo")


def test_ports_import_nothing_from_introspect():
    import ast
    from pathlib import Path

    for path in Path(__file__).parent.glob("*.py"):
        if path.name.startswith("test_"):
            continue
        tree = ast.parse(path.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {m for m in imported if m.startswith(("introspect", "tests.fixtures"))}, path


@pytest.mark.slow
@pytest.mark.parametrize("style", STYLES)
def test_ports_on_minilm(minilm, style):
    reference, batch = minilm.model, port_batch(minilm.tokenizer)
    module = _module(style)
    assert below(_error(reference, module.build(reference), batch), NOISE, style)
    quiet = [f for f in module.FAULTS
             if _error(reference, module.build(reference, f, layer=2), batch) <= NOISE]
    assert not quiet
