"""The targets' ratios in CPU time, one thread: a check that holds on a loaded machine.

On a shared machine a forward's wall time swings with other jobs (a 2 x 9 forward of
BERT-base took 0.6 to 3.9 s in one case of a loaded run), and so does every wall-time
ratio. The CPU time of this process on one thread moves much less: it counts only the
work done here. This prints, for BERT-base, the CPU-time ratios the targets name, as one
JSON line per input size (a measurement, not a test; the harness stays the reference).

    python -m benchmarks.cpu_time [--sizes 2x9 8x128] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def cpu_median(work: Callable[[], Any], runs: int) -> float:
    """Median CPU seconds of ``runs`` calls of ``work`` after one untimed call."""
    work()
    times = []
    for _ in range(runs):
        start = time.process_time()
        work()
        times.append(time.process_time() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["2x9", "8x128"])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import tempfile

    import torch

    from benchmarks.workloads import ModelSpec, load_hf, scratch_twin

    torch.set_num_threads(1)
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="introspect-cpu-time-")
    hf, _ = load_hf(ModelSpec("bert-base"))
    scratch = scratch_twin(hf)
    for size in args.sizes:
        print(json.dumps(measure(hf, scratch, size, args.runs)), flush=True)


def measure(hf: Any, scratch: Any, size: str, runs: int) -> dict[str, Any]:
    """The CPU-time ratios of one input size ("8x128")."""
    from benchmarks import cases
    from benchmarks.workloads import make_inputs
    from introspect.tracing import cache as trace_cache

    batch, seq = (int(n) for n in size.split("x"))
    inputs = make_inputs(batch, seq)
    runs = runs if batch * seq < 512 else max(2, runs // 2)
    forward = cpu_median(lambda: cases.forward(hf, inputs), runs)
    forwards = forward + cpu_median(lambda: cases.forward(scratch, inputs), runs)
    full = cpu_median(lambda: cases.trace_full(hf, inputs), runs)
    traced = cpu_median(lambda: cases.trace_with_shapes(hf, inputs), runs)
    cases.trace_cached(hf, inputs)  # fills the cache
    memory_hit = cpu_median(lambda: cases.trace_cached(hf, inputs), runs)
    trace_cache.clear_memory()
    diffed = cpu_median(lambda: cases.diff(hf, scratch, inputs), runs)
    unrecorded = cpu_median(lambda: cases.diff_without_recording(hf, scratch, inputs), runs)
    faulty = cases.faulty_twin(scratch)
    failed = cpu_median(lambda: cases.diff_without_recording(hf, faulty, inputs),
                        max(1, runs // 2))
    aligned = cpu_median(_alignment(hf, scratch, inputs), runs)
    return {
        "size": size, "threads": 1, "runs": runs, "forward_cpu_s": round(forward, 4),
        "trace_shapes_over_forward": round(traced / forward, 3),
        "full_trace_over_forward": round(full / forward, 3),
        "cache_hit_memory_over_full_trace": round(memory_hit / full, 3),
        "diff_over_two_forwards": round(diffed / forwards, 3),
        "pass_without_recording_over_two_forwards": round(unrecorded / forwards, 3),
        "fail_localised_over_two_forwards": round(failed / forwards, 3),
        "alignment_share_of_diff": round(aligned / diffed, 3),
    }


def _alignment(hf: Any, scratch: Any, inputs: Any) -> Callable[[], Any]:
    """The diff's alignment step alone, on the two graphs the diff records."""
    from introspect.diff.api import record_for_diff
    from introspect.diff.ops.align import align_graphs

    reference, _, _ = record_for_diff(hf, inputs.tensors, "hf")
    candidate, _, _ = record_for_diff(scratch, inputs.tensors, "scratch")
    return lambda: align_graphs(reference, candidate)


if __name__ == "__main__":
    main()
