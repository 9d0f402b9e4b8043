"""What a fresh process runs (see ``memory``): load a model, mark, then one task.

Functions here are sent to the fork server by name, so they live at module level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks import alternatives, cases
from benchmarks.timing import Repetitions
from benchmarks.workloads import ModelSpec, load_hf, make_inputs, scratch_twin

# (task, tool) -> needs the from-scratch twin, and what it runs.
PEAK_TASKS: dict[tuple[str, str], tuple[bool, Callable[..., Any]]] = {
    (cases.FORWARD, "HF"): (False, lambda hf, scratch, x: cases.forward(hf, x)),
    (cases.TRACE_SHAPES, cases.TOOL): (False,
                                       lambda hf, scratch, x: cases.trace_with_shapes(hf, x)),
    (cases.DIFF, cases.TOOL): (True, cases.diff),
    (cases.DIFF, f"{alternatives.HOOKS} (by module name)"): (True, alternatives.compare_with_hooks),
}


def peak_job(mark_loaded: Callable[[], None], spec: ModelSpec, batch: int, seq: int,
             task: str, tool: str) -> None:
    """Load ``spec`` (and its scratch twin when the task compares), then run the task once."""
    needs_scratch, run = PEAK_TASKS[(task, tool)]
    hf, tokenizer = load_hf(spec)
    scratch = scratch_twin(hf) if needs_scratch else None
    inputs = make_inputs(batch, seq, tokenizer)
    mark_loaded()
    run(hf, scratch, inputs)


def torchlens_job(size: str, batch: int, seq: int, warmup: int, runs: int,
                  budget_s: float) -> dict[str, Any]:
    """torchlens's timings, in an interpreter whose torch functions it has not wrapped before."""
    import os

    import torch

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    hf, tokenizer = load_hf(ModelSpec(size))
    inputs = make_inputs(batch, seq, tokenizer)
    return alternatives.torchlens_case(hf, inputs, Repetitions(warmup, runs), budget_s)


def main(argv: list[str]) -> None:
    """``python -m benchmarks.jobs torchlens SIZE BATCH SEQ WARMUP RUNS BUDGET``: print JSON."""
    import json

    if len(argv) != 7 or argv[0] != "torchlens":
        raise SystemExit("usage: python -m benchmarks.jobs torchlens SIZE BATCH SEQ WARMUP RUNS "
                         "BUDGET_S")
    size, *numbers = argv[1:6]
    batch, seq, warmup, runs = (int(n) for n in numbers)
    print(json.dumps(torchlens_job(size, batch, seq, warmup, runs, float(argv[6]))))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
