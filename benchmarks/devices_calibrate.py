"""How close the device budgets sit to what correct ports and real faults measure on a GPU.

For each case, the float32 HF reference on the CPU against a candidate on ``cuda``: the
verdict, the largest propagated error, and the worst local error of the matmul nodes and of
the other nodes, each as a fraction of its budget (1.0 is the budget's edge). Run where a
GPU is lent; the figures are quoted in docs/devices.md.

    python -m benchmarks.devices_calibrate [--models bert-tiny bert-base]
"""

from __future__ import annotations

import argparse
import json

CASES = (  # (name, candidate dtype, matmul precision, fault, noise budget)
    ("fp32 port, full fp32 matmuls", "float32", "ieee", None, False),
    ("fp32 port, TF32 matmuls", "float32", "tf32", None, False),
    ("bf16 port, noise budget", "bfloat16", "tf32", None, True),
    ("fp32 port + tanh GELU in layer 1, full fp32", "float32", "ieee", "gelu_tanh", False),
    ("fp32 port + tanh GELU in layer 1, TF32", "float32", "tf32", "gelu_tanh", False),
    ("bf16 port + tanh GELU in layer 1, noise budget", "bfloat16", "tf32", "gelu_tanh", True),
)


def _worst(result, matmuls: bool) -> float:
    from introspect.diff.devices import MATMUL_OPS

    worst = 0.0
    for row in result.rows:
        if row.local_max_abs_err is None or row.atol is None or (row.op in MATMUL_OPS) != matmuls:
            continue
        worst = max(worst, row.local_max_abs_err / (row.atol + 1e-30))
    return round(worst, 3)


def run_case(model: str, case: tuple) -> dict[str, object]:
    import time

    import torch

    import introspect
    from introspect.models.load import load_model
    from tests.ports import hf_like
    from tests.ports.batch import port_batch

    name, dtype, precision, fault, noise = case
    loaded = load_model(model)
    torch.backends.cuda.matmul.fp32_precision = precision
    port = hf_like.build(loaded.model, fault=fault, layer=1).to(getattr(torch, dtype))
    start = time.perf_counter()
    result = introspect.diff(loaded.model, port, port_batch(loaded.tokenizer),
                             candidate_device="cuda", noise_budget=noise)
    seconds = time.perf_counter() - start
    divergence = result.first_divergence
    return {"model": model, "case": name, "passed": result.passed,
            "blamed": divergence.layer if divergence else None,
            "max_abs_err": round(result.max_abs_err, 6),
            "worst_matmul_local_over_atol": _worst(result, True),
            "worst_other_local_over_atol": _worst(result, False), "diff_s": round(seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert-tiny", "bert-base"])
    args = parser.parse_args()
    for model in args.models:
        for case in CASES:
            try:
                print(json.dumps(run_case(model, case)), flush=True)
            except Exception as e:  # noqa: BLE001 - one case's failure must not hide the rest
                print(json.dumps({"model": model, "case": case[0], "error": repr(e)[:400]}),
                      flush=True)


if __name__ == "__main__":
    main()
