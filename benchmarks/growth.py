"""How cost grows: sequence length 32 -> 512 (BERT-base) and layers 2 -> 24 (BERT-base width).

Each point times a plain forward, introspect's trace + shapes and its diff, and measures
the peak resident set of a fresh process for each; ``plot_growth`` draws the four curves
(time and memory against each axis) with matplotlib.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks import cases
from benchmarks.harness import Estimator, Progress, Settings, peak_rows, time_work
from benchmarks.records import GROWTH, OK, Measurement
from benchmarks.timing import Repetitions, ratio, time_median
from benchmarks.workloads import ModelSpec, load_hf, make_inputs, scratch_twin

BATCH = 4
SEQ_POINTS = (32, 64, 128, 256, 512)  # BERT-base, 12 layers
LAYER_POINTS = (2, 4, 6, 12, 24)  # BERT-base width, at LAYER_SEQ tokens
LAYER_SEQ = 128
QUICK_SIZE, QUICK_SEQ_POINTS, QUICK_LAYER_POINTS = "bert-tiny", (16,), (1,)  # one point each
PEAK_TASKS = ((cases.FORWARD, "HF"), (cases.TRACE_SHAPES, cases.TOOL), (cases.DIFF, cases.TOOL))
QUICK_PEAK_TASKS = ((cases.FORWARD, "HF"), (cases.DIFF, cases.TOOL))
TIMED_TASKS = (cases.FORWARD, cases.TRACE_SHAPES, cases.DIFF)


def growth_rows(settings: Settings, progress: Progress) -> list[Measurement]:
    """Every growth point: along the sequence axis, then along the layer axis."""
    estimator = Estimator()  # the grid's estimates are for other batch sizes
    size = QUICK_SIZE if settings.quick else "bert-base"
    seq_points = QUICK_SEQ_POINTS if settings.quick else SEQ_POINTS
    layer_points = QUICK_LAYER_POINTS if settings.quick else LAYER_POINTS
    rows = []
    spec = ModelSpec(size)
    hf, tokenizer = load_hf(spec)
    scratch = scratch_twin(hf)
    for seq in seq_points:
        rows += _point(spec, hf, scratch, seq, settings, estimator, progress)
    del hf, scratch
    layer_seq = seq_points[0] if settings.quick else LAYER_SEQ
    for layers in layer_points:
        spec = ModelSpec(size, layers)
        hf, _ = load_hf(spec)
        rows += _point(spec, hf, scratch_twin(hf), layer_seq, settings, estimator, progress)
    return rows


def _point(spec: ModelSpec, hf: torch.nn.Module, scratch: torch.nn.Module, seq: int,
           settings: Settings, estimator: Estimator, progress: Progress) -> list[Measurement]:
    progress(f"growth: {spec.name} {BATCH}x{seq}")
    inputs = make_inputs(BATCH, seq)
    first = time_median(lambda: cases.forward(hf, inputs), Repetitions(0, 1)).median
    # Growth curves show a trend; one run each, three for points under half a second.
    repetitions = Repetitions(0, 3) if first < 0.5 and not settings.quick else Repetitions(0, 1)
    forward = time_median(lambda: cases.forward(hf, inputs), repetitions, settings.task_budget_s)
    scratch_forward = time_median(lambda: cases.forward(scratch, inputs), repetitions,
                                  settings.task_budget_s)
    works = [w for w in cases.introspect_work(hf, scratch, inputs) if w.task in TIMED_TASKS]
    base = dict(section=GROWTH, model=spec.name, batch=BATCH, seq=seq)
    rows = [Measurement(task=cases.FORWARD, tool="HF", status=OK, seconds=forward.median,
                        warmup=1, runs=forward.repetitions.runs, **base)]
    bases = {1: forward.median, 2: forward.median + scratch_forward.median}
    for work in works:
        done = time_work(spec, work, repetitions, forward.median, settings, estimator)
        rows.append(Measurement(
            task=work.task, tool=work.tool, status=done.status, seconds=done.seconds,
            warmup=done.repetitions.warmup, runs=done.repetitions.runs,
            baseline="1 forward" if work.baseline == 1 else "HF + scratch forwards",
            baseline_seconds=bases[work.baseline],
            ratio=ratio(done.seconds, bases[work.baseline]), note=done.note, **base))
    rows += peak_rows(spec, BATCH, seq, settings, estimator, forward.median, progress,
                      section=GROWTH, tasks=QUICK_PEAK_TASKS if settings.quick else PEAK_TASKS)
    return rows


def plot_growth(rows: Sequence[Measurement], path: str | Path) -> Path:
    """Draw time and peak memory against sequence length and layer count as one PNG."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from introspect.files import write_atomic

    growth = [r for r in rows if r.section == GROWTH and r.status == OK]
    by_seq = [r for r in growth if "/L" not in r.model]
    by_layers = [r for r in growth if "/L" in r.model]
    figure, axes = plt.subplots(2, 2, figsize=(11, 8), constrained_layout=True)
    panels = (
        (axes[0][0], by_seq, _seq_of, "seconds", "time"),
        (axes[0][1], by_layers, _layers_of, "seconds", "time"),
        (axes[1][0], by_seq, _seq_of, "peak_rss_mib", "memory"),
        (axes[1][1], by_layers, _layers_of, "peak_rss_mib", "memory"),
    )
    for axis, points, x_of, field, kind in panels:
        series: dict[str, list[tuple[int, float]]] = {}
        for r in points:
            value = getattr(r, field)
            if value is not None:
                series.setdefault(f"{r.task} ({r.tool})", []).append((x_of(r), value))
        for label, xy in series.items():
            xy.sort()
            axis.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=label)
        axis.set_xscale("log", base=2)
        ticks = sorted({x for xy in series.values() for x, _ in xy})
        axis.set_xticks(ticks, [str(t) for t in ticks])
        axis.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        axis.set_xlabel("sequence length" if x_of is _seq_of else "encoder layers")
        axis.set_ylabel("median seconds" if kind == "time" else "peak resident set (MiB)")
        if kind == "time":
            axis.set_yscale("log")
        axis.grid(True, which="both", alpha=0.3)
        if series:
            axis.legend(fontsize=8)
        model = points[0].model.split("/")[0] if points else ""
        axis.set_title(f"{kind} vs {'sequence length' if x_of is _seq_of else 'layers'}"
                       f" ({model}, batch {BATCH})", fontsize=10)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return write_atomic(path, buffer.getvalue())


def _seq_of(r: Measurement) -> int:
    return r.seq


def _layers_of(r: Measurement) -> int:
    return int(r.model.split("/L")[1])
