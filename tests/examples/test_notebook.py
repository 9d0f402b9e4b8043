"""The notebook executes top to bottom on the embedded model, and says what it claims."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.notebooks import cell_text, executed, output_text, stored_with_outputs

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "bert_inner_workings.ipynb"


@pytest.mark.slow
def test_notebook_executes_and_finds_the_broken_layer(tmp_path):
    text = output_text(executed(NOTEBOOK, tmp_path), html=True)
    assert "[CLS] i love cats ! [SEP] [PAD] [PAD]" in text
    assert "(2, 12, 8, 32)" in text  # queries split into 12 heads of 32
    assert "(2, 12, 8, 8)" in text  # attention scores, eager path
    assert "parity holds (max abs error 0;" in text
    assert "first divergence: bert_encoder_layer_3_intermediate_intermediate_act_fn" in text
    assert "tanh approximation of GELU" in text


def test_stored_notebook_has_outputs():
    stored_with_outputs(NOTEBOOK)


def test_notebook_uses_only_the_public_api():
    import re

    import nbformat

    import introspect

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    assert not re.search(r"^\s*(from|import) introspect\.", code, re.M), \
        "the notebook imports an introspect module directly"
    used = set(re.findall(r"\bintrospect\.(\w+)", code))
    assert used <= set(dir(introspect)) - {n for n in dir(introspect) if n.startswith("_")}, \
        used - set(dir(introspect))
    assert "result.draw(" in code


def test_stored_failure_cell_shows_the_failure_first():
    """Section 7's filter shows the failing node, then its drift; no unmatched mask rows."""
    import nbformat

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    cell = next(c for c in notebook.cells
                if c.cell_type == "code" and "nodes = result.nodes" in c.source)
    text = cell_text(cell, html=True)
    rows = [line.split() for line in text.splitlines()
            if line.split() and line.split()[-1] in ("fail", "drift", "unmatched", "ok")]
    assert rows and rows[0][-1] == "fail" and {r[-1] for r in rows[1:]} == {"drift"}
    assert "bert_encoder_layer_3_intermediate_intermediate" in text and "unmatched" not in text
