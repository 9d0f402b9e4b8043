"""Peak memory of a diff against a forward's, each in a fresh process (``memory``).

A forward job loads BERT-base and its from-scratch twin, then runs one plain forward of
each; a diff job loads the same two and runs ``introspect.diff(..., nodes=False)`` (what
``introspect diff`` runs without a report). Both print their peak resident set and what
it grew by once the models were loaded: a measurement, one JSON line per input size.

    python -m benchmarks.diff_peak [--sizes 8x512] [--threads 1] [--fail] [--differing]
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any


def _forwards(mark_loaded: Callable[[], None], size: str) -> bool:
    from benchmarks import cases

    hf, scratch, inputs = _loaded(size)
    mark_loaded()
    cases.forward(hf, inputs)
    cases.forward(scratch, inputs)
    return True


def _diff(mark_loaded: Callable[[], None], size: str, case: str) -> bool:
    from benchmarks import cases

    hf, scratch, inputs = _loaded(size)
    candidate = scratch  # "pass"
    if case == "fail":
        candidate = cases.faulty_twin(scratch)
    elif case == "differing":
        candidate = _differing_twin(scratch)
    mark_loaded()
    return bool(cases.diff_without_recording(hf, candidate, inputs).passed)


def _differing_twin(scratch: Any) -> Any:
    """The twin with every LayerNorm written out by hand: a correct port whose values are
    not the reference's bit for bit, so none is kept as the reference's own."""
    import torch

    class HandNorm(torch.nn.Module):
        def __init__(self, norm: torch.nn.LayerNorm) -> None:
            super().__init__()
            self.weight, self.bias, self.eps = norm.weight, norm.bias, norm.eps

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mean = x.mean(-1, keepdim=True)
            var = ((x - mean) ** 2).mean(-1, keepdim=True)
            return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias

    for module in list(scratch.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.LayerNorm):
                setattr(module, name, HandNorm(child))
    return scratch


def _loaded(size: str) -> tuple[Any, Any, Any]:
    import tempfile

    from benchmarks.workloads import ModelSpec, load_hf, make_inputs, scratch_twin

    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="introspect-peak-")
    hf, _ = load_hf(ModelSpec("bert-base"))
    batch, seq = (int(n) for n in size.split("x"))
    return hf, scratch_twin(hf), make_inputs(batch, seq)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["8x512"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fail", action="store_true", help="also a FAIL (tanh GELU, layer 1)")
    parser.add_argument("--differing", action="store_true",
                        help="also a PASS of a port whose values differ (LayerNorm by hand)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from benchmarks.memory import run_fresh

    for size in args.sizes:
        forward = run_fresh(_forwards, size, threads=args.threads)
        row: dict[str, Any] = {"size": size, "models_loaded_mib": round(forward.loaded_rss_mib),
                               "forwards_peak_mib": round(forward.peak_rss_mib)}
        cases = ["pass"] + ["fail"] * args.fail + ["differing"] * args.differing
        for name in cases:
            diffed = run_fresh(_diff, size, name, threads=args.threads)
            row[f"{name}_peak_mib"] = round(diffed.peak_rss_mib)
            row[f"{name}_peak_over_forwards"] = round(
                diffed.peak_rss_mib / forward.peak_rss_mib, 3)
            row[f"{name}_growth_over_forwards_growth"] = round(
                (diffed.peak_rss_mib - diffed.loaded_rss_mib)
                / max(forward.peak_rss_mib - forward.loaded_rss_mib, 1.0), 3)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
