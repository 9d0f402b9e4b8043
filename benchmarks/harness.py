"""Run the grid: every model x input size, introspect and the alternatives side by side.

Cases run from the smallest model and input to the largest. For each case a plain HF
forward pass is timed first (its first run is the warm-up, and its time sets how many
runs every task gets: see ``timing.repetitions_for``) and again at the end, and every
ratio divides by the median of those runs. A task is skipped, and the row says why,
when its expected time exceeds the cap or when torchlens would hold more activations
than the memory cap.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks import alternatives, cases, jobs
from benchmarks.attention_bench import attention_work
from benchmarks.memory import FreshProcessError, run_fresh, run_interpreter
from benchmarks.records import (
    FAILED,
    GRID,
    NOT_MEASURED,
    OK,
    SKIPPED,
    STARTUP,
    Measurement,
)
from benchmarks.timing import Repetitions, Work, ratio, repetitions_for, time_median
from benchmarks.workloads import Inputs, ModelSpec

MODELS = ("bert-tiny", "bert-base", "bert-large")
SIZES = ((2, 9), (8, 128), (8, 512))
GIB = 2**30

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Settings:
    """What to measure and the caps that keep a full run within its time."""

    models: tuple[str, ...] = MODELS
    sizes: tuple[tuple[int, int], ...] = SIZES
    quick: bool = False  # one run of everything: the smoke test
    threads: int = 2  # torch.set_num_threads, here and in every fresh process
    task_budget_s: float = 20.0  # fewer runs (at least one) once a task has taken this long
    max_task_seconds: float = 60.0  # skip a task whose one run is expected to take longer
    max_activation_gib: float = 4.0  # skip torchlens when a forward's activations exceed it
    max_held_gib: float = 12.0  # skip a task that would keep more activations (hooks: 2 models)
    growth: bool = True
    startup_runs: Repetitions = Repetitions(warmup=1, runs=5)
    peak_sizes: tuple[tuple[int, int], ...] = ()  # sizes measured for peak memory only
    whole_process: bool = True  # `introspect diff` on MiniLM as a process, vs import + load
    whole_process_runs: Repetitions = Repetitions(warmup=1, runs=3)
    modes: bool = True  # generation (16/64/256 steps) and backward (tiny/base/large) ratios


@dataclass
class Estimator:
    """Expected seconds of a task: its time on the previous input of the same model, plus
    ``units`` forwards for every second the forward grew by (fixed costs stay fixed)."""

    previous: dict[tuple[str, str, str], tuple[float, float]] = field(default_factory=dict)

    def expect(self, model: str, key: tuple[str, str], units: float, forward_s: float) -> float:
        seen = self.previous.get((model, *key))
        if seen is None:
            return units * forward_s
        seconds, then_forward_s = seen
        return seconds + units * max(forward_s - then_forward_s, 0.0)

    def learn(self, model: str, key: tuple[str, str], seconds: float, forward_s: float) -> None:
        self.previous[(model, *key)] = (seconds, forward_s)


# A script that does only what any user of the model must: import torch and transformers,
# load the checkpoint `introspect diff` loads by default, and its tokenizer ({folder}).
IMPORT_AND_LOAD = (
    "import torch, transformers\n"
    "transformers.BertTokenizerFast.from_pretrained({folder!r})\n"
    "transformers.BertModel.from_pretrained({folder!r}).eval()\n"
)
WHOLE_DIFF = "start-up: introspect diff (minilm, whole process)"
IMPORT_LOAD = "start-up: python: import torch + transformers, load minilm"


def startup_rows(settings: Settings, progress: Progress) -> list[Measurement]:
    """``introspect --help`` in a new process, next to the interpreter starting alone;
    ``introspect diff`` on MiniLM as a whole process, next to importing and loading."""
    progress("start-up: introspect --help")
    repetitions = Repetitions(0, 1) if settings.quick else settings.startup_runs
    script = Path(sys.executable).with_name("introspect")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "introspect"]
    python = time_median(lambda: _run_quietly([sys.executable, "-c", "pass"]), repetitions)
    helped = time_median(lambda: _run_quietly([*command, "--help"]), repetitions)
    base = dict(section=STARTUP, model="", batch=0, seq=0, warmup=repetitions.warmup,
                runs=repetitions.runs)
    rows = [
        Measurement(task="start-up: python -c pass", tool="python", status=OK,
                    seconds=python.median, **base),
        Measurement(task="start-up: introspect --help", tool="introspect", status=OK,
                    seconds=helped.median, baseline="python -c pass",
                    baseline_seconds=python.median, ratio=ratio(helped.median, python.median),
                    **base),
    ]
    return rows + whole_process_rows(settings, command, progress)


def whole_process_rows(settings: Settings, command: list[str],
                       progress: Progress) -> list[Measurement]:
    """`introspect diff` on MiniLM as a whole process (the diff records both models as
    they run: no graph cache), as a ratio of a process that imports torch and
    transformers and loads MiniLM.

    Runs alternate between the commands, so that a change of the machine's load touches
    each of them alike; the note gives the CPU seconds (user + system) too, steadier than
    wall time on a shared machine.
    """
    tasks = (IMPORT_LOAD, WHOLE_DIFF)
    base = dict(section=STARTUP, model="", batch=0, seq=0)
    if not settings.whole_process or settings.quick:
        return [Measurement(task=t, tool="introspect" if "diff" in t else "python",
                            status=NOT_MEASURED, note="quick mode: not measured", **base)
                for t in tasks]
    progress("start-up: introspect diff on minilm, whole process (and import + load)")
    from introspect.models.load import minilm_folder

    script = IMPORT_AND_LOAD.format(folder=str(minilm_folder()))
    commands = {IMPORT_LOAD: [sys.executable, "-c", script],
                WHOLE_DIFF: [*command, "diff", "-q"]}
    walls: dict[str, list[float]] = {t: [] for t in tasks}
    cpus: dict[str, list[float]] = {t: [] for t in tasks}
    repetitions = settings.whole_process_runs
    for round_ in range(repetitions.total):
        for task in tasks:
            wall, cpu = _timed_process(commands[task], None)
            if round_ >= repetitions.warmup:
                walls[task].append(wall)
                cpus[task].append(cpu)
    wall_base = statistics.median(walls[IMPORT_LOAD])
    cpu_base = statistics.median(cpus[IMPORT_LOAD])
    rows = []
    for task in tasks:
        wall, cpu = statistics.median(walls[task]), statistics.median(cpus[task])
        compared = task != IMPORT_LOAD
        rows.append(Measurement(
            task=task, tool="introspect" if compared else "python", status=OK, seconds=wall,
            warmup=repetitions.warmup, runs=repetitions.runs,
            baseline="import + load" if compared else "",
            baseline_seconds=wall_base if compared else None,
            ratio=ratio(wall, wall_base) if compared else None,
            note=(f"CPU {cpu:.2f} s" + (f", {cpu / cpu_base:.2f}x the import + load's CPU"
                                        if compared else "")), **base))
    return rows


def _timed_process(command: list[str], environment: dict[str, str] | None) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one process run to its end."""
    import os
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, timeout=600,
                   env={**os.environ, **(environment or {})})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _run_quietly(command: list[str]) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=120)


@dataclass
class Outcome:
    """A task's outcome before the case's baseline is known."""

    work: Work
    status: str
    seconds: float | None = None
    repetitions: Repetitions = Repetitions(0, 0)
    output_bytes: int | None = None
    note: str = ""
    result: Any = None


def case_rows(spec: ModelSpec, hf: torch.nn.Module, scratch: torch.nn.Module, inputs: Inputs,
              settings: Settings, estimator: Estimator, progress: Progress) -> list[Measurement]:
    """Every row of one model on one input: times, ratios, memory, and what was skipped."""
    batch, seq = inputs.shape
    first = time_median(lambda: cases.forward(hf, inputs), Repetitions(0, 1))
    repetitions = repetitions_for(first.median, settings.quick)
    timed_again = replace(repetitions, warmup=0)  # the first run was the warm-up
    forward_times = [first.median]
    if repetitions.runs > 1:
        forward_times = list(time_median(lambda: cases.forward(hf, inputs), timed_again,
                                         settings.task_budget_s).times)
    scratch_forward = time_median(lambda: cases.forward(scratch, inputs), repetitions,
                                  settings.task_budget_s)
    forward_s = statistics.median(forward_times)

    outcomes = []
    graph = None
    for work in cases.introspect_work(hf, scratch, inputs) + attention_work(hf, inputs) + \
            alternatives.alternative_work(hf, scratch, inputs):
        held = work.held_activations * _activation_bytes(graph)
        if held > settings.max_held_gib * GIB:
            work.skip = (f"would keep ~{held / GIB:.1f} GiB of activations "
                         f"(> {settings.max_held_gib:g} GiB cap)")
        progress(f"  {work.tool}: {work.task}")
        outcome = time_work(spec, work, repetitions, forward_s, settings, estimator)
        outcomes.append(outcome)
        if work.task == cases.TRACE_SHAPES and work.tool == cases.TOOL:
            graph = outcome.result
    activations = _activation_bytes(graph)
    for outcome in outcomes:
        outcome.result = None  # free activations and graphs before the fresh processes run

    if repetitions.runs > 1:  # once more at the end: the baseline spans the whole case
        forward_times += time_median(lambda: cases.forward(hf, inputs), timed_again,
                                     settings.task_budget_s).times
    forward_s = statistics.median(forward_times)
    forwards = {1: forward_s, 2: forward_s + scratch_forward.median}
    rows = [_row(spec, batch, seq, cases.FORWARD, "HF", OK, forward_s,
                 Repetitions(1, len(forward_times)), note=_drift_note(forward_times)),
            _row(spec, batch, seq, cases.FORWARD, "introspect.scratch", OK,
                 scratch_forward.median, scratch_forward.repetitions)]
    for o in outcomes:
        base = forwards[o.work.baseline]
        rows.append(_row(spec, batch, seq, o.work.task, o.work.tool, o.status, o.seconds,
                         o.repetitions, baseline=_baseline_label(o.work.baseline),
                         baseline_seconds=base if o.seconds is not None else None,
                         output_bytes=o.output_bytes, note=o.note or o.work.note))
    rows += _derived_rows(spec, batch, seq, rows, forward_s)
    rows += _torchlens_rows(spec, batch, seq, graph, repetitions, forward_s, settings,
                            estimator, progress)
    rows += peak_rows(spec, batch, seq, settings, estimator, forward_s, progress,
                      activations=activations)
    return rows


def _activation_bytes(graph: Any) -> int:
    """Bytes of every tensor a forward produces, from a traced graph's records (0: unknown)."""
    return sum(r.nbytes for r in graph.records) if graph is not None else 0


def time_work(spec: ModelSpec, work: Work, repetitions: Repetitions, forward_s: float,
              settings: Settings, estimator: Estimator) -> Outcome:
    """Time ``work``, or say why it was skipped or how it failed."""
    if work.skip:
        status = SKIPPED if work.skip.startswith("would keep") else NOT_MEASURED
        return Outcome(work, status, note=work.skip)
    key = (work.task, work.tool)
    expected = estimator.expect(spec.name, key, work.units * work.baseline, forward_s)
    if expected > settings.max_task_seconds:
        return Outcome(work, SKIPPED, note=_too_long(expected, settings))
    try:
        if work.setup is not None:
            work.setup()
        timed = time_median(work.run, repetitions, settings.task_budget_s)
    except Exception as e:  # a tool that fails on BERT is a finding, not a crash
        return Outcome(work, FAILED, note=_first_line(e))
    finally:
        if work.teardown is not None:
            work.teardown()
    estimator.learn(spec.name, key, timed.median, forward_s)
    size = work.output_bytes(timed.result) if work.output_bytes is not None else None
    return Outcome(work, OK, timed.median, timed.repetitions, size, result=timed.result)


def _derived_rows(spec: ModelSpec, batch: int, seq: int, rows: list[Measurement],
                  forward_s: float) -> list[Measurement]:
    """introspect's "model to SVG": trace + shapes, then the drawing (sum of the medians)."""
    by_task = {(r.task, r.tool): r for r in rows}
    traced = by_task.get((cases.TRACE_SHAPES, cases.TOOL))
    derived = []
    for drawing, task in ((cases.DRAW_FOLDED, cases.TO_SVG_MODULES),
                          (cases.DRAW_FULL, cases.TO_SVG_FULL)):
        drawn = by_task.get((drawing, cases.TOOL))
        if traced is None or drawn is None or traced.seconds is None or drawn.seconds is None:
            derived.append(_row(spec, batch, seq, task, cases.TOOL, NOT_MEASURED,
                                note="trace + shapes or the drawing was not measured"))
            continue
        derived.append(_row(spec, batch, seq, task, cases.TOOL, OK,
                            traced.seconds + drawn.seconds,
                            Repetitions(drawn.warmup, drawn.runs), baseline="1 forward",
                            baseline_seconds=forward_s, output_bytes=drawn.output_bytes,
                            note="sum of the trace + shapes and drawing medians"))
    return derived


def _torchlens_rows(spec: ModelSpec, batch: int, seq: int, graph: Any, repetitions: Repetitions,
                    forward_s: float, settings: Settings, estimator: Estimator,
                    progress: Progress) -> list[Measurement]:
    tool = alternatives.TORCHLENS
    capture_tool = f"{tool} (every op)"
    tasks = ((cases.CAPTURE, capture_tool), (alternatives.TORCHLENS_DRAW, tool),
             (cases.TO_SVG_FULL, tool))

    def rows_saying(status: str, note: str) -> list[Measurement]:
        return [_row(spec, batch, seq, task, who, status, note=note) for task, who in tasks]

    if not alternatives.installed("torchlens"):
        return rows_saying(NOT_MEASURED, "not installed (pip install '.[bench]')")
    if graph is None:
        return rows_saying(SKIPPED, "its activations' size is unknown: trace + shapes did not run")
    activations = sum(r.nbytes for r in graph.records)
    if activations > settings.max_activation_gib * GIB:
        return rows_saying(SKIPPED, f"would keep ~{activations / GIB:.1f} GiB of activations "
                                    f"(> {settings.max_activation_gib:g} GiB cap)")
    key = ("torchlens", tool)
    expected = estimator.expect(spec.name, key, 6.0, forward_s)
    if expected > settings.max_task_seconds:
        return rows_saying(SKIPPED, _too_long(expected, settings))
    progress(f"  {tool} (new interpreter)")
    try:
        seconds = run_interpreter("benchmarks.jobs", "torchlens", spec.size, str(batch),
                                  str(seq), str(repetitions.warmup), str(repetitions.runs),
                                  str(settings.task_budget_s), threads=settings.threads,
                                  timeout=max(6 * settings.max_task_seconds, 300))
    except FreshProcessError as e:
        return rows_saying(FAILED, _first_line(e))
    estimator.learn(spec.name, key, seconds["one run"], forward_s)
    repetitions = Repetitions(int(seconds["warmup"]), int(seconds["runs"]))
    own_forward = seconds[cases.FORWARD]
    note = "ratio to a forward timed in torchlens's own interpreter, before torchlens ran"
    total = seconds[alternatives.TORCHLENS_TRACE] + seconds[alternatives.TORCHLENS_DRAW]
    return [
        _row(spec, batch, seq, cases.CAPTURE, capture_tool, OK,
             seconds[alternatives.TORCHLENS_TRACE], repetitions, baseline="1 forward",
             baseline_seconds=own_forward, note=note),
        _row(spec, batch, seq, alternatives.TORCHLENS_DRAW, tool, OK,
             seconds[alternatives.TORCHLENS_DRAW], repetitions, baseline="1 forward",
             baseline_seconds=own_forward, output_bytes=seconds["svg_bytes"], note=note),
        _row(spec, batch, seq, cases.TO_SVG_FULL, tool, OK, total, repetitions,
             baseline="1 forward", baseline_seconds=own_forward,
             output_bytes=seconds["svg_bytes"], note="sum of the trace and drawing medians; "
                                                     + note),
    ]


def peak_rows(spec: ModelSpec, batch: int, seq: int, settings: Settings, estimator: Estimator,
              forward_s: float, progress: Progress, section: str = GRID,
              tasks: tuple[tuple[str, str], ...] = tuple(jobs.PEAK_TASKS),
              activations: int = 0) -> list[Measurement]:
    """Peak resident set of a fresh process per task, as a ratio of the plain forward's.

    The plain forward comes first in ``tasks``: the others' ratios divide by its peak.
    """
    rows = []
    forward_peak = None
    for task, tool in tasks:
        label = f"peak memory: {task}"
        units = {cases.DIFF: 4.0}.get(task, 1.0) * (2 if "hooks" in tool else 1)
        key = (label, tool)
        held = (2 if "hooks" in tool else 0) * activations
        if held > settings.max_held_gib * GIB:
            rows.append(_row(spec, batch, seq, label, tool, SKIPPED, section=section,
                             note=f"would keep ~{held / GIB:.1f} GiB of activations "
                                  f"(> {settings.max_held_gib:g} GiB cap)"))
            continue
        expected = estimator.expect(spec.name, key, units, forward_s)
        if expected > settings.max_task_seconds:
            rows.append(_row(spec, batch, seq, label, tool, SKIPPED, section=section,
                             note=_too_long(expected, settings)))
            continue
        progress(f"  {tool}: {label} (fresh process)")
        start = time.perf_counter()
        try:
            done = run_fresh(jobs.peak_job, spec, batch, seq, task, tool,
                             threads=settings.threads)
        except FreshProcessError as e:
            rows.append(_row(spec, batch, seq, label, tool, FAILED, section=section,
                             note=_first_line(e)))
            continue
        estimator.learn(spec.name, key, time.perf_counter() - start, forward_s)
        if task == cases.FORWARD:
            forward_peak = done.peak_rss_mib
        rows.append(_row(spec, batch, seq, label, tool, OK, runs=Repetitions(0, 1),
                         section=section, peak_rss_mib=done.peak_rss_mib,
                         loaded_rss_mib=done.loaded_rss_mib, baseline="1 forward",
                         rss_ratio=ratio(done.peak_rss_mib, forward_peak)))
    return rows


NO_RUNS = Repetitions(0, 0)


def _row(spec: ModelSpec, batch: int, seq: int, task: str, tool: str, status: str,
         seconds: float | None = None, runs: Repetitions = NO_RUNS, *,
         section: str = GRID, baseline: str = "", baseline_seconds: float | None = None,
         **extra: Any) -> Measurement:
    return Measurement(section=section, model=spec.name, batch=batch, seq=seq, task=task,
                       tool=tool, status=status, seconds=seconds, warmup=runs.warmup,
                       runs=runs.runs, baseline=baseline, baseline_seconds=baseline_seconds,
                       ratio=ratio(seconds, baseline_seconds), **extra)


def _baseline_label(forwards: int) -> str:
    return "1 forward" if forwards == 1 else "HF + scratch forwards"


def _drift_note(times: list[float]) -> str:
    if len(times) < 2:
        return ""
    return f"runs from {min(times):.3g} to {max(times):.3g} s (start and end of the case)"


def _too_long(expected: float, settings: Settings) -> str:
    return (f"one run would take ~{expected:.0f} s (> {settings.max_task_seconds:g} s cap), "
            "from this model's smaller input")


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:200]
