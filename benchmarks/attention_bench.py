"""Time attention maps (issue 14): the probabilities of every layer and head, and the views.

Two figures:

- **maps**: ``introspect.attention`` on HF BERT-base (sdpa) at batch 8 x 128, trace
  included, as a ratio of one plain forward pass timed in the same process.
  Goal: at most 1.3x. The harness (``python -m benchmarks``) times the same task on
  every model and input of its grid (``attention_work``).
- **model view**: the SVG of BERT-large's 24 x 16 heads (one batch row of 128 tokens)
  from maps already computed; goal: a few seconds.

Usage::

    python -m benchmarks.attention_bench              # both figures, one JSON line each
    python -m benchmarks.attention_bench --repeat 5
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import torch

from benchmarks.timing import median_time

ATTENTION_MAPS = "attention maps (every layer and head)"
TOOL = "introspect"


def attention_work(hf: torch.nn.Module, inputs: Any) -> list[Any]:
    """The harness's task: ``introspect.attention`` on the case's model and inputs."""
    import introspect
    from benchmarks.timing import Work

    return [Work(ATTENTION_MAPS, TOOL, lambda: introspect.attention(hf, inputs.for_introspect),
                 units=1.3)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import introspect
    from benchmarks.workloads import make_inputs

    base = introspect.load_model("bert-base").model
    inputs = make_inputs(8, 128)

    def forward() -> Any:
        with torch.no_grad():
            return base(**inputs.tensors)

    forward()  # warm-up
    introspect.attention(base, inputs.tensors)
    forward_s, _ = median_time(forward, args.repeat)
    maps_s, maps = median_time(lambda: introspect.attention(base, inputs.tensors), args.repeat)
    forward_after, _ = median_time(forward, args.repeat)
    forward_s = statistics.median([forward_s, forward_after])
    print(json.dumps({"figure": "attention maps, bert-base 8x128",
                      "forward_s": round(forward_s, 3), "maps_s": round(maps_s, 3),
                      "ratio": round(maps_s / forward_s, 2), "goal": 1.3,
                      "probs_shape": list(maps.probs.shape)}))

    large = introspect.load_model("bert-large").model
    one_row = make_inputs(1, 128)
    large_maps = introspect.attention(large, one_row.tensors)
    view_s, svg = median_time(lambda: large_maps.svg("model"), args.repeat)
    print(json.dumps({"figure": "model view, bert-large 24x16 heads, 128 tokens",
                      "svg_s": round(view_s, 3), "svg_kb": round(len(svg) / 1000, 1)}))


if __name__ == "__main__":
    main()
