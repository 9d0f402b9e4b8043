"""Attention maps and captures of the cousins: HF's own probabilities, and captures at 0.0."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import introspect
from introspect.cli.main import main
from introspect.dump import capture, capture_bytes, diff_dump, read_capture
from introspect.dump.formats import Dump
from introspect.models.families import FAMILIES, RANDOM_MODELS
from tests.bounds import below
from tests.fixtures.families import LAYERS, TINY, tiny_inputs, tiny_model


def _hf_attentions(family: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """What HF itself returns: an eager model's ``attentions``, (layers, batch, heads, q, k)."""
    with torch.no_grad():
        out = tiny_model(family, attn="eager")(**inputs, output_attentions=True)
    return torch.stack([a.float() for a in out.attentions])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_maps_are_hfs_own_attentions_under_sdpa_and_eager(family):
    inputs = tiny_inputs(family)
    expected = _hf_attentions(family, inputs)
    config = tiny_model(family).config
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_heads", None) \
        or config.n_head  # Llama: query heads (4), not key/value heads (2)
    assert expected.shape[:3] == (len(LAYERS[family]), 2, heads)  # ALBERT: per call
    for attn in ("sdpa", "eager"):
        maps = introspect.attention(tiny_model(family, attn=attn), inputs)
        assert maps.probs.shape == expected.shape and len(maps.modules) == len(LAYERS[family])
        assert below((maps.probs - expected).abs().max().item(), 1e-6, f"{family} {attn}"), attn
        if FAMILIES[family].decoder:  # causal: no query sees a later key
            assert torch.all(maps.probs.triu(diagonal=1) == 0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_capture_round_trips_against_the_live_model_at_zero(tmp_path, family):
    model, inputs = tiny_model(family), tiny_inputs(family)
    path = tmp_path / "ref.safetensors"
    path.write_bytes(capture_bytes(capture(model, inputs, noise=True)))
    reference = read_capture(path)
    assert {e.layer for e in reference.entries} >= set(LAYERS[family])
    live = capture(model, reference.inputs)
    dump = Dump("live", live.values, {k: str(v.dtype).split(".")[-1]
                                      for k, v in live.values.items()}, True, dict(live.inputs))
    result = diff_dump(reference, dump, reference_model=model)
    assert result.passed and result.max_abs_err == 0.0 and result.alignment.coverage == 1.0


@pytest.mark.parametrize("name", list(RANDOM_MODELS))
def test_attention_and_capture_through_the_cli(tmp_path, monkeypatch, capsys, name):
    family = RANDOM_MODELS[name]  # the named model at its family's tiny sizes, to stay fast
    spec = FAMILIES[family]
    monkeypatch.setitem(FAMILIES, family, dataclasses.replace(
        spec, random_config={**spec.random_config, **TINY[family]}))
    monkeypatch.chdir(tmp_path)
    assert main(["attention", "--model", name, "--view", "model", "-o", "x.svg"]) == 0
    assert (tmp_path / "x.svg").read_text().startswith("<svg")
    assert main(["capture", "--model", name, "-o", "ref.safetensors"]) == 0
    assert main(["diff", "--model", name, "--reference-dump", "ref.safetensors",
                 "--candidate", "hf"]) == 0
    assert "parity holds (max abs error 0;" in capsys.readouterr().out
