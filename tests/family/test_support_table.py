"""The support table of docs/family.md is true: every cell is run on a tiny config of its family."""

from __future__ import annotations

import copy
import re
import xml.dom.minidom
from pathlib import Path

import pytest
import torch

import introspect
from introspect.dump import capture
from introspect.errors import TraceError
from introspect.models.families import FAMILIES, RANDOM_MODELS
from introspect.models.load import HEADS, RANDOM_SIZES, load_model, tokenize
from tests.fixtures.families import LAYERS, tiny_deberta, tiny_inputs, tiny_model

README = Path(__file__).resolve().parents[2] / "docs" / "family.md"
TYPES = {"BERT": "bert", "RoBERTa": "roberta", "DistilBERT": "distilbert", "ELECTRA": "electra",
         "ALBERT": "albert", "GPT-2": "gpt2", "Llama": "llama", "DeBERTa-v2": "deberta-v2"}


def _rows() -> dict[str, dict[str, str]]:
    text = README.read_text()
    table = re.search(r"<!-- support-table -->\n(.*?)<!-- /support-table -->", text, re.S)
    assert table is not None
    lines = [line.strip().strip("|").split("|") for line in table.group(1).strip().splitlines()]
    header = [cell.strip().replace("`", "") for cell in lines[0]]
    return {cells[0].strip(): dict(zip(header, (c.strip() for c in cells), strict=True))
            for cells in lines[2:]}


def test_the_table_has_a_row_per_family():
    assert set(_rows()) == set(TYPES)
    assert {TYPES[name] for name in _rows()} >= set(FAMILIES)


@pytest.mark.parametrize("name", [n for n in TYPES if TYPES[n] in FAMILIES])
def test_a_cousins_row_is_true(name):
    row, family = _rows()[name], TYPES[name]
    assert row["checkpoint model_type"] == family
    assert row["--model"].split(", ") == [m for m, f in RANDOM_MODELS.items() if f == family]
    assert row["heads"].split(", ") == list(FAMILIES[family].heads)
    prefix = LAYERS[family][0].rpartition(".")[0]
    assert row["layers"].startswith(f"{prefix}.N")
    assert (row["trace"], row["draw"], row["diff"], row["attention"], row["capture"]) == \
        ("yes",) * 5
    model, inputs = tiny_model(family), tiny_inputs(family)
    graph = introspect.trace(model, inputs, cache=False)  # trace: bit-exact
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    assert torch.equal(graph.gm(**inputs)["last_hidden_state"], expected)
    xml.dom.minidom.parseString(graph.draw().pipe(format="svg"))  # draw: renders
    result = introspect.diff(model, copy.deepcopy(model), inputs)  # diff: passes at 0.0
    assert result.passed and result.nodes["max_abs_err"].max() == 0.0
    maps = introspect.attention(model, inputs)  # attention: one map per layer (call)
    assert maps.num_layers == len(LAYERS[family]) and maps.num_heads == 4
    assert {e.layer for e in capture(model, inputs).entries} >= set(LAYERS[family])  # capture
    # (tests/family/test_attention_and_capture.py: the maps equal HF's own, captures at 0.0)


def test_the_bert_row_is_true():
    row = _rows()["BERT"]
    assert row["--model"].split(", ") == ["minilm", *RANDOM_SIZES]
    assert row["heads"].split(", ") == list(HEADS)
    loaded = load_model("bert-tiny")
    inputs = tokenize(loaded.tokenizer)
    graph = introspect.trace(loaded.model, inputs)
    assert torch.equal(graph.gm(**inputs.tensors)["last_hidden_state"],
                       loaded.model(**inputs.tensors).last_hidden_state)
    xml.dom.minidom.parseString(graph.draw().pipe(format="svg"))
    assert introspect.diff(loaded.model, copy.deepcopy(loaded.model), inputs).passed
    assert (row["attention"], row["capture"]) == ("yes", "yes")
    assert introspect.attention(loaded.model, inputs).num_layers == 2
    assert capture(loaded.model, inputs).entries


def test_the_deberta_row_is_true():
    row = _rows()["DeBERTa-v2"]
    assert (row["trace"], row["draw"], row["diff"], row["attention"], row["capture"]) == \
        ("refused", "refused", "yes", "refused", "yes")
    inputs = {"input_ids": torch.randint(5, 90, (2, 7)),
              "attention_mask": torch.ones(2, 7, dtype=torch.long)}
    inputs["attention_mask"][1, -2:] = 0
    with pytest.raises(TraceError, match="DeBERTa-v2 cannot be traced"):
        introspect.trace(tiny_deberta(), inputs, cache=False)  # and so not drawn
    with pytest.raises(TraceError, match="DeBERTa-v2 cannot be traced"):
        introspect.attention(tiny_deberta(), inputs)
    # the diff and the capture record what runs: no trace needed
    assert introspect.diff(tiny_deberta(), tiny_deberta(), inputs).passed
    faulty = tiny_deberta()
    with torch.no_grad():
        faulty.encoder.layer[1].intermediate.dense.weight.mul_(1.01)
    failed = introspect.diff(tiny_deberta(), faulty, inputs)
    assert not failed.passed and failed.first_divergence.layer == "encoder.layer.1"
    assert capture(tiny_deberta(), inputs).entries
