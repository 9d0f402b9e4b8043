"""Benchmark introspect next to torchview, torchlens, torch.export and forward hooks.

Writes benchmarks.md, benchmarks.csv and benchmarks_growth.png into --out. A full run
(BERT-tiny, -base and -large at 2x9, 8x128 and 8x512, and the growth curves) takes
about half an hour on two cores; --quick runs one of everything on BERT-tiny at 2x9.

    python -m benchmarks [--quick] [--models bert-tiny bert-base] [--out reports/]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="bert-tiny at 2x9, one run of everything (the smoke test)")
    parser.add_argument("--models", nargs="+", choices=("bert-tiny", "bert-base", "bert-large"),
                        help="models of the grid (default: all three; --quick: bert-tiny)")
    parser.add_argument("--out", type=Path, default=Path("reports"),
                        help="folder for benchmarks.md, .csv and the plot (default: reports/)")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch threads, here and in every fresh process (default: 2)")
    parser.add_argument("--task-budget", type=float, default=20.0,
                        help="seconds after which a task stops repeating (default: 20)")
    parser.add_argument("--max-task-seconds", type=float, default=60.0,
                        help="skip a task whose one run is expected to take longer (default: 60)")
    parser.add_argument("--max-activation-gib", type=float, default=4.0,
                        help="skip torchlens above this many GiB of activations (default: 4)")
    parser.add_argument("--sizes", nargs="+", type=_size, metavar="BxS",
                        help="input sizes of the grid (default: 2x9 8x128 8x512)")
    parser.add_argument("--peak-sizes", nargs="+", type=_size, default=(), metavar="BxS",
                        help="sizes measured for peak memory only (forward and diff)")
    parser.add_argument("--no-growth", action="store_true", help="skip the growth curves")
    parser.add_argument("--no-modes", action="store_true",
                        help="skip the generation and backward modes (benchmarks.modes)")
    parser.add_argument("--no-whole-process", action="store_true",
                        help="skip `introspect diff` on MiniLM as a whole process")
    parser.add_argument("--resume", type=Path, metavar="CSV",
                        help="keep the cases of a cut-short run's benchmarks.partial.csv")
    args = parser.parse_args(argv)
    if not args.out.is_dir():
        if not args.out.parent.is_dir():
            parser.error(f"cannot create --out {str(args.out)!r}: its parent does not exist")
        args.out.mkdir()

    from benchmarks.alternatives import installed
    from benchmarks.harness import Settings
    from benchmarks.machine import describe_machine
    from benchmarks.report import PLOT_NAME, read_csv, render_csv, write_reports
    from benchmarks.run import run_benchmarks
    from introspect.files import write_atomic

    quick = dict(models=("bert-tiny",), sizes=((2, 9),)) if args.quick else {}
    if args.models:
        quick["models"] = tuple(args.models)
    if args.sizes:
        quick["sizes"] = tuple(args.sizes)
    settings = Settings(quick=args.quick, threads=args.threads, task_budget_s=args.task_budget,
                        max_task_seconds=args.max_task_seconds,
                        max_activation_gib=args.max_activation_gib, growth=not args.no_growth,
                        peak_sizes=tuple(args.peak_sizes),
                        whole_process=not args.no_whole_process, modes=not args.no_modes,
                        **quick)
    machine = describe_machine(args.threads)
    started = time.perf_counter()

    def progress(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f} s] {message}", file=sys.stderr, flush=True)

    partial = args.out / "benchmarks.partial.csv"  # rows so far; removed once the report is written
    resumed = read_csv(args.resume) if args.resume else []
    rows = run_benchmarks(settings, progress,
                          lambda so_far: write_atomic(partial, render_csv(so_far)), resumed)
    plot = None
    if settings.growth and installed("matplotlib"):
        from benchmarks.growth import plot_growth

        plot = plot_growth(rows, args.out / PLOT_NAME)
    elif settings.growth:
        progress("no growth plot: matplotlib is not installed (pip install '.[bench]')")
    elapsed = time.perf_counter() - started
    settings_text = (
        f"This run took {elapsed / 60:.1f} minutes"
        + (f", keeping {len(resumed)} rows of an earlier run of the same harness (rows are "
           "never re-measured on resume; the machine line above describes the last run's "
           "start, and earlier rows were taken under the load of other jobs)"
           if resumed else "")
        + f". A task stops repeating once its runs "
        f"have taken {settings.task_budget_s:g} s (after at least one timed run); a task whose "
        f"one run is expected to exceed {settings.max_task_seconds:g} s is skipped, and "
        f"torchlens where a forward's activations exceed {settings.max_activation_gib:g} GiB; "
        "the rows say so, and the CSV has every row's warm-up and run counts."
        + (" Quick mode: one run of everything." if settings.quick else
           " Repetitions by the plain forward's time: under 0.5 s, 1 warm-up + 5 runs; "
           "under 4 s, 1 + 3; above, 1 run (every tool has run on smaller inputs already).")
    )
    markdown, table = write_reports(rows, machine, args.out, plot, settings_text)
    partial.unlink(missing_ok=True)
    progress(f"wrote {markdown}, {table}" + (f", {plot}" if plot else ""))
    return 0


def _size(text: str) -> tuple[int, int]:
    """"8x128" -> (8, 128)."""
    try:
        batch, seq = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size BxS: {text!r}") from None
    return batch, seq


if __name__ == "__main__":
    sys.exit(main())
