"""Benchmark of ``introspect.diff(..., backward=True)`` on BERT-base at 8 x 128.

Two figures (issue 25), each from a fresh process so that one does not warm the other:

- **wall**: the backward diff of HF BERT-base against the from-scratch port (recording,
  alignment, the forward comparison and the gradient comparison all included), as a ratio
  of the two models' own forward + backward on the same loss, timed in the same process.
  Goal: at most 1.5x.
- **memory**: peak resident memory of a process that runs the backward diff, as a ratio
  of the peak of a process that loads both models and runs both forward + backward passes.

Usage::

    python benchmarks/backward_bench.py            # one JSON line per figure
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

BATCH, SEQ = 8, 128


def _inputs():
    from benchmarks.diff_bench import _inputs as padded_inputs

    return padded_inputs(BATCH, SEQ)


def _models():
    import introspect.scratch as scratch
    from introspect.models.load import load_model

    hf = load_model("bert-base").model
    return hf, scratch.BertModel.from_hf(hf)


def _own_passes(hf, port, inputs) -> None:
    """Both models forward and backward on the diff's default loss (the base model's)."""
    from introspect.diff.backward.losses import default_loss

    loss = default_loss("hidden")
    for model in (hf, port):
        model.zero_grad(set_to_none=True)
        loss(model(**inputs), inputs).backward()
        model.zero_grad(set_to_none=True)


def wall() -> dict[str, float | str]:
    import introspect

    hf, port = _models()
    hf.eval(), port.eval()
    inputs = _inputs()
    _own_passes(hf, port, inputs)  # warm-up
    start = time.perf_counter()
    _own_passes(hf, port, inputs)
    own = time.perf_counter() - start
    start = time.perf_counter()
    result = introspect.diff(hf, port, inputs, backward=True)
    diffed = time.perf_counter() - start
    assert result.passed, result.summary()
    return {"figure": f"backward wall {BATCH}x{SEQ}", "two_forward_backward_s": round(own, 3),
            "backward_diff_s": round(diffed, 3), "ratio": round(diffed / own, 3)}


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_job(kind: str) -> float:
    import introspect

    hf, port = _models()
    hf.eval(), port.eval()
    inputs = _inputs()
    if kind == "own":
        _own_passes(hf, port, inputs)
    else:
        assert introspect.diff(hf, port, inputs, backward=True).passed
    return _peak_mib()


def memory() -> dict[str, float | str]:
    peaks = {}
    for kind in ("own", "diff"):
        out = subprocess.run([sys.executable, "-m", "benchmarks.backward_bench", "--job", kind],
                             capture_output=True, text=True, check=True)
        peaks[kind] = float(out.stdout.strip().splitlines()[-1])
    return {"figure": f"backward peak memory {BATCH}x{SEQ}",
            "two_forward_backward_mib": round(peaks["own"]),
            "backward_diff_mib": round(peaks["diff"]),
            "ratio": round(peaks["diff"] / peaks["own"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=("own", "diff"), help=argparse.SUPPRESS)
    parser.add_argument("--figure", choices=("wall", "memory", "both"), default="both")
    args = parser.parse_args()
    if args.job:
        print(memory_job(args.job))
        return
    if args.figure in ("wall", "both"):
        print(json.dumps(wall()), flush=True)
    if args.figure in ("memory", "both"):
        print(json.dumps(memory()), flush=True)


if __name__ == "__main__":
    main()
