"""Benchmark of the device split: the reference in float32 on the CPU, the candidate elsewhere.

One row per candidate device (issue 32): ``introspect.diff`` of HF BERT against the
from-scratch port at batch 8 x 128, the port in bfloat16 on ``--candidate-device`` with
``noise_budget=True`` (the usual split: a bf16 port on ``cuda`` checked against the fp32
CPU golden run), timed against the plain forwards a user runs anyway: the reference's on
the CPU and the port's on its device. Without a GPU, ``cpu`` stands in for the device: the
same code path, every value moved to the comparison device (a no-op there).

Usage::

    python -m benchmarks.devices_bench                       # cpu, and cuda where there is one
    python -m benchmarks.devices_bench --model bert-tiny --devices cpu --repeat 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def split(model: str, device: str, repeat: int, batch: int = 8, seq: int = 128,
          dtype: str = "bfloat16") -> dict[str, object]:
    """Seconds of the plain forwards and of the diff, the port on ``device`` in ``dtype``."""
    import torch

    import introspect
    import introspect.scratch as scratch
    from benchmarks.diff_bench import _inputs
    from introspect.models.load import load_model

    reference = load_model(model).model.eval()
    port = scratch.BertModel.from_hf(reference).to(getattr(torch, dtype)).eval()
    inputs = _inputs(batch, seq)
    placed = {k: v.to(device) for k, v in inputs.items()}
    port.to(device)
    with torch.no_grad():  # warm-up: CUDA's kernels load on first use
        reference(**inputs), port(**placed)
    _sync(device)
    forwards, diffs = [], []
    result = None
    for _ in range(repeat):
        with torch.no_grad():
            start = time.perf_counter()
            reference(**inputs)
            port(**placed)
            _sync(device)
            forwards.append(time.perf_counter() - start)
        start = time.perf_counter()
        result = introspect.diff(reference, port, inputs, candidate_device=device,
                                 noise_budget=True)
        _sync(device)
        diffs.append(time.perf_counter() - start)
    assert result is not None
    forward, diffed = statistics.median(forwards), statistics.median(diffs)
    return {"figure": f"device split {batch}x{seq}", "model": model,
            "candidate": f"{dtype} on {device}", "reference": "float32 on cpu",
            "two_forwards_s": round(forward, 6), "diff_s": round(diffed, 6),
            "ratio": round(diffed / forward, 2), "passed": result.passed,
            "max_abs_err": round(result.max_abs_err, 5),
            "gpu_peak_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1)
            if device.startswith("cuda") else None}


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--devices", nargs="+",
                        default=["cpu", *(["cuda"] if torch.cuda.is_available() else [])])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--size", default="8x128", help="batch x tokens (default: 8x128)")
    args = parser.parse_args()
    batch, seq = (int(x) for x in args.size.split("x"))
    for device in args.devices:
        print(json.dumps(split(args.model, device, args.repeat, batch, seq)), flush=True)


if __name__ == "__main__":
    main()
