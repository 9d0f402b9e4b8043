"""Benchmark of ``introspect diff --nproc 2``: a Megatron-style port of HF BERT on 2 ranks.

One figure (issue 32): the wall time of ``introspect.diff(reference, port, inputs,
nproc=2)`` (capturing the reference, starting the two ranks, building the port on each,
the truth runs, the recording and its replay, joining the ranks' values, the dump diff)
as a ratio of the two processes' own forwards (each rank's second plain forward, timed
between barriers; the slower of the two, since they run side by side).

The port is the test suite's ``tests/parallel/port_files/megatron_bert.py``.

Usage::

    python -m benchmarks.parallel_bench                       # bert-base, 2 x 32
    python -m benchmarks.parallel_bench --model bert-tiny --batch 2 --seq 9
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

PORT = Path(__file__).resolve().parent.parent / "tests/parallel/port_files/megatron_bert.py"


def wall(model: str, batch: int, seq: int, nproc: int) -> dict[str, float | str]:
    import introspect
    from benchmarks.diff_bench import _inputs
    from introspect.models.load import load_model
    from introspect.models.ports import LoadedReference

    loaded = load_model(model)
    reference = LoadedReference(loaded.model, loaded.model.config, loaded.folder,
                                loaded.tokenizer, loaded.source, loaded.head, loaded.attn)
    inputs = _inputs(batch, seq)
    start = time.perf_counter()
    result = introspect.diff(reference, f"{PORT}:build", inputs, nproc=nproc)
    diffed = time.perf_counter() - start
    assert result.passed, result.first_divergence
    own = max(result.parallel.forward_seconds)
    return {"figure": f"--nproc {nproc} wall, {model} {batch}x{seq}",
            "rank_forward_s": round(own, 4), "diff_s": round(diffed, 3),
            "ratio": round(diffed / own, 1),
            "phases_s": {k: round(v, 2) for k, v in result.parallel.seconds.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args(argv)
    print(json.dumps(wall(args.model, args.batch, args.seq, args.nproc)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
