"""The diff's two other modes at three sizes each, as ratios of the models' own work.

- **generation**: ``introspect.diff(hf, port, prompt, generate=N)`` on GPT-2 124M (random
  init, published size) against the hand-written port of
  ``examples/generation/gpt2_cached.py``, for N = 16, 64 and 256 steps, over the two
  models' own greedy generation of N tokens through their own caches;
- **backward**: ``introspect.diff(hf, scratch, inputs, backward=True)`` at 8 x 128 on
  BERT-tiny, -base and -large, over the two models' own forward + backward on the diff's
  default loss.

Each ratio is paired: both sides run in this process, one after the other, on one
thread (``torch.set_num_threads(1)`` for both), in CPU time, which a shared machine
moves far less than wall time. A ratio that stays flat or falls as the size grows is
the goal (issue 31: at most 2x for 16 steps, 64 steps at most 1.1x 16's cost per step;
backward at most 1.5x at BERT-base).

    python -m benchmarks.modes [--steps 16 64] [--models bert-tiny bert-base]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from benchmarks.records import OK, Measurement

MODES = "modes"  # the report's section
GENERATE = "diff --generate N, GPT-2 124M"
BACKWARD = "diff --backward"
STEPS = (16, 64, 256)
BACKWARD_MODELS = ("bert-tiny", "bert-base", "bert-large")
BATCH, SEQ = 8, 128

Progress = Callable[[str], None]


def cpu_seconds(work: Callable[[], Any]) -> tuple[float, Any]:
    """CPU seconds of one call of ``work`` in this process, and what it returned."""
    start = time.process_time()
    result = work()
    return time.process_time() - start, result


def generation_rows(steps: Sequence[int] = STEPS, progress: Progress = print) -> list[Measurement]:
    """One row per number of steps: the diff over the two models' own generation."""
    import introspect
    from benchmarks.generate_bench import PROMPT, _hf_generate, _port_module
    from introspect.models.load import load_model

    torch.manual_seed(0)
    hf = load_model("gpt2", head="causal-lm").model.eval()
    port_module = _port_module()
    port = port_module.build(hf)
    ids = torch.tensor([PROMPT])
    _hf_generate(hf, ids, 2)  # warm both paths once
    port_module.generate(port, ids, 2)
    introspect.diff(hf, port, {"input_ids": ids}, generate=2)
    rows = []
    for n in steps:
        progress(f"modes: diff --generate {n}")
        own, _ = cpu_seconds(lambda: (_hf_generate(hf, ids, n), port_module.generate(port, ids, n)))  # noqa: B023
        diffed, result = cpu_seconds(
            lambda: introspect.diff(hf, port, {"input_ids": ids}, generate=n))  # noqa: B023
        rows.append(Measurement(
            section=MODES, model="gpt2", batch=1, seq=n, task=GENERATE, tool="introspect",
            status=OK, seconds=diffed, runs=1, baseline="own greedy generation (HF + port)",
            baseline_seconds=own, ratio=diffed / own,
            note=f"CPU time, 1 thread, paired; {n} steps; "
                 f"{'passed' if result.passed else 'FAILED'}"))
    return rows


def backward_rows(models: Sequence[str] = BACKWARD_MODELS, progress: Progress = print,
                  size: tuple[int, int] = (BATCH, SEQ)) -> list[Measurement]:
    """One row per model: the backward diff over both models' own forward + backward."""
    import introspect
    import introspect.scratch as scratch
    from benchmarks.backward_bench import _own_passes
    from benchmarks.workloads import make_inputs
    from introspect.models.load import load_model

    batch, seq = size
    inputs = make_inputs(batch, seq).tensors
    rows = []
    for name in models:
        progress(f"modes: diff --backward, {name} {batch}x{seq}")
        hf = load_model(name).model.eval()
        port = scratch.BertModel.from_hf(hf).eval()
        _own_passes(hf, port, inputs)  # warm-up
        own, _ = cpu_seconds(lambda: _own_passes(hf, port, inputs))  # noqa: B023
        diffed, result = cpu_seconds(
            lambda: introspect.diff(hf, port, inputs, backward=True))  # noqa: B023
        rows.append(Measurement(
            section=MODES, model=name, batch=batch, seq=seq, task=BACKWARD, tool="introspect",
            status=OK, seconds=diffed, runs=1, baseline="own forward + backward (HF + scratch)",
            baseline_seconds=own, ratio=diffed / own,
            note=f"CPU time, 1 thread, paired; {'passed' if result.passed else 'FAILED'}"))
        hf = port = None  # freed before the next model loads
    return rows


def mode_rows(steps: Sequence[int] = STEPS, models: Sequence[str] = BACKWARD_MODELS,
              progress: Progress = print, size: tuple[int, int] = (BATCH, SEQ),
              ) -> list[Measurement]:
    """Both modes' rows, on one thread (the thread count is put back afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return (generation_rows(steps, progress) if steps else []) \
            + backward_rows(models, progress, size)
    finally:
        torch.set_num_threads(threads)


def modes_table(rows: Sequence[Measurement]) -> str:
    """The report's table: one line per mode and size."""
    lines = ["| mode | model | size | introspect CPU s | own CPU s | ratio |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r.status != OK:
            continue
        size = f"{r.seq} steps" if r.task == GENERATE else f"{r.batch} x {r.seq}"
        lines.append(f"| {r.task} | {r.model} | {size} | {r.seconds:.2f} | "
                     f"{r.baseline_seconds:.2f} | {r.ratio:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", nargs="*", type=int, default=list(STEPS))
    parser.add_argument("--models", nargs="*", default=list(BACKWARD_MODELS))
    args = parser.parse_args(argv)
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    progress: Progress = lambda message: print(message, flush=True)  # noqa: E731
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # each row printed as soon as it is measured
        for n in args.steps:
            _print(generation_rows([n], progress))
        for name in args.models:
            _print(backward_rows([name], progress))
    finally:
        torch.set_num_threads(threads)


def _print(rows: list[Measurement]) -> None:
    for row in rows:
        print(json.dumps({"task": row.task, "model": row.model, "size": row.seq,
                          "diff_cpu_s": round(row.seconds or 0.0, 3),
                          "own_cpu_s": round(row.baseline_seconds or 0.0, 3),
                          "ratio": round(row.ratio or 0.0, 2), "note": row.note}), flush=True)


if __name__ == "__main__":
    main()
