"""Dumps written by a real runtime: MiniLM exported by torch.onnx and run by ONNX Runtime.

Nobody here wrote the kernels: ORT computes HF's graph its own way, at each of its
optimization levels (and after its transformer optimizer, which fuses attention, GELU,
SkipLayerNorm), in float32 and float16. The dumps come from the recipe in
examples/onnx_runtime (which imports nothing from introspect). A correct graph must PASS
with the default budgets; a classic porting bug, injected into the exported graph or its
weights, must FAIL in its layer, with the right hint or none when the live reference is
given. These tests state the verdict a user expects, whatever today's engine says.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tests.bounds import above, assert_close

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from introspect.dump import diff_dump, read_capture, read_dump  # noqa: E402

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "onnx_runtime" / "bert_onnx.py"
pytestmark = pytest.mark.xdist_group("onnx_export")  # one worker exports MiniLM once

# name -> (expose, ORT level, transformer optimizer, fp16)
CONFIGS = {
    "every-disabled": ("every", "disabled", False, False),
    "every-basic": ("every", "basic", False, False),
    "every-extended": ("every", "extended", False, False),
    "every-all": ("every", "all", False, False),
    "shipped-basic": ("shipped", "basic", False, False),
    "shipped-extended": ("shipped", "extended", False, False),
    "shipped-all": ("shipped", "all", False, False),
    "transformer-all": ("shipped", "all", True, False),
    "fp16-disabled": ("shipped", "disabled", False, True),
    "fp16-all": ("shipped", "all", False, True),
    "fp16-transformer": ("shipped", "all", True, True),
}
FAST = {"every-disabled", "transformer-all", "fp16-transformer"}

# fault -> (the layer it must fail in, words the right hint holds)
FAULTS = {
    "layernorm-eps": ("encoder.layer.2", "LayerNorm eps"),
    "gelu-tanh": ("encoder.layer.3", "tanh approximation of GELU"),
    "transposed-weight": ("encoder.layer.1", "transposed"),
    "mask-ignored": ("encoder.layer.0", "does not apply the attention mask"),
    "position-offset": ("embeddings", "position ids are offset by +1"),
}


def _recipe():
    spec = importlib.util.spec_from_file_location("bert_onnx_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def recipe():
    return _recipe()


@pytest.fixture(scope="module")
def exported(tmp_path_factory, minilm_capture_file, recipe):
    """MiniLM exported once (fp32), and the capture's token ids it is fed."""
    from safetensors.numpy import load_file

    captured = load_file(str(minilm_capture_file))
    inputs = {n: captured[f"input.{n}"] for n in recipe.INPUT_NAMES}
    path = tmp_path_factory.mktemp("onnx") / "bert.onnx"
    recipe.export(recipe.load_bert(recipe.minilm_folder()), inputs, path)
    return path, inputs


@pytest.fixture(scope="module")
def reference(minilm_capture_file):
    return read_capture(minilm_capture_file)


def ort_dump(recipe, model: Path, inputs, config: str, work: Path, *,
             keep_integers: bool = False) -> Path:
    """Run ``model`` as ``config`` says and write the dump the recipe writes."""
    expose, level, transformer, fp16 = CONFIGS[config]
    work.mkdir(parents=True, exist_ok=True)
    if expose == "shipped":
        model = recipe.shipped_graph(model, level, work, transformer_optimizer=transformer,
                                     fp16=fp16)
        level = "disabled"
    values = recipe.run(model, inputs, level, keep_integers=keep_integers)
    out = work / f"{config}.npz"
    recipe.write_npz(out, inputs, values)
    return out


# ---------------------------------------------------------------------------------------
# Faults, written into the exported graph or its weights


def _node(proto, op: str, where: str):
    return next(n for n in proto.graph.node if n.op_type == op and where in n.name)


def _set_initializer(proto, name: str, value: np.ndarray) -> None:
    from onnx import numpy_helper

    for i, tensor in enumerate(proto.graph.initializer):
        if tensor.name == name:
            proto.graph.initializer[i].CopyFrom(numpy_helper.from_array(value, name))
            return
    raise KeyError(name)


def _initializer(proto, name: str) -> np.ndarray:
    from onnx import numpy_helper

    return next(numpy_helper.to_array(t) for t in proto.graph.initializer if t.name == name)


def layernorm_eps(proto) -> None:
    """Layer 2's output LayerNorm with Keras' default eps, 1e-3, for BERT's 1e-12."""
    node = _node(proto, "LayerNormalization", "/encoder/layer.2/output/LayerNorm")
    for attribute in node.attribute:
        if attribute.name == "epsilon":
            attribute.f = 1e-3
            return
    node.attribute.append(onnx.helper.make_attribute("epsilon", 1e-3))


def gelu_tanh(proto) -> None:
    """Layer 3's erf(u), u = x/√2, replaced by tanh(√(2/π)(x + 0.044715 x³)) in u."""
    from onnx import helper, numpy_helper

    erf = _node(proto, "Erf", "/encoder/layer.3/intermediate")
    u, out = erf.input[0], erf.output[0]
    a = np.float32(2 / np.sqrt(np.pi))  # √(2/π)·√2
    b = np.float32(0.044715 * 4 / np.sqrt(np.pi))  # √(2/π)·0.044715·2√2
    proto.graph.initializer.extend([numpy_helper.from_array(np.array(a), "fault.a"),
                                    numpy_helper.from_array(np.array(b), "fault.b")])
    nodes = [helper.make_node("Mul", [u, u], ["fault.u2"]),
             helper.make_node("Mul", ["fault.u2", u], ["fault.u3"]),
             helper.make_node("Mul", [u, "fault.a"], ["fault.au"]),
             helper.make_node("Mul", ["fault.u3", "fault.b"], ["fault.bu3"]),
             helper.make_node("Add", ["fault.au", "fault.bu3"], ["fault.t"]),
             helper.make_node("Tanh", ["fault.t"], [out])]
    index = list(proto.graph.node).index(erf)
    proto.graph.node.remove(erf)
    for offset, node in enumerate(nodes):
        proto.graph.node.insert(index + offset, node)


def transposed_weight(proto) -> None:
    """Layer 1's attention output projection (square) multiplies by its weight untransposed."""
    name = _node(proto, "MatMul", "/encoder/layer.1/attention/output/dense").input[1]
    _set_initializer(proto, name, np.ascontiguousarray(_initializer(proto, name).T))


def mask_ignored(proto) -> None:
    """Every consumer of attention_mask reads ones instead: padding is attended to."""
    from onnx import TensorProto, helper

    for node in proto.graph.node:
        for i, name in enumerate(node.input):
            if name == "attention_mask":
                node.input[i] = "fault.ones"
    ones = helper.make_tensor("value", TensorProto.INT64, [1], [1])
    proto.graph.node.insert(0, helper.make_node("ConstantOfShape", ["fault.shape"],
                                                ["fault.ones"], value=ones))
    proto.graph.node.insert(0, helper.make_node("Shape", ["input_ids"], ["fault.shape"]))


def position_offset(proto) -> None:
    """The position table shifted by one row: token i gets position i + 1."""
    name = "bert.embeddings.position_embeddings.weight"
    table = _initializer(proto, name)
    _set_initializer(proto, name, np.concatenate([table[1:], table[-1:]]))


INJECT = {"layernorm-eps": layernorm_eps, "gelu-tanh": gelu_tanh,
          "transposed-weight": transposed_weight, "mask-ignored": mask_ignored,
          "position-offset": position_offset}


@pytest.fixture(scope="module")
def faulty(exported, tmp_path_factory):
    """fault -> the exported graph with that fault written in (made on first use)."""
    made: dict[str, Path] = {}

    def get(fault: str) -> Path:
        if fault not in made:
            proto = onnx.load(str(exported[0]))
            INJECT[fault](proto)
            path = tmp_path_factory.mktemp(fault) / f"{fault}.onnx"
            onnx.save(proto, str(path))
            made[fault] = path
        return made[fault]

    return get


def _params(names, fast):
    return [n if n in fast else pytest.param(n, marks=pytest.mark.slow) for n in names]


# ---------------------------------------------------------------------------------------
# Correct graphs pass


@pytest.mark.parametrize("config", _params(CONFIGS, FAST))
def test_a_correct_ort_run_passes_with_the_default_budgets(config, recipe, exported,
                                                           reference, tmp_path):
    model, inputs = exported
    result = diff_dump(reference, read_dump(ort_dump(recipe, model, inputs, config, tmp_path)))
    assert result.passed, result.summary()


@pytest.mark.slow
def test_integer_and_bool_intermediates_do_not_break_a_correct_dump(recipe, exported,
                                                                    reference, tmp_path):
    """Shape outputs, a 0-d sequence length, the mask's arithmetic: kept, never refused."""
    model, inputs = exported
    dump = read_dump(ort_dump(recipe, model, inputs, "every-all", tmp_path, keep_integers=True))
    result = diff_dump(reference, dump)
    assert result.passed, result.summary()


def test_the_recipe_dumps_in_the_graphs_order_and_the_shipped_graph_is_fused(
        recipe, exported, tmp_path):
    """`every` keeps the export's tensors, in order; the shipped graphs hold fused nodes."""
    from collections import Counter

    model, inputs = exported
    every = np.load(ort_dump(recipe, model, inputs, "every-disabled", tmp_path / "a"))
    assert every.files[:3] == list(recipe.INPUT_NAMES)
    first = {n: i for i, n in enumerate(every.files)}
    assert first["/bert/embeddings/Add_output_0"] < first[
        "/bert/encoder/layer.0/attention/self/query/MatMul_output_0"] < first[
        "/bert/encoder/layer.5/output/Add_output_0"]
    plain = recipe.shipped_graph(model, "all", tmp_path)
    fused = recipe.shipped_graph(model, "all", tmp_path, transformer_optimizer=True)
    assert "FusedMatMul" in {n.op_type for n in onnx.load(str(plain)).graph.node}
    ops = Counter(n.op_type for n in onnx.load(str(fused)).graph.node)
    assert (ops["Attention"], ops["SkipLayerNormalization"], ops["EmbedLayerNormalization"]) \
        == (6, 12, 1), ops


# ---------------------------------------------------------------------------------------
# Faults fail in their layer


# Every fault in the unfused and the fused fp32 graphs; in fp16 only those whose effect is
# far above half precision's rounding (an eps of 1e-3 or the tanh GELU moves values by ~1e-3
# of their size, which is what fp16 rounds away by itself).
FAST_FAULTS = {*((fault, "every-disabled") for fault in FAULTS),
               ("transposed-weight", "transformer-all")}
FAULT_CASES = [
    *(pytest.param(fault, config, marks=() if (fault, config) in FAST_FAULTS else pytest.mark.slow)
      for config in ("every-disabled", "transformer-all") for fault in FAULTS),
    *(pytest.param(fault, "fp16-transformer", marks=pytest.mark.slow)
      for fault in ("transposed-weight", "mask-ignored", "position-offset")),
]


@pytest.mark.parametrize(("fault", "config"), FAULT_CASES)
def test_a_fault_fails_in_its_layer(fault, config, recipe, faulty, exported, reference,
                                    tmp_path):
    inputs = exported[1]
    dump = read_dump(ort_dump(recipe, faulty(fault), inputs, config, tmp_path))
    result = diff_dump(reference, dump)
    assert not result.passed, result.summary()
    layer, _ = FAULTS[fault]
    assert result.first_divergence.layer == layer, result.summary()


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS)
def test_a_fault_gets_the_right_hint_or_none_from_the_live_reference(fault, recipe, faulty,
                                                                     exported, reference,
                                                                     minilm, tmp_path):
    inputs = exported[1]
    dump = read_dump(ort_dump(recipe, faulty(fault), inputs, "every-disabled", tmp_path))
    result = diff_dump(reference, dump, reference_model=minilm.model)
    assert not result.passed
    layer, words = FAULTS[fault]
    divergence = result.first_divergence
    assert divergence.layer == layer, result.summary()
    wrong = [h for h in divergence.hints if words not in h]
    assert not wrong, f"wrong hint(s) for {fault}: {wrong}"


def test_the_gelu_fault_is_a_real_tanh_gelu(recipe, faulty, exported, tmp_path):
    """The injected graph computes exactly the tanh GELU (the fault is what it says)."""
    import torch

    inputs = exported[1]
    values = recipe.run(faulty("gelu-tanh"), inputs, "disabled")
    where = "/bert/encoder/layer.3/intermediate/"
    x = torch.from_numpy(values[where + "dense/Add_output_0"])
    y = torch.from_numpy(values[where + "intermediate_act_fn/Mul_1_output_0"])
    assert_close(y, torch.nn.functional.gelu(x, approximate="tanh"), atol=2e-6, rtol=1e-5,
                 what="tanh GELU")
    assert above((y - torch.nn.functional.gelu(x)).abs().max(), 1e-4, "not erf GELU")
