"""Benchmarks of introspect, side by side with the tools users would otherwise pick.

``python -m benchmarks`` (or ``make bench``) runs every measurement in one process family
and writes ``reports/benchmarks.md``, ``reports/benchmarks.csv`` and
``reports/benchmarks_growth.png``. Benchmarks are not tests: nothing here asserts a time.

The modules, one job each:

- ``records``: the ``Measurement`` row every other module produces or reads;
- ``machine``: what the numbers were taken on (CPU, cores, memory, versions);
- ``timing``: medians after a warm-up, repetitions by cost, ratios;
- ``memory``: peak resident set of a fresh process running one job;
- ``workloads``: the models (HF and from-scratch) and the seeded inputs;
- ``cases``: introspect's own measurements (trace, shapes, drawings, diff);
- ``alternatives``: torchview, torchlens, torch.export + ShapeProp, forward hooks;
- ``growth``: cost as sequence length and layer count grow, and its plot;
- ``harness``: runs the grid and decides what to skip; ``report``: Markdown and CSV.

Standalone, one JSON row each: ``bigger_bench`` (a Llama port's diff on a 3.4B Llama, peak
memory over weight bytes; ``llama_shards`` writes its checkpoint shard by shard).
"""
