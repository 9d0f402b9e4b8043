"""DeBERTa-v2 cannot be traced with torch.fx: refused with one line that says why."""

from __future__ import annotations

import json
import sys

import pytest
import torch

import introspect
from introspect.errors import ModelSourceError, TraceError
from introspect.models.load import load_model
from tests import launch
from tests.fixtures.families import tiny_deberta

REASON = (r"DeBERTa-v2 cannot be traced with torch.fx \(its attention makes a tensor of a "
          r"traced size\)")


def test_tracing_deberta_v2_raises_a_trace_error_naming_the_reason():
    inputs = {"input_ids": torch.randint(5, 90, (2, 7)),
              "attention_mask": torch.ones(2, 7, dtype=torch.long)}
    with pytest.raises(TraceError, match=REASON):
        introspect.trace(tiny_deberta(), inputs, cache=False)


def test_the_reason_is_true_fx_fails_on_it_as_said():
    from introspect.tracing.tracer import MetaTracer

    inputs = {"input_ids": torch.randint(5, 90, (2, 7)),
              "attention_mask": torch.ones(2, 7, dtype=torch.long)}
    with pytest.raises(Exception, match="__cuda_array_interface__"):
        MetaTracer(inputs, fast=False).trace(tiny_deberta())


def test_a_deberta_v2_folder_is_refused_before_loading(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deberta-v2"}))
    with pytest.raises(ModelSourceError, match="holds a deberta-v2 model: " + REASON):
        load_model(tmp_path)


def test_a_deberta_v2_folder_exits_2_with_one_line_through_the_real_cli(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deberta-v2"}))
    done = launch.run([sys.executable, "-m", "introspect", "draw", "--model", str(tmp_path),
                       "-o", str(tmp_path / "out.svg")], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "cannot be traced with torch.fx" in done.stderr
    assert not (tmp_path / "out.svg").exists()
