"""Benchmark of ``introspect.diff`` on BERT-base: time and memory against plain forwards.

Two figures (issue 5), each measured in fresh processes so that one does not warm the
other:

- **wall**: ``diff`` of HF BERT-base against the from-scratch port at batch 8 x 128
  (trace and alignment included), as a ratio of the two plain forward passes it must run
  anyway (HF's and the port's, timed in the same process). Target: under 1.5x.
- **memory**: peak resident memory of a process that runs ``diff`` at 8 x 512, as a
  ratio of the peak of a process that loads HF BERT-base and runs one plain forward.
  Target: under 2x. Also printed: the peak of a process that loads both models and runs
  both forwards, which is the least a diff can use.

Usage::

    python benchmarks/diff_bench.py              # both figures, one JSON line each
    python benchmarks/diff_bench.py --repeat 5
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def _inputs(batch: int, seq: int):
    import torch

    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1000, 30000, (batch, seq), generator=generator)
    input_ids[:, 0] = 101
    attention_mask = torch.ones_like(input_ids)
    attention_mask[batch // 2:, seq - seq // 4:] = 0  # half the batch padded, as real text is
    input_ids[attention_mask == 0] = 0
    token_type_ids = torch.zeros_like(input_ids)
    return {"input_ids": input_ids, "token_type_ids": token_type_ids,
            "attention_mask": attention_mask}


def _models(both: bool):
    import introspect.scratch as scratch
    from introspect.models.load import load_model

    hf = load_model("bert-base").model
    return hf, (scratch.BertModel.from_hf(hf) if both else None)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def wall(repeat: int) -> dict[str, float]:
    """Seconds of the two plain forwards and of the diff, at 8 x 128 (median of ``repeat``)."""
    import torch

    import introspect

    hf, port = _models(both=True)
    inputs = _inputs(8, 128)
    forwards, diffs = [], []
    with torch.no_grad():
        hf(**inputs), port(**inputs)  # warm-up
    for _ in range(repeat):
        with torch.no_grad():
            start = time.perf_counter()
            hf(**inputs)
            port(**inputs)
            forwards.append(time.perf_counter() - start)
        start = time.perf_counter()
        result = introspect.diff(hf, port, inputs)
        diffs.append(time.perf_counter() - start)
        assert result.passed
    forward, diffed = statistics.median(forwards), statistics.median(diffs)
    return {"figure": "wall 8x128", "two_forwards_s": round(forward, 3),
            "diff_s": round(diffed, 3), "ratio": round(diffed / forward, 3),
            "coverage": round(result.alignment.coverage, 3),
            "max_abs_err": result.max_abs_err, "target": 1.5}


def memory(mode: str) -> dict[str, float]:
    """Peak resident MiB of one process: "forward", "forwards" (both models) or "diff"."""
    import torch

    import introspect

    hf, port = _models(both=mode != "forward")
    loaded = _peak_mib()
    inputs = _inputs(8, 512)
    if mode == "diff":
        result = introspect.diff(hf, port, inputs)
        assert result.passed
    else:
        with torch.no_grad():
            hf(**inputs)
            if port is not None:
                port(**inputs)
    return {"mode": mode, "peak_mib": round(_peak_mib(), 1), "after_load_mib": round(loaded, 1)}


def _fresh(mode: str) -> dict[str, float]:
    output = subprocess.run([sys.executable, __file__, "--memory-mode", mode], check=True,
                            capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--memory-mode", choices=("forward", "forwards", "diff"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--skip-wall", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    if args.memory_mode:
        print(json.dumps(memory(args.memory_mode)))
        return
    if not args.skip_wall:
        print(json.dumps(wall(args.repeat)), flush=True)
    if not args.skip_memory:
        runs = {mode: _fresh(mode) for mode in ("forward", "forwards", "diff")}
        print(json.dumps({
            "figure": "peak memory 8x512",
            "one_forward_mib": runs["forward"]["peak_mib"],
            "both_models_both_forwards_mib": runs["forwards"]["peak_mib"],
            "diff_mib": runs["diff"]["peak_mib"],
            "ratio": round(runs["diff"]["peak_mib"] / runs["forward"]["peak_mib"], 3),
            "ratio_to_both_forwards": round(runs["diff"]["peak_mib"]
                                            / runs["forwards"]["peak_mib"], 3),
            "target": 2.0,
        }))


if __name__ == "__main__":
    main()
