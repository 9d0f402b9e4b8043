"""--device / --candidate-device on the CPU, which every machine has (issue 32).

What needs a GPU is in ``test_devices_cuda.py`` (marked ``cuda``). Here: the split runs end
to end with ``cpu`` standing in for the device, through the API and the CLI, for the
from-scratch and an independent port; a device this machine lacks is one line and exit 2;
models are moved undoably (checked on the ``meta`` device, which every torch has); the TF32
budget is calibrated on the CPU by rounding a port's matmul inputs as TF32 does.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import introspect
import introspect.scratch as scratch
from introspect.cli.main import main
from introspect.diff import devices
from introspect.diff.devices import TF32, Placement, parse_device, place, tf32_matmuls
from introspect.errors import InputError
from tests.ports import hf_like
from tests.ports.batch import port_batch

NO_CUDA = not torch.cuda.is_available()


@pytest.fixture(scope="module")
def reference(tiny_models):
    return tiny_models("base", "sdpa").model


@pytest.fixture(scope="module")
def batch(tiny_models):
    return port_batch(tiny_models("base", "sdpa").tokenizer)


# -- the API --------------------------------------------------------------------------


@pytest.mark.parametrize("where", [{"candidate_device": "cpu"},
                                   {"device": "cpu", "candidate_device": "cpu"}])
def test_split_on_cpu_gives_the_verdict_of_no_split(reference, batch, where):
    port = hf_like.build(reference)
    plain = introspect.diff(reference, port, batch)
    placed = introspect.diff(reference, port, batch, **where)
    assert placed.passed and plain.passed
    assert placed.max_abs_err == plain.max_abs_err
    assert len(placed.rows) == len(plain.rows)


def test_a_fault_is_blamed_in_its_layer_with_the_candidate_placed(reference, batch):
    port = hf_like.build(reference, fault="gelu_tanh", layer=1)
    result = introspect.diff(reference, port, batch, candidate_device="cpu")
    assert not result.passed
    assert result.first_divergence.layer == "encoder.layer.1"
    assert any("tanh approximation of GELU" in h for h in result.first_divergence.hints)


def test_bf16_scratch_port_on_the_cpu_device_passes_with_the_noise_budget(reference, batch):
    port = scratch.BertModel.from_hf(reference).to(torch.bfloat16)
    result = introspect.diff(reference, port, batch, candidate_device="cpu", noise_budget=True)
    assert result.passed, result.first_divergence
    assert result.max_abs_err > 1e-3  # it really ran in bf16


@pytest.mark.parametrize("value, message", [
    ("gpu", "candidate_device= 'gpu': not a device torch knows"),
    ("cuda:x", "not a device torch knows"),
    ("meta", "the meta device holds none"),
    pytest.param("cuda", "no CUDA device is available here",
                 marks=pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")),
    pytest.param("cuda:7", "no CUDA device is available here",
                 marks=pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")),
])
def test_a_bad_device_is_an_input_error_before_anything_moves(reference, value, message):
    port = hf_like.build(reference)
    before = [p.data_ptr() for p in port.parameters()]
    with pytest.raises(InputError, match=message):
        introspect.diff(reference, port, {"input_ids": torch.tensor([[101, 102]])},
                        candidate_device=value)
    assert [p.data_ptr() for p in port.parameters()] == before


def test_the_reference_itself_cannot_be_split_across_two_devices(reference, monkeypatch):
    # a second device (meta stands in for a GPU) for the candidate alone
    monkeypatch.setattr(devices, "parse_device",
                        lambda value, option: torch.device("meta") if value else None)
    with pytest.raises(InputError, match="pass a copy"):
        place(reference, reference, None, "gpu")
    assert all(p.device.type == "cpu" for p in reference.parameters())


def test_generation_with_devices_is_refused_in_one_line(reference, batch):
    with pytest.raises(InputError, match="do not mix with generate"):
        introspect.diff(reference, copy.deepcopy(reference), batch, generate=2,
                        candidate_device="cpu")


# -- moving and putting back ----------------------------------------------------------


class _Tied(torch.nn.Module):
    def __init__(self, shared: torch.nn.Parameter) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied, as a language-model head is
        self.borrowed = shared  # a parameter the reference owns
        self.register_buffer("scale", torch.ones(4))


def test_moving_is_undone_exactly_and_shared_weights_are_copied_not_moved():
    owner = torch.nn.Linear(4, 4)
    model = _Tied(owner.weight)
    params = {name: (p, p.detach()) for name, p in model.named_parameters(remove_duplicate=False)}
    buffer = model.scale
    placement = Placement(torch.device("cpu"), torch.device("meta"))
    devices._move(model, torch.device("meta"), placement, shared={id(owner.weight)})

    assert model.embed.weight.device.type == "meta"
    assert model.head.weight is model.embed.weight  # still tied
    assert model.borrowed.device.type == "meta" and model.borrowed is not owner.weight
    assert owner.weight.device.type == "cpu"  # the reference's own parameter never moved
    assert model.scale.device.type == "meta"
    assert any("shares 1 parameter(s)" in n for n in placement.notes)

    placement.restore()
    for name, p in model.named_parameters(remove_duplicate=False):
        assert p is params[name][0] and p.data_ptr() == params[name][1].data_ptr(), name
    assert model.borrowed is owner.weight and model.scale is buffer


# -- budgets that know the device ------------------------------------------------------


@pytest.fixture
def precision_api():
    """Leave both precision APIs as they were found."""
    matmul, whole = torch.backends.cuda.matmul.fp32_precision, torch.backends.fp32_precision
    yield
    torch.backends.cuda.matmul.fp32_precision = matmul
    torch.backends.fp32_precision = whole


def test_tf32_is_read_from_the_new_api_where_the_legacy_getter_raises(precision_api):
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    with pytest.raises(RuntimeError):  # torch itself refuses the legacy question now
        torch.get_float32_matmul_precision()
    assert tf32_matmuls() == (True, "torch.backends.cuda.matmul.fp32_precision is 'tf32'")
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    assert tf32_matmuls()[0] is False


def test_tf32_budget_goes_to_matmul_nodes_only(reference, batch):
    result = introspect.diff(reference, hf_like.build(reference), batch)
    tolerance = result.tolerance
    float32 = tolerance.budget("float32")
    budgets = [tolerance.budget("int64") if r.dtype.startswith("int") else float32
               for r in result.rows if r.reference_node and r.candidate_node]
    pairs = result.alignment.pairs
    placed = devices.device_budgets(budgets, pairs, result.reference, result.candidate,
                                    tolerance, [TF32], noise=False)
    ops = {r.name: r.op_type for r in result.reference.records}
    by_op = {}
    for pair, budget in zip(pairs, placed, strict=True):
        by_op.setdefault(ops[pair.reference], set()).add(budget)
    assert by_op["Linear"] == {tolerance.budget(TF32)}
    assert by_op["scaled_dot_product_attention"] == {tolerance.budget(TF32)}
    assert tolerance.budget(TF32) not in by_op["LayerNorm"] | by_op["GELUActivation"]
    assert devices.device_budgets(budgets, pairs, result.reference, result.candidate,
                                  tolerance, [TF32], noise=True) == budgets


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded to TF32's 10-bit mantissa, as tensor cores read float32 inputs."""
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


class _TF32Linears(torch.overrides.TorchFunctionMode):
    """The candidate's ``F.linear`` as tensor cores run it under TF32: both operands rounded,
    the products summed in float32. Only calls that read the candidate's own weights are
    rounded, in its run, its replay and its local values alike; the reference's are not."""

    def __init__(self, candidate: torch.nn.Module) -> None:
        super().__init__()
        self.weights = {p.data_ptr() for p in candidate.parameters()}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and args[1].data_ptr() in self.weights:
            x, w, *rest = args
            return func(_tf32(x), _tf32(w), *rest, **kwargs)
        return func(*args, **kwargs)


@pytest.mark.parametrize("fault", [None, "gelu_tanh"])
def test_tf32_budget_passes_tf32_rounding_and_still_blames_a_tanh_gelu(
        reference, batch, monkeypatch, fault):
    """The calibration, on the CPU: a port whose Linears round as TF32 does fails
    float32's budget, passes TF32's; a tanh GELU still fails, in its layer."""
    port = hf_like.build(reference, fault=fault, layer=1)
    with _TF32Linears(port):
        if fault is None:  # float32's budget sees TF32's rounding as a fault
            assert not introspect.diff(reference, port, batch).passed
        monkeypatch.setattr(devices, "rounding_dtypes", lambda placement, *models: [TF32])
        result = introspect.diff(reference, port, batch)
    if fault is None:
        assert result.passed, result.first_divergence
        assert result.max_abs_err > 1e-4  # the rounding really was there
    else:
        assert not result.passed
        assert result.first_divergence.layer == "encoder.layer.1"


# -- the CLI ------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["--candidate-device", "cpu"],
    ["--device", "cpu"],
    ["--candidate", "tests/ports/pytorchic_bert.py:build", "--candidate-device", "cpu"],
    ["--candidate", "hf", "--candidate-dtype", "bfloat16", "--noise-budget",
     "--candidate-device", "cpu"],
])
def test_cli_split_on_cpu_passes(argv, capsys):
    assert main(["diff", "--model", "bert-tiny", "-q", *argv]) == 0
    assert "parity holds" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--candidate-device", "tpu9"], "--candidate-device 'tpu9': not a device torch knows"),
    (["--device", "meta"], "--device meta: a diff needs values"),
    pytest.param(["--device", "cuda"], "--device cuda: no CUDA device is available here",
                 marks=pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")),
    (["--candidate-device", "cpu", "--candidate-dump", "x.safetensors"],
     "activation dumps hold values already computed"),
    (["--candidate-device", "cpu", "--generate", "2"], "do not mix with generate"),
])
def test_cli_bad_device_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["diff", "--model", "bert-tiny", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_parse_device_names_cuda_by_index():
    assert parse_device(None, "--device") is None
    assert parse_device("cpu", "--device") == torch.device("cpu")
