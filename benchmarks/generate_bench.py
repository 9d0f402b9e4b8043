"""Benchmark of ``introspect diff --generate 16`` on GPT-2 (random init, published size).

One figure (issue 24): the wall time of ``introspect.diff(hf, port, prompt, generate=16)``
(prefill and 15 one-token steps, each recorded on both sides, aligned, replayed side by
side, every layer's cache compared) as a ratio of the two models' own greedy generation of
16 tokens with their caches (HF's ``GPT2LMHeadModel`` through its own cache, and the
hand-written port of ``examples/generation/gpt2_cached.py`` through its own), timed in
the same process. Goal: under 2x.

Usage::

    python benchmarks/generate_bench.py            # one JSON line
    python benchmarks/generate_bench.py --steps 16 --repeat 1
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = (101, 1996, 4937, 2938, 2006, 1996, 13523, 1012)  # "[CLS] the cat sat on the mat."


def _port_module():
    path = ROOT / "examples" / "generation" / "gpt2_cached.py"
    spec = importlib.util.spec_from_file_location("gpt2_cached", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _hf_generate(model, ids, steps: int):
    import torch

    with torch.no_grad():
        output = model(input_ids=ids, use_cache=True)
        tokens = [output.logits[:, -1].argmax(-1)]
        for _ in range(steps - 1):
            output = model(input_ids=tokens[-1][:, None], cache=output.cache, use_cache=True)
            tokens.append(output.logits[:, -1].argmax(-1))
    return torch.stack(tokens, dim=1)


def measure(steps: int, repeat: int) -> dict[str, float | int | str | bool]:
    import torch

    import introspect
    from introspect.models.load import load_model

    torch.manual_seed(0)
    hf = load_model("gpt2", head="causal-lm").model.eval()
    port_module = _port_module()
    port = port_module.build(hf)
    ids = torch.tensor([PROMPT])
    _hf_generate(hf, ids, 2)  # warm both paths once
    port_module.generate(port, ids, 2)
    plain, diffs = [], []
    passed = False
    for _ in range(repeat):
        start = time.perf_counter()
        reference = _hf_generate(hf, ids, steps)
        candidate = port_module.generate(port, ids, steps)
        plain.append(time.perf_counter() - start)
        assert torch.equal(reference, candidate)
        start = time.perf_counter()
        result = introspect.diff(hf, port, {"input_ids": ids}, generate=steps)
        diffs.append(time.perf_counter() - start)
        passed = result.passed
    two = statistics.median(plain)
    diffed = statistics.median(diffs)
    return {"case": f"diff --generate {steps}, GPT-2 124M (random init), prompt {len(PROMPT)}",
            "generation_s": round(two, 3), "diff_s": round(diffed, 3),
            "ratio": round(diffed / two, 2), "goal": 2.0, "passed": passed,
            "threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.steps, args.repeat)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
