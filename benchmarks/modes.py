"""The diff's two other modes at three sizes each, as ratios of the models' own work.

- **generation**: ``introspect.diff(hf, port, prompt, generate=N)`` on GPT-2 124M (random
  init, published size) against the hand-written port of
  ``examples/generation/gpt2_cached.py``, for N = 16, 64 and 256 steps, over the two
  models' own greedy generation of N tokens through their own caches;
- **backward**: ``introspect.diff(hf, scratch, inputs, backward=True)`` on BERT-tiny and
  -base at 8 x 128 and BERT-large at 2 x 128 (to stay in this machine's memory and time),
  with node tables and without (``nodes=False``: ``introspect diff --backward`` with no
  report, proven from each side's own backward), over the two models' own forward +
  backward on the diff's default loss; with
  ``memory``, also the peak resident memory of a fresh process running the diff over one
  running the two models' own passes (``peak_rss_mib``, ``rss_ratio``).

Each ratio is paired: both sides run in this process, one after the other, on one
thread (``torch.set_num_threads(1)`` for both), in CPU time, which a shared machine
moves far less than wall time. A ratio that stays flat or falls as the size grows is
the goal (issue 31: at most 2x for 16 steps, 64 steps at most 1.1x 16's cost per step;
backward at most 1.5x at BERT-base in time and in peak memory; it was 3.05x and 3.0x).

    python -m benchmarks.modes [--steps 16 64] [--models bert-tiny bert-base] [--memory]
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
BACKWARD_OWN = "diff --backward, no report (nodes=False)"
STEPS = (16, 64, 256)
BACKWARD_MODELS = ("bert-tiny", "bert-base", "bert-large")
BATCH, SEQ = 8, 128
BACKWARD_SIZES = {"bert-large": (2, 128)}  # other models: BATCH x SEQ
# Issue 31's figures for the code before it, BERT-base 8 x 128: time, then peak memory.
BEFORE = {"bert-base": "before issue 31: 3.05x time, 3.0x peak memory"}

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
                  size: tuple[int, int] | None = None, memory: bool = False,
                  ) -> list[Measurement]:
    """One row per model: the backward diff over both models' own forward + backward.

    ``size``: every model's batch and length (None: ``BACKWARD_SIZES``, else BATCH x SEQ).
    ``memory``: also each side's peak memory, from fresh processes (``_peak_job``).
    """
    import introspect
    import introspect.scratch as scratch
    from benchmarks.backward_bench import _own_passes
    from benchmarks.workloads import make_inputs
    from introspect.models.load import load_model

    rows = []
    for name in models:
        batch, seq = size or BACKWARD_SIZES.get(name, (BATCH, SEQ))
        inputs = make_inputs(batch, seq).tensors
        progress(f"modes: diff --backward, {name} {batch}x{seq}")
        hf = load_model(name).model.eval()
        port = scratch.BertModel.from_hf(hf).eval()
        _own_passes(hf, port, inputs)  # warm-up
        own, _ = cpu_seconds(lambda: _own_passes(hf, port, inputs))  # noqa: B023
        timed = {}
        for kind, nodes in (("diff", True), ("plain", False)):  # node tables, then none
            seconds, result = cpu_seconds(
                lambda nodes=nodes: introspect.diff(hf, port, inputs, backward=True,  # noqa: B023
                                                    nodes=nodes))
            timed[kind] = (seconds, result.passed, result.op_level)
        hf = port = result = None  # freed before the next model loads
        peaks = {kind: _peak_mib(name, batch, seq, kind) for kind in ("own", "diff", "plain")} \
            if memory else {}
        before = f"; {BEFORE[name]}" if name in BEFORE else ""
        for kind, task in (("diff", BACKWARD), ("plain", BACKWARD_OWN)):
            seconds, passed, recorded = timed[kind]
            how = "" if kind == "diff" else \
                ("; recorded (the own backward proved nothing)" if recorded
                 else "; nothing recorded: each side's own backward")
            rows.append(Measurement(
                section=MODES, model=name, batch=batch, seq=seq, task=task, tool="introspect",
                status=OK, seconds=seconds, runs=1,
                baseline="own forward + backward (HF + scratch)", baseline_seconds=own,
                ratio=seconds / own, peak_rss_mib=peaks.get(kind),
                rss_ratio=peaks[kind] / peaks["own"] if peaks else None,
                note=f"CPU time, 1 thread, paired; {'passed' if passed else 'FAILED'}{how}"
                     f"{before if kind == 'diff' else ''}"))
    return rows


def _peak_mib(model: str, batch: int, seq: int, kind: str) -> float:
    """Peak resident memory (MiB) of a fresh process that loads both models and runs
    their own passes (``own``) or the backward diff (``diff``), on one thread."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "benchmarks.modes", "--peak", kind, model,
                          f"{batch}x{seq}"], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _peak_job(kind: str, model: str, size: str) -> float:
    """VmHWM, not ``ru_maxrss``: a child's ``ru_maxrss`` starts at its parent's size when
    forked, and the parent has just run a diff."""
    import introspect
    import introspect.scratch as scratch
    from benchmarks.backward_bench import _own_passes
    from benchmarks.workloads import make_inputs
    from introspect.models.load import load_model

    torch.set_num_threads(1)
    batch, seq = (int(x) for x in size.split("x"))
    inputs = make_inputs(batch, seq).tensors
    hf = load_model(model).model.eval()
    port = scratch.BertModel.from_hf(hf).eval()
    if kind == "own":
        _own_passes(hf, port, inputs)
    else:  # "diff": with node tables; "plain": none (each side's own backward)
        introspect.diff(hf, port, inputs, backward=True, nodes=kind == "diff")
    with open("/proc/self/status") as status:
        return next(float(line.split()[1]) / 1024 for line in status
                    if line.startswith("VmHWM:"))


def mode_rows(steps: Sequence[int] = STEPS, models: Sequence[str] = BACKWARD_MODELS,
              progress: Progress = print, size: tuple[int, int] | None = None,
              memory: bool = False) -> list[Measurement]:
    """Both modes' rows, on one thread (the thread count is put back afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return (generation_rows(steps, progress) if steps else []) \
            + backward_rows(models, progress, size, memory)
    finally:
        torch.set_num_threads(threads)


def modes_table(rows: Sequence[Measurement]) -> str:
    """The report's table: one line per mode and size."""
    lines = ["| mode | model | size | introspect CPU s | own CPU s | ratio | peak memory |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r.status != OK:
            continue
        size = f"{r.seq} steps" if r.task == GENERATE else f"{r.batch} x {r.seq}"
        peak = f"{r.peak_rss_mib:.0f} MiB, {r.rss_ratio:.2f}x" \
            if r.peak_rss_mib is not None and r.rss_ratio is not None else ""
        before = next((f" ({part.strip()})" for part in r.note.split(";")
                       if part.strip().startswith("before")), "")
        lines.append(f"| {r.task} | {r.model} | {size} | {r.seconds:.2f} | "
                     f"{r.baseline_seconds:.2f} | {r.ratio:.2f}x{before} | {peak} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", nargs="*", type=int, default=list(STEPS))
    parser.add_argument("--models", nargs="*", default=list(BACKWARD_MODELS))
    parser.add_argument("--memory", action="store_true",
                        help="the backward rows' peak memory too (fresh processes)")
    parser.add_argument("--peak", nargs=3, help=argparse.SUPPRESS)  # KIND MODEL BxS
    args = parser.parse_args(argv)
    if args.peak:
        print(_peak_job(*args.peak))
        return
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
            _print(backward_rows([name], progress, memory=args.memory))
    finally:
        torch.set_num_threads(threads)


def _print(rows: list[Measurement]) -> None:
    for row in rows:
        print(json.dumps({"task": row.task, "model": row.model, "batch": row.batch,
                          "size": row.seq,
                          "diff_cpu_s": round(row.seconds or 0.0, 3),
                          "own_cpu_s": round(row.baseline_seconds or 0.0, 3),
                          "ratio": round(row.ratio or 0.0, 2),
                          "peak_rss_mib": row.peak_rss_mib, "rss_ratio": row.rss_ratio,
                          "note": row.note}), flush=True)


if __name__ == "__main__":
    main()
