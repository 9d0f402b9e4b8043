"""Dumps written by Keras 3 on JAX: MiniLM as Keras layers (examples/keras_jax).

Keras' own kernels (JAX's XLA on CPU) compute every value; the port loads the checkpoint
by an explicit key map and imports nothing from introspect. The correct port must PASS
with the default budgets; the two bugs Keras' defaults invite (LayerNormalization's
epsilon of 1e-3, the approximate GELU) must FAIL in their layer. Skipped without keras
and jax (``pip install .[keras]``, ~430 MB).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
pytest.importorskip("jax")
keras = pytest.importorskip("keras")

from introspect.dump import diff_dump, read_capture, read_dump  # noqa: E402

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "keras_jax" / "bert_keras.py"
EXPECTED = {None: None, "layernorm-eps": ("encoder.layer.2", "block2.out_norm"),
            "gelu-tanh": ("encoder.layer.3", "block3.gelu")}


@pytest.fixture(scope="module")
def recipe():
    if keras.backend.backend() != "jax":
        pytest.skip(f"keras was imported with the {keras.backend.backend()} backend")
    spec = importlib.util.spec_from_file_location("bert_keras_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fault", [None, *(pytest.param(f, marks=pytest.mark.slow)
                                           for f in EXPECTED if f)])
def test_the_keras_port_passes_and_its_faults_fail_in_their_layer(fault, recipe,
                                                                   minilm_capture_file,
                                                                   tmp_path):
    from safetensors.numpy import load_file

    captured = load_file(str(minilm_capture_file))
    ids, segments, mask = (captured[f"input.{n}"] for n in
                           ("input_ids", "token_type_ids", "attention_mask"))
    port = recipe.KerasBert(recipe.minilm_folder(), fault)
    port.forward(ids, segments, mask)
    out = tmp_path / "keras.npz"
    np.savez(out, input_ids=ids, **port.dump)
    result = diff_dump(read_capture(minilm_capture_file), read_dump(out))
    if fault is None:
        assert result.passed, result.summary()
        return
    assert not result.passed, result.summary()
    layer, tensor = EXPECTED[fault]
    assert (result.first_divergence.layer, result.first_divergence.candidate_node) == (
        layer, tensor), result.summary()
