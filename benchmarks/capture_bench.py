"""Benchmark of ``introspect capture`` on BERT-base 8 x 128: time and file size.

Two rows: every computing node, and each layer's output only. Times are medians of
``--repeat`` runs, as a ratio of one plain forward timed in the same process (trace
included, as the CLI pays it); sizes are the bytes of the safetensors file written.

Usage::

    python -m benchmarks.capture_bench              # one JSON line per row
    python -m benchmarks.capture_bench --repeat 3 --out reports/capture_bench.json
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.timing import median_time


def _inputs(batch: int, seq: int) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1000, 30000, (batch, seq), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[batch // 2:, seq - seq // 4:] = 0  # half the batch padded, as real text is
    return {"input_ids": input_ids, "token_type_ids": torch.zeros_like(input_ids),
            "attention_mask": attention_mask}


def measure(repeat: int, batch: int = 8, seq: int = 128) -> list[dict[str, Any]]:
    import torch

    from introspect.dump import capture, capture_bytes
    from introspect.models.load import load_model

    model = load_model("bert-base").model
    inputs = _inputs(batch, seq)
    with torch.no_grad():
        model(**inputs)  # warm-up
        forward_s, _ = median_time(lambda: model(**inputs), repeat)
    rows = []
    for select in ("all", "layers"):
        seconds, taken = median_time(partial(capture, model, inputs, select=select), repeat)
        size = len(capture_bytes(taken))
        rows.append({"case": f"capture BERT-base {batch}x{seq}", "select": select,
                     "tensors": len(taken.entries), "seconds": round(seconds, 3),
                     "forward_s": round(forward_s, 3), "ratio": round(seconds / forward_s, 2),
                     "file_bytes": size, "file_mib": round(size / 2**20, 1)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the rows here as JSON")
    args = parser.parse_args()
    rows = measure(args.repeat)
    for row in rows:
        print(json.dumps(row))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
