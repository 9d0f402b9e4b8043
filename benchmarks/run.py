"""The whole benchmark run, in the order the report shows it: start-up, the grid of models
and sizes (``harness``), how costs grow (``growth``), and the modes (``modes``).

Apart from ``harness`` so that ``growth``, which measures with the harness's tools, and
the harness import nothing of each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from benchmarks import cases
from benchmarks.growth import growth_rows
from benchmarks.harness import (
    Estimator,
    Progress,
    Settings,
    case_rows,
    peak_rows,
    startup_rows,
)
from benchmarks.memory import start_server
from benchmarks.records import GRID, GROWTH, STARTUP, Measurement
from benchmarks.workloads import ModelSpec, load_hf, make_inputs, scratch_twin


def run_benchmarks(settings: Settings, progress: Progress = print,
                   checkpoint: Callable[[list[Measurement]], None] | None = None,
                   resumed: Sequence[Measurement] = ()) -> list[Measurement]:
    """Every measurement of ``settings``, in the order the report shows them.

    ``checkpoint`` gets the rows so far after every case, so a run cut short (killed for
    memory, interrupted) can be resumed: cases, start-up and growth rows in ``resumed``
    are kept as they are and not measured again.
    """
    torch.set_num_threads(settings.threads)
    start_server()
    rows = [r for r in resumed if r.section == STARTUP] or startup_rows(settings, progress)
    estimator = Estimator()
    for name in settings.models:
        spec = ModelSpec(name)
        done = {(r.batch, r.seq) for r in resumed if r.section == GRID and r.model == spec.name}
        rows += [r for r in resumed if r.section == GRID and r.model == spec.name]
        if all(size in done for size in settings.sizes):
            continue
        progress(f"{spec.name}: loading")
        hf, tokenizer = load_hf(spec)
        scratch = scratch_twin(hf)
        for batch, seq in settings.sizes:
            if (batch, seq) in done:
                continue
            progress(f"{spec.name} {batch}x{seq}")
            rows += case_rows(spec, hf, scratch, make_inputs(batch, seq, tokenizer), settings,
                              estimator, progress)
            if checkpoint is not None:
                checkpoint(rows)
        del hf, scratch
        for batch, seq in settings.peak_sizes:
            if (batch, seq) in done:
                continue
            progress(f"{spec.name} {batch}x{seq}: peak memory only")
            rows += peak_rows(spec, batch, seq, settings, Estimator(), 0.0, progress,
                              tasks=PEAK_ONLY_TASKS)
            if checkpoint is not None:
                checkpoint(rows)
    resumed_growth = [r for r in resumed if r.section == GROWTH]
    if settings.growth and resumed_growth:
        rows += resumed_growth
    elif settings.growth:
        rows += growth_rows(settings, progress)
    rows += _mode_rows(settings, resumed, progress)
    return rows


def _mode_rows(settings: Settings, resumed: Sequence[Measurement],
               progress: Progress) -> list[Measurement]:
    """The generation and backward modes at three sizes each (``benchmarks.modes``); not
    in quick mode (GPT-2 124M alone takes longer than the whole smoke test)."""
    from benchmarks import modes

    kept = [r for r in resumed if r.section == modes.MODES]
    if kept or not settings.modes:
        return kept
    if settings.quick:
        return []
    return modes.mode_rows(progress=progress, memory=True)


PEAK_ONLY_TASKS = ((cases.FORWARD, "HF"), (cases.DIFF, cases.TOOL))


__all__ = ["run_benchmarks"]
