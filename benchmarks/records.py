"""The row every benchmark produces: one measurement of one task by one tool on one input.

Imports nothing internal, so every module of the harness can use it.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a row's status says; only "ok" rows carry figures.
OK = "ok"
SKIPPED = "skipped"  # not run, and ``note`` says why (time or memory it would take)
FAILED = "failed"  # run, and raised; ``note`` holds the error's first line
NOT_MEASURED = "not measured"  # the capability is missing (an optional package, the diff API)

# Sections of the report.
GRID = "grid"  # model x (batch, sequence) cells
STARTUP = "startup"  # ``introspect --help``
GROWTH = "growth"  # cost as sequence length and layer count grow


@dataclass(frozen=True)
class Measurement:
    """One task by one tool on one model and input size, with its ratio to a baseline."""

    section: str  # GRID, STARTUP or GROWTH
    model: str  # "bert-base", or "bert-base/L4" for a growth point with 4 layers
    batch: int  # B (0 where no model runs)
    seq: int  # S
    task: str  # what is measured: "trace + shapes", "diff", "peak memory: diff", ...
    tool: str  # who does it: "introspect", "torchview", "HF", ...
    status: str  # OK, SKIPPED, FAILED or NOT_MEASURED
    seconds: float | None = None  # median wall time of ``runs`` runs after ``warmup``
    warmup: int = 0  # untimed runs before the timed ones
    runs: int = 0  # timed runs
    baseline: str = ""  # what ``ratio`` divides by: "1 forward", "2 forwards", ...
    baseline_seconds: float | None = None
    ratio: float | None = None  # seconds / baseline_seconds, measured in the same run
    peak_rss_mib: float | None = None  # VmHWM of the fresh process that ran the task
    loaded_rss_mib: float | None = None  # its resident set after loading, before the task
    rss_ratio: float | None = None  # peak_rss_mib / the plain forward's peak
    output_bytes: int | None = None  # size of what the task produced (SVG bytes)
    note: str = ""  # why skipped or failed, or how a figure was derived
