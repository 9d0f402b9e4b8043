"""trace, diff, attention and capture from several threads at once give what they give in turn.

fx patches ``nn.Module.__call__`` for the whole process while it traces, so a graph run or
a forward in another thread would go through the tracer; every public entry point holds
``tracer.TRACE_LOCK`` for its whole run.
"""

from __future__ import annotations

import threading

import pytest
import torch

import introspect
from introspect.dump import capture
from introspect.tracing.tracer import TRACE_LOCK


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """LayerNorms and biases off their initial values, so that a wrong value would show."""
    import copy

    changed = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in changed.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return changed


@pytest.fixture(scope="module")
def jobs(tiny_models):
    loaded = tiny_models("base")
    model = _perturbed(loaded.model)
    candidate = _perturbed(loaded.model)
    with torch.no_grad():
        candidate.encoder.layer[1].output.LayerNorm.weight.mul_(1.01)  # a fault to find
    inputs = introspect.tokenize(loaded.tokenizer)

    def trace():
        graph = introspect.trace(model, inputs)
        return [(r.name, r.op, r.shape) for r in graph.records]

    def diff():
        result = introspect.diff(model, candidate, inputs)
        return result.passed, [(r.reference_node, r.status, r.max_abs_err)
                               for r in result.rows]

    def attention():
        return introspect.attention(model, inputs).probs

    def captured():
        taken = capture(model, inputs)
        return {k: v for k, v in taken.values.items()}

    return {"trace": trace, "diff": diff, "attention": attention, "capture": captured}


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


@pytest.mark.slow
def test_four_entry_points_in_four_threads_give_the_sequential_results(jobs):
    expected = {name: job() for name, job in jobs.items()}
    assert expected["diff"][0] is False  # the fault is found, in turn
    results: dict[str, list[object]] = {name: [] for name in jobs}
    errors: list[BaseException] = []
    start = threading.Barrier(len(jobs))

    def run(name: str) -> None:
        start.wait()
        try:
            for _ in range(2):
                results[name].append(jobs[name]())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(name,)) for name in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert errors == []
    for name, values in results.items():
        assert len(values) == 2 and all(_same(expected[name], v) for v in values), name


def test_a_forward_in_another_thread_waits_while_a_trace_holds_the_lock(jobs):
    """The lock is what keeps fx's patches away: held here, a trace in a thread waits."""
    finished = threading.Event()
    thread = threading.Thread(target=lambda: (jobs["trace"](), finished.set()))
    with TRACE_LOCK:
        thread.start()
        assert not finished.wait(1.0)
    thread.join(120)
    assert finished.is_set()
