"""Medians after a warm-up, how many runs a case can afford, and ratios.

Absolute times drift on a shared machine; a ratio of two medians taken minutes apart in
the same process drifts much less, so the report leads with ratios.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Repetitions:
    """Untimed warm-up runs, then timed runs whose median is reported."""

    warmup: int
    runs: int

    @property
    def total(self) -> int:
        return self.warmup + self.runs


QUICK = Repetitions(warmup=0, runs=1)  # the smoke run: one of everything
SMALL = Repetitions(warmup=1, runs=5)  # a forward under SMALL_BELOW seconds
MEDIUM = Repetitions(warmup=1, runs=3)  # under MEDIUM_BELOW seconds
LARGE = Repetitions(warmup=0, runs=1)  # above: every tool is already warm from smaller cases
SMALL_BELOW = 0.5
MEDIUM_BELOW = 4.0


def repetitions_for(forward_seconds: float, quick: bool = False) -> Repetitions:
    """How many runs a case gets, from the time of one plain forward pass on its input.

    Cases run from the smallest to the largest, so by the time a forward takes seconds,
    every tool has run (and paid its first-call costs) on smaller inputs already.
    """
    if quick:
        return QUICK
    if forward_seconds < SMALL_BELOW:
        return SMALL
    if forward_seconds < MEDIUM_BELOW:
        return MEDIUM
    return LARGE


@dataclass(frozen=True)
class Timed:
    """The median of the timed runs, every run's time, and the last run's result."""

    median: float
    times: tuple[float, ...]
    result: Any
    warmup: int  # warm-up runs actually made

    @property
    def repetitions(self) -> Repetitions:
        return Repetitions(self.warmup, len(self.times))


def time_median(work: Callable[[], Any], repetitions: Repetitions,
                budget_s: float | None = None) -> Timed:
    """Run ``work`` ``warmup`` times untimed, then ``runs`` times timed; keep the median.

    With ``budget_s``, stop early once another run would take the time spent past the
    budget: a slow task gets its warm-up (when it fits) and one timed run, and the
    returned ``repetitions`` say what was done.
    """
    start = time.perf_counter()
    result = None
    warmed = 0
    for _ in range(repetitions.warmup):
        before = time.perf_counter()
        result = work()
        result = None  # let the warm-up's output go before the timed runs
        warmed += 1
        if _over(budget_s, start, time.perf_counter() - before):
            break
    times: list[float] = []
    for _ in range(max(repetitions.runs, 1)):
        before = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - before)
        if _over(budget_s, start, times[-1]):
            break
    return Timed(statistics.median(times), tuple(times), result, warmed)


def median_time(work: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """The median seconds of ``repeat`` runs of ``work``, and what its last run returned
    (for the stand-alone ``*_bench.py`` scripts, which time one thing a few times)."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _over(budget_s: float | None, start: float, last: float) -> bool:
    """Whether one more run like the last would end past the budget."""
    return budget_s is not None and time.perf_counter() - start + last > budget_s


def ratio(value: float | None, baseline: float | None) -> float | None:
    """``value / baseline``, or None when either is missing or the baseline is zero."""
    if value is None or not baseline:
        return None
    return value / baseline


@dataclass
class Work:
    """A task to time: what it is, who does it, and what its ratio divides by.

    ``baseline`` counts plain forward passes (1: the HF model; 2: HF and scratch, for the
    comparisons of two models). ``units`` is the expected cost in those forwards, used to
    skip a task that would not fit the time cap until a smaller case has measured it.
    """

    task: str
    tool: str
    run: Callable[[], Any]
    baseline: int = 1
    units: float = 1.0
    setup: Callable[[], Any] | None = None  # untimed, before the runs
    teardown: Callable[[], Any] | None = None  # untimed, after them: free what setup held
    output_bytes: Callable[[Any], int] | None = None  # size of the result (SVG bytes)
    note: str = ""
    skip: str = ""  # a reason not to run it at all (too much memory, a missing package)
    held_activations: int = 0  # forwards' worth of activations it keeps at once (hooks: 2)
