"""The walkthrough notebook is stored with its outputs, and says what the README says."""

from __future__ import annotations

import pytest

from tests.notebooks import executed, output_text, stored_with_outputs

from .conftest import ROOT

NOTEBOOK = ROOT / "examples" / "generation" / "parity_through_generation.ipynb"


def _claims(text: str) -> None:
    assert "parity holds" in text and "every step and every cached key and value" in text
    assert "first divergent step: 1 (position 6), node add (add in transformer.wpe)" in text
    assert "positions are not advanced with the cache at step 1 (restart at 0)" in text


def test_stored_notebook_has_its_outputs():
    _claims(output_text(stored_with_outputs(NOTEBOOK)))


@pytest.mark.slow
def test_notebook_executes():
    _claims(output_text(executed(NOTEBOOK, NOTEBOOK.parent)))
