"""The verdict comes from the run the user makes (issue 30): every port of the truth corpus
gets its right verdict, through the CLI and through ``introspect.diff``.

The ports (``ports/truth_*.py``, importing only torch, NumPy, transformers and the sibling
``adv_bert``) each come as a correct twin and faulty ones, one mechanism each: PyTorch's
fast path (``nn.TransformerEncoder``), grad mode, a call counter, an output made in NumPy,
inputs changed in place, an unmerged LoRA, ``torch.compile``, ``torch.jit.trace``,
``quantize_dynamic``, two ports from one shared module, and builds that change what the
reference computes (``torch.Tensor.softmax``, a ``torch.library`` kernel, transformers'
attention registry, autocast left on, a transformers module global). Those last run in a
fresh process each: what they change outlives the run.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from introspect.cli.main import main
from tests import launch
from tests.adversarial.corpus import PORTS, port

# (file, builder, extra CLI arguments, the exit status the CLI must give)
IN_PROCESS = [
    ("truth_encoder", "correct", (), 0),
    ("truth_encoder", "faulty", (), 1),  # merged LoRA seen only by the fused fast path
    ("truth_encoder", "faulty_tanh", (), 1),  # tanh GELU the fast path ignores
    ("truth_modes", "correct_grad", (), 0),
    ("truth_modes", "faulty_grad", (), 1),
    ("truth_modes", "correct_counter", (), 0),
    ("truth_modes", "faulty_counter", (), 1),
    ("truth_numpy", "correct", (), 0),
    ("truth_numpy", "faulty", (), 1),
    ("truth_inputs", "correct", (), 0),
    ("truth_inputs", "faulty_mask", (), 1),
    ("truth_inputs", "faulty_ids", (), 1),
    ("truth_lora", "correct", (), 0),
    ("truth_lora", "faulty", (), 1),
    ("truth_compiled", "correct_compiled", (), 0),
    ("truth_compiled", "faulty_compiled", (), 1),
    ("truth_compiled", "correct_traced", (), 0),
    ("truth_compiled", "faulty_traced", (), 1),
    ("truth_compiled", "correct_quantized", ("--atol", "0.1"), 0),
    ("truth_compiled", "faulty_quantized", ("--atol", "0.1"), 1),
]
# Builds that change what the reference computes: exit 2 naming the change, or a FAIL.
GLOBAL_CHANGES = {
    "faulty_tensor_softmax": "Tensor.softmax (patched on the class)",
    "faulty_sdpa_registry": "torch's attention functions (sdpa",
    "faulty_autocast": "torch's autocast (cpu: 'off' -> 'on (torch.bfloat16)')",
    "faulty_hf_global": "modeling_bert.eager_attention_forward (patched in the module)",
    "faulty_gelu_kernel": "the candidate changed what the reference computes",
}
SHARED = [("correct", 0), ("faulty_global", 1), ("faulty_class_attr", 1),
          ("faulty_class_method", 1)]


# torch.compile patches torch.nn.Module for good on first use (dynamo's mutation
# tracking), which would turn the trace cache off for every later test of the process:
# these cases run in a fresh process each.
IN_A_FRESH_PROCESS = ("correct_compiled", "faulty_compiled")


def _cli(folder, spec: str, capsys, *extra: str) -> tuple[int, str]:
    if spec.endswith(IN_A_FRESH_PROCESS):
        done = subprocess.run([sys.executable, "-m", "introspect", "diff", "--model",
                               str(folder), "--candidate", spec, *extra],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        return done.returncode, done.stdout + done.stderr
    code = main(["diff", "--model", str(folder), "--candidate", spec, *extra])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


_API_IN_A_FRESH_PROCESS = """
import sys, torch, introspect
sys.path[:0] = [{root!r}, {ports!r}]
from tests.adversarial.corpus import as_reference, port
loaded = introspect.load_model({folder!r})
reference, inputs = as_reference(loaded), introspect.tokenize(loaded.tokenizer)
kept = {{k: v.clone() for k, v in inputs.tensors.items()}}
result = introspect.diff(reference.model, getattr(port({file!r}), {builder!r})(reference), inputs)
assert all(torch.equal(kept[k], v) for k, v in inputs.tensors.items())
sys.exit(0 if result.passed else 1)
"""


@pytest.mark.parametrize("name, builder, extra, expected", IN_PROCESS,
                         ids=[f"{n}:{b}" for n, b, _, _ in IN_PROCESS])
def test_cli_verdict(name, builder, extra, expected, tiny_folder, capsys):
    code, out = _cli(tiny_folder, f"{PORTS / name}.py:{builder}", capsys, *extra)
    assert code == expected, out


@pytest.mark.parametrize("name, builder, extra, expected", IN_PROCESS,
                         ids=[f"{n}:{b}" for n, b, _, _ in IN_PROCESS])
def test_api_verdict_and_the_callers_inputs(name, builder, extra, expected, tiny,
                                            tiny_folder):
    import torch

    import introspect

    if builder in IN_A_FRESH_PROCESS:
        code = _API_IN_A_FRESH_PROCESS.format(
            root=str(PORTS.parents[2]), ports=str(PORTS), folder=str(tiny_folder),
            file=f"{name}.py", builder=builder)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert done.returncode == expected, done.stderr[-2000:]
        return
    reference, inputs = tiny
    kept = {k: v.clone() for k, v in inputs.tensors.items()}
    candidate = getattr(port(f"{name}.py"), builder)(reference)
    atol = float(extra[1]) if extra else None
    result = introspect.diff(reference.model, candidate, inputs, atol=atol)
    assert result.passed is (expected == 0), result.summary()
    assert all(torch.equal(kept[k], v) for k, v in inputs.tensors.items())  # never handed over
    if expected:
        assert result.first_divergence is not None


def test_notes_say_what_the_truth_runs_saw(tiny):
    import introspect

    reference, inputs = tiny
    said = {}
    for name, builder in (("truth_modes", "faulty_counter"), ("truth_encoder", "faulty"),
                          ("truth_numpy", "faulty"), ("truth_inputs", "faulty_mask")):
        result = introspect.diff(reference.model,
                                 getattr(port(f"{name}.py"), builder)(reference), inputs)
        said[builder if name != "truth_numpy" else "numpy"] = " ".join(result.notes)
    assert "changes from call to call" in said["faulty_counter"]
    assert "depend on the grad mode" in said["faulty"]
    assert "made outside torch" in said["numpy"]
    assert "changed its input(s) attention_mask in place" in said["faulty_mask"]


def test_a_fast_path_fault_is_blamed_on_its_layer(tiny):
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, port("truth_encoder.py").faulty(reference), inputs)
    d = result.first_divergence  # the reference's layer, the candidate's module beside it
    assert d.layer == "encoder.layer.1" and d.module == "encoder.layer.1", d
    assert d.candidate_module == "encoder.layers.1"
    assert "module boundaries" in d.detail
    assert "the candidate's encoder.layers.1" in result.summary()


@pytest.mark.parametrize("builder, expected", SHARED, ids=[b for b, _ in SHARED])
def test_two_ports_from_one_shared_module(builder, expected, tiny_folder, capsys):
    shared = PORTS / "truth_shared.py"
    code, out = _cli(tiny_folder, f"{shared}:{builder}", capsys, "--reference",
                     f"{shared}:reference")
    assert code == expected, out


@pytest.mark.parametrize("builder", ["correct", *GLOBAL_CHANGES])
def test_a_build_that_changes_the_reference_never_passes(builder, tiny_folder):
    """In a fresh process: a patched Tensor method or kernel outlives the run."""
    spec = f"{PORTS / 'truth_globals.py'}:{builder}"
    extra = ["--attn", "eager"] if builder == "faulty_hf_global" else []
    done = launch.run([sys.executable, "-m", "introspect", "diff", "--model",
                       str(tiny_folder), "--candidate", spec, "-q", *extra],
                      capture_output=True, text=True, timeout=300,
                      env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if builder == "correct":
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == 2, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("introspect diff: error: ") and GLOBAL_CHANGES[builder] in last


@pytest.mark.slow
@pytest.mark.parametrize("builder, expected", [("correct_inductor", 0), ("faulty_inductor", 1)])
def test_inductor_compiled_ports(builder, expected, tiny_folder):
    """In a fresh process, as the other compiled ports (IN_A_FRESH_PROCESS)."""
    code = _API_IN_A_FRESH_PROCESS.format(
        root=str(PORTS.parents[2]), ports=str(PORTS), folder=str(tiny_folder),
        file="truth_compiled.py", builder=builder)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == expected, done.stderr[-2000:]


def test_a_numpy_pooler_fault_is_named_in_the_pooler(tiny):
    """The recording cannot see a pooler computed in NumPy: the FAIL named only
    ``outputs``. The reference computes ``pooler_output`` from ``last_hidden_state``
    alone, which agrees: only its pooler lies between (``ops.faithful.output_region``)."""
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, port("truth_numpy.py").faulty(reference), inputs)
    d = result.first_divergence
    assert d.layer == "pooler", d
    assert "only the reference's pooler lies between" in d.detail



def test_a_traced_program_fault_is_named_in_its_layer(tiny):
    """A ``torch.jit.trace`` program: the recording pairs none of its nodes, and the FAIL
    named only ``outputs``. Both models run again in float64 part at layer 1's output,
    where the tanh GELU is (``modules.departure``): that layer is named, with the gaps."""
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, port("truth_compiled.py").faulty_traced(reference),
                             inputs, nodes=False)
    d = result.first_divergence
    assert not result.passed and d.layer == "encoder.layer.1", d
    why = next(h for h in d.hints if h.startswith("run again in float64"))
    assert "agree with the reference's layers before encoder.layer.1" in why
