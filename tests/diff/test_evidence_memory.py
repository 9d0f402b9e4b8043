"""What module evidence's runs keep in memory: nothing for a backward they never make
(``run.truth.keeping_nothing``), and the allocator's free memory given back as it grows
(``run.heap``). Small models of plain torch, written here."""

from __future__ import annotations

import pytest
import torch

from introspect.run import heap
from introspect.run.truth import keeping_nothing


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x)) * x


class _GradInside(_Net):
    """A forward that differentiates inside itself: it reads what autograd saved."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.detach().requires_grad_(True)
        y = torch.tanh(self.lin(x))
        (g,) = torch.autograd.grad(y.sum(), x, create_graph=False)
        return y + g


def test_a_run_with_autograd_on_keeps_nothing_for_a_backward_and_computes_the_same():
    model, x = _Net(), torch.randn(3, 6)
    plain = model(x)
    kept = keeping_nothing(lambda: model(x))
    assert torch.equal(kept, plain) and kept.grad_fn is not None
    with pytest.raises(RuntimeError, match="not kept"):
        kept.sum().backward()


def test_a_forward_reading_what_it_saved_runs_again_with_it_kept():
    model, x = _GradInside(), torch.randn(3, 6)
    assert torch.equal(keeping_nothing(lambda: model(x)), model(x))


def test_under_no_grad_the_run_is_plain():
    model, x = _Net(), torch.randn(3, 6)
    with torch.no_grad():
        assert torch.equal(keeping_nothing(lambda: model(x)), model(x))


def test_the_heap_is_trimmed_only_once_the_resident_set_has_grown(monkeypatch):
    sizes = iter([100, 100 + heap.TRIM_GROWTH - 1, 100 + heap.TRIM_GROWTH, 150,
                  150 + heap.TRIM_GROWTH // 2])
    monkeypatch.setattr(heap, "resident_bytes", lambda: next(sizes))
    trims = []
    monkeypatch.setattr(heap, "_malloc_trim", lambda: trims.append)
    trimmer = heap.Trimmer()  # 100
    trimmer.maybe_trim()  # grown by less: no trim
    assert trims == []
    trimmer.maybe_trim()  # grown by TRIM_GROWTH: trimmed, and 150 after it
    assert trims == [0] and trimmer.after_last == 150
    trimmer.maybe_trim()  # grown by half of it since: no trim
    assert trims == [0]


def test_without_a_resident_size_to_read_nothing_is_trimmed(monkeypatch):
    monkeypatch.setattr(heap, "resident_bytes", lambda: None)
    monkeypatch.setattr(heap, "_malloc_trim", lambda: pytest.fail("trimmed"))
    heap.Trimmer().maybe_trim()


def test_the_resident_size_is_read_on_linux():
    size = heap.resident_bytes()
    assert size is None or size > 1 << 20

