"""Benchmark: ``introspect diff`` of a port of a large Llama, peak memory over weight bytes.

A 24 GiB machine must diff a port of a 7B-class Llama (13.5 GB of bfloat16 weights), so
the diff may hold one model's weights, not two: the reference reads its safetensors in
place (memory-mapped), the port takes the reference's tensors (``load_state_dict(...,
assign=True)``, examples/large/llama_port.py), and the replay keeps only the values a
comparison still needs. The figure is the whole process's peak resident set (VmHWM:
Python, torch and transformers included, and every mapped page of the weights it read)
divided by the bytes of one model's weights; the goal is at most 1.25.

The checkpoint is random-init bfloat16 safetensors, written shard by shard into a
temporary folder by this benchmark (``benchmarks.llama_shards``), removed afterwards.
The diff runs as ``introspect diff`` in a fresh interpreter, on 1 x 16 tokens.

Usage::

    python -m benchmarks.bigger_bench                 # Llama 3.4B: one JSON row
    python -m benchmarks.bigger_bench --size 7b       # Llama-2-7B's sizes (13.5 GB)
    python -m benchmarks.bigger_bench --size small --out reports/bigger_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PORT = ROOT / "examples" / "large" / "llama_port.py"
# 16 WordPiece tokens with [CLS] and [SEP] (the embedded vocab stands in for Llama's own)
TEXT = "the quick brown fox jumps over the lazy dog while seven tired cats sleep"
GOAL = 1.25  # peak RSS / weight bytes


def diff_command(folder: Path, json_path: Path, port: Path = PORT) -> list[str]:
    """The ``introspect diff`` arguments the benchmark (and its test) run."""
    return ["diff", "--model", str(folder), "--head", "causal-lm",
            "--candidate", f"{port}:build", "--text", TEXT, "--json", str(json_path),
            "--quiet"]


def measure_diff(folder: Path, port: Path = PORT, timeout: float = 3600.0) -> dict[str, Any]:
    """Run the diff in a fresh interpreter; its exit code, verdict, peak RSS and seconds."""
    from benchmarks.llama_shards import checkpoint_bytes

    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "diff.json"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "benchmarks.bigger_bench", "--child",
                               *diff_command(folder, report, port)], capture_output=True, text=True,
                              env=env, timeout=timeout, check=False, cwd=ROOT)
        seconds = time.perf_counter() - started
        lines = done.stdout.strip().splitlines()
        if not lines or not lines[-1].startswith("{"):
            raise RuntimeError(f"the diff exited with {done.returncode} and no figures: "
                               f"{done.stderr.strip()[-400:]}")
        child = json.loads(lines[-1])
        result = json.loads(report.read_text()) if report.exists() else {}
    weights = checkpoint_bytes(folder)
    return {"exit_code": child["exit_code"], "passed": result.get("passed"),
            "pairs": sum(1 for row in result.get("nodes", []) if row.get("candidate_node")
                         and row.get("reference_node")), "weight_bytes": weights,
            "imported_rss_bytes": child["imported_rss_bytes"],
            "peak_rss_bytes": child["peak_rss_bytes"],
            "peak_over_weights": round(child["peak_rss_bytes"] / weights, 3),
            "seconds": round(seconds, 1), "stderr": done.stderr.strip()[-400:]}


def _child(argv: list[str]) -> None:
    """``introspect diff argv`` in this process, then its figures as one JSON line."""
    import transformers.models.llama.modeling_llama  # noqa: F401

    import introspect.cli.main as cli
    import introspect.diff.api  # noqa: F401  # the imports every diff pays, before the model

    imported = _status_bytes("VmRSS")
    code = cli.main(argv)
    print(json.dumps({"exit_code": code, "imported_rss_bytes": imported,
                      "peak_rss_bytes": _status_bytes("VmHWM")}), flush=True)


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    return 0


def measure(size: str, folder: Path | None = None) -> dict[str, Any]:
    """Write the checkpoint (unless ``folder`` holds one), diff its port, return the row."""
    from benchmarks.llama_shards import LLAMA_3B, LLAMA_7B, LLAMA_SMALL, write_llama_checkpoint

    sizes = {"3b": LLAMA_3B, "7b": LLAMA_7B, "small": LLAMA_SMALL}[size]
    with tempfile.TemporaryDirectory(prefix="introspect-llama-") as temporary:
        target = folder or Path(temporary) / "llama"
        started = time.perf_counter()
        if not (target / "config.json").exists():
            write_llama_checkpoint(target, sizes)
        written = time.perf_counter() - started
        row = measure_diff(target)
    parameters = _parameters(sizes)
    return {"case": f"diff of a Llama port, {parameters / 1e9:.1f}B parameters, bfloat16, 1x16",
            "parameters": parameters, **row, "goal": GOAL,
            "within_goal": row["peak_over_weights"] <= GOAL, "write_seconds": round(written, 1)}


def _parameters(sizes: dict[str, Any]) -> int:
    from introspect.models.validate import estimate_parameters

    return estimate_parameters({**sizes, "model_type": "llama"})


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("3b", "7b", "small"), default="3b")
    parser.add_argument("--folder", type=Path,
                        help="a checkpoint folder to use (written there first if empty), "
                             "kept afterwards")
    parser.add_argument("--out", type=Path, help="also write the row here as JSON")
    args = parser.parse_args()
    row = measure(args.size, args.folder)
    print(json.dumps(row))
    if args.out:
        args.out.write_text(json.dumps([row], indent=2) + "\n")


if __name__ == "__main__":
    main()
