"""The device split on a real GPU (``cuda`` marker: skipped where torch sees no CUDA device).

The reference is HF bert-tiny in float32 on the CPU, the golden run; the candidate runs on
``cuda``. An independent port (``tests/ports/hf_like.py``, which imports nothing from
introspect) stands for the code people port: correct in bf16, it passes; with a tanh GELU
in layer 1, that layer is blamed, whatever the matmul precision.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import introspect
from introspect.cli.main import main
from introspect.diff.devices import TF32
from tests.ports import hf_like
from tests.ports.batch import port_batch

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def reference(tiny_models):
    return tiny_models("base", "sdpa").model


@pytest.fixture(scope="module")
def batch(tiny_models):
    return port_batch(tiny_models("base", "sdpa").tokenizer)


@pytest.fixture(params=["ieee", "tf32"])
def matmul_precision(request):
    """CUDA float32 matmuls in full float32, then in TF32 (the per-backend API)."""
    before = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = request.param
    yield request.param
    torch.backends.cuda.matmul.fp32_precision = before


def _on_cpu(model: torch.nn.Module) -> bool:
    return all(p.device.type == "cpu" for p in model.parameters())


def test_bf16_port_on_cuda_passes_against_the_fp32_cpu_reference(reference, batch):
    port = hf_like.build(reference).to(torch.bfloat16)
    result = introspect.diff(reference, port, batch, candidate_device="cuda", noise_budget=True)
    assert result.passed, (result.first_divergence, result.notes)
    assert result.max_abs_err > 0  # bf16 really ran: not a copy of the reference
    assert any("the candidate on cuda:0" in n for n in result.notes)
    assert _on_cpu(port) and _on_cpu(reference)  # put back where they were


def test_bf16_hf_copy_on_cuda_passes_through_the_sdpa_fast_path(reference, batch):
    """HF's sdpa in bf16 on CUDA takes the flash or memory-efficient kernel, its own path
    with its own noise: measured on the candidate's device, it passes."""
    candidate = copy.deepcopy(reference).to(torch.bfloat16)
    result = introspect.diff(reference, candidate, batch, candidate_device="cuda",
                             noise_budget=True)
    assert result.passed, (result.first_divergence, result.notes)
    assert any("scaled_dot_product_attention picks one of its kernels" in n
               for n in result.notes)


def test_fp32_port_on_cuda_passes_with_the_budget_of_its_precision(reference, batch,
                                                                   matmul_precision):
    result = introspect.diff(reference, hf_like.build(reference), batch, candidate_device="cuda")
    assert result.passed, (matmul_precision, result.first_divergence, result.max_abs_err)
    budget_note = next(n for n in result.notes if "CUDA float32 matmuls ran" in n)
    assert (TF32 in budget_note) == (matmul_precision == "tf32")


def test_tanh_gelu_is_blamed_in_its_layer_on_cuda(reference, batch, matmul_precision):
    port = hf_like.build(reference, fault="gelu_tanh", layer=1)
    result = introspect.diff(reference, port, batch, candidate_device="cuda")
    assert not result.passed
    assert result.first_divergence.layer == "encoder.layer.1", result.first_divergence


def test_both_sides_on_cuda_compare_there(reference, batch):
    port = hf_like.build(reference)
    result = introspect.diff(reference, port, batch, device="cuda")
    assert result.passed, result.first_divergence
    assert any("values were compared on cuda:0" in n for n in result.notes)
    assert _on_cpu(reference) and _on_cpu(port)


def test_cli_bf16_candidate_on_cuda(capsys):
    argv = ["diff", "--model", "bert-tiny", "--candidate", "hf", "--candidate-dtype", "bfloat16",
            "--candidate-device", "cuda", "--noise-budget", "--nodes"]
    assert main(argv) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "parity holds" in out and "cuda:0" in out


def test_cli_port_with_a_fault_on_cuda_exits_1(tmp_path, capsys):
    root = str(Path(__file__).parents[2])
    port = tmp_path / "gelu_port.py"
    port.write_text(f"import sys\nsys.path.insert(0, {root!r})\nfrom tests.ports import hf_like\n\n"
                    "def build(reference):\n"
                    "    return hf_like.build(reference.model, fault='gelu_tanh', layer=1)\n")
    argv = ["diff", "--model", "bert-tiny", "--candidate", f"{port}:build",
            "--candidate-device", "cuda", "-q"]
    assert main(argv) == 1
    assert "encoder.layer.1" in capsys.readouterr().out
