"""The report: ``benchmarks.md`` (tables a person reads) and ``benchmarks.csv`` (every row).

Tables put introspect and the alternatives side by side per model, one column per input
size; a cell holds the median time and its ratio to the plain forward measured in the
same run. Rows where introspect loses are shown like the others, and the "ahead and
behind" table says where it wins and where it loses.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from benchmarks import alternatives, cases
from benchmarks.attention_bench import ATTENTION_MAPS
from benchmarks.machine import Machine
from benchmarks.records import GRID, GROWTH, OK, SKIPPED, STARTUP, Measurement
from introspect.files import write_atomic

PLOT_NAME = "benchmarks_growth.png"


@dataclass(frozen=True)
class Target:
    """A target an issue set for BERT-base, and how to read it from the rows.

    With ``versus_task``, the figure is this row's seconds over the seconds of that row
    (same model and input), e.g. a cache hit over the full trace.
    """

    text: str
    batch: int
    seq: int
    task: str
    tool: str
    field: str  # "seconds", "ratio" or "rss_ratio"
    limit: float
    versus_task: str = ""
    versus_tool: str = ""
    model: str = "bert-base"


_STARTUP_DIFF = "start-up: introspect diff (minilm, whole process)"

TARGETS = (
    Target("trace + shapes, 2 x 9: at most 1.5x one plain forward", 2, 9, cases.TRACE_SHAPES,
           cases.TOOL, "ratio", 1.5),
    Target("trace + shapes, 8 x 128: at most 1.1x one plain forward", 8, 128,
           cases.TRACE_SHAPES, cases.TOOL, "ratio", 1.1),
    Target("folded drawing with its trace, 2 x 9: faster than torchview depth 3", 2, 9,
           cases.TO_SVG_MODULES, cases.TOOL, "seconds", 1.0,
           versus_task=cases.TO_SVG_MODULES, versus_tool=f"{alternatives.TORCHVIEW} depth 3"),
    Target("diff, 8 x 128: at most 1.2x the two plain forwards (HF + scratch)", 8, 128,
           cases.DIFF, cases.TOOL, "ratio", 1.2),
    Target("diff, 2 x 9: at most 4x the two plain forwards", 2, 9, cases.DIFF, cases.TOOL,
           "ratio", 4.0),
    Target("cache hit (in memory), 2 x 9: at most 0.1x the full trace of before", 2, 9,
           cases.CACHE_MEMORY, cases.TOOL, "seconds", 0.1, versus_task=cases.TRACE_FULL,
           versus_tool=cases.TOOL),
    Target("diff peak memory, 8 x 512: at most 1.5x one plain forward's (fresh processes)", 8,
           512, f"peak memory: {cases.DIFF}", cases.TOOL, "rss_ratio", 1.5),
    Target("`introspect diff` on MiniLM, whole process: at most 1.3x import + load", 0, 0,
           _STARTUP_DIFF, "introspect", "ratio", 1.3, model=""),
    Target("attention maps, 8 x 128: at most 1.3x one plain forward", 8, 128,
           ATTENTION_MAPS, cases.TOOL, "ratio", 1.3),
    Target("`introspect --help` under 0.3 s", 0, 0, "start-up: introspect --help", "introspect",
           "seconds", 0.3, model=""),
)
TARGET_MODEL = "bert-base"

# Where introspect and an alternative do the same job: (question, task, ours, theirs).
COMPARISONS = (
    ("fx graph with shapes", cases.TRACE_SHAPES, cases.TOOL, alternatives.EXPORT, "ratio"),
    ("shapes of every module", cases.TRACE_SHAPES, cases.TOOL, alternatives.TORCHINFO, "ratio"),
    ("model to SVG, module level", cases.TO_SVG_MODULES, cases.TOOL,
     f"{alternatives.TORCHVIEW} depth 3", "ratio"),
    ("model to SVG, every op", cases.TO_SVG_FULL, cases.TOOL,
     f"{alternatives.TORCHVIEW} full depth", "ratio"),
    ("model to SVG, every op", cases.TO_SVG_FULL, cases.TOOL, alternatives.TORCHLENS, "ratio"),
    ("compare HF with scratch, time", cases.DIFF, cases.TOOL,
     f"{alternatives.HOOKS} (by module name)", "ratio"),
    ("compare HF with scratch, peak memory", f"peak memory: {cases.DIFF}", cases.TOOL,
     f"{alternatives.HOOKS} (by module name)", "rss_ratio"),
)


def write_reports(rows: Sequence[Measurement], machine: Machine, out: str | Path,
                  plot: Path | None, settings_text: str) -> tuple[Path, Path]:
    """Write ``benchmarks.md`` and ``benchmarks.csv`` under ``out``; return their paths."""
    folder = Path(out)
    markdown = write_atomic(folder / "benchmarks.md",
                            render_markdown(rows, machine, plot, settings_text))
    table = write_atomic(folder / "benchmarks.csv", render_csv(rows))
    return markdown, table


def render_csv(rows: Sequence[Measurement]) -> str:
    """Every row, every field; floats to six significant digits."""
    buffer = io.StringIO()
    names = [f.name for f in fields(Measurement)]
    writer = csv.DictWriter(buffer, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v)
                         for k, v in asdict(row).items()})
    return buffer.getvalue()


def read_csv(path: str | Path) -> list[Measurement]:
    """Rows written by ``render_csv`` (a partial run's, to resume it), typed again."""
    types = {f.name: str(f.type) for f in fields(Measurement)}
    rows = []
    with Path(path).open(newline="") as handle:
        for raw in csv.DictReader(handle):
            values: dict[str, object] = {}
            for name, text in raw.items():
                kind = types[name]
                if kind == "int":
                    values[name] = int(text)
                elif kind.startswith(("float", "int |")):
                    number = float if kind.startswith("float") else int
                    values[name] = number(text) if text else None
                else:
                    values[name] = text
            rows.append(Measurement(**values))  # type: ignore[arg-type]
    return rows


def render_markdown(rows: Sequence[Measurement], machine: Machine, plot: Path | None,
                    settings_text: str) -> str:
    """The whole report as Markdown."""
    parts = [
        "# Benchmarks\n",
        machine_sentence(machine) + "\n",
        "How to read it: a cell is the median wall time, then its ratio to a plain forward "
        "pass of the same HF model on the same input, timed in the same process during the "
        "same case (for the diff and the hand-written comparison, to the two plain forwards, "
        "HF and scratch). Absolute times drift on a shared machine; the ratios are the "
        "figures to compare. Memory is the peak resident set (VmHWM) of a fresh process that "
        "loads the model and runs the one task, as a ratio of the same for a plain forward. "
        f"{settings_text}\n",
        "## Targets (BERT-base)\n",
        targets_table(rows),
    ]
    models = list(dict.fromkeys(r.model for r in rows if r.section == GRID))
    for model in models:
        parts += [f"## {model}\n", grid_table([r for r in rows if r.section == GRID
                                               and r.model == model])]
    parts += ["## Ahead and behind\n",
              "Each cell compares the two ratios (or memory ratios) of the same case: "
              "*ahead 2.0x* means introspect takes half the alternative's time; *behind 2.0x* "
              "twice. introspect's diff aligns the graphs on weights and measures a local and "
              "a propagated error per node; the hand-written hook comparison only pairs "
              "modules by name, which works here because the scratch BERT uses HF's names.\n",
              comparison_table(rows)]
    startup = [r for r in rows if r.section == STARTUP]
    if startup:
        parts += ["## Start-up\n", startup_table(startup)]
    growth = [r for r in rows if r.section == GROWTH]
    if growth:
        parts += ["## Cost growth\n", growth_table(growth)]
        if plot is not None:
            parts.append(f"![time and memory growth]({plot.name})\n")
    from benchmarks.modes import MODES, modes_table

    modes = [r for r in rows if r.section == MODES]
    if modes:
        parts += ["## Generation and backward modes\n",
                  "Each ratio is the diff over the two models' own work (greedy generation "
                  "through their caches; forward + backward on the diff's loss), both run in "
                  "the same process on one thread, in CPU time (`python -m benchmarks.modes`)."
                  "\n", modes_table(modes)]
    parts += ["## Skipped, failed and not measured\n", skipped_list(rows)]
    parts += ["## Reproduce\n",
              "```sh\nmake bench                        # the full grid: reports/benchmarks.*\n"
              ".venv/bin/python -m benchmarks --quick --out /tmp/bench   # one of everything, "
              "bert-tiny\n```\n"]
    return "\n".join(parts)


def machine_sentence(machine: Machine) -> str:
    """The sentence a README quotes under the table."""
    return (f"Taken on {machine.started} on a {machine.cores}-core {machine.cpu} with "
            f"{machine.memory_gib:.0f} GiB of memory (load average {machine.load_average} "
            f"at the start: the machine was shared), Python {machine.python}, "
            f"torch {machine.torch} on {machine.threads} threads, transformers "
            f"{machine.transformers}, {machine.graphviz}, introspect at {machine.commit}.")


def targets_table(rows: Sequence[Measurement]) -> str:
    lines = ["| target | measured | verdict |", "| --- | --- | --- |"]
    for target in TARGETS:
        row = _find(rows, target.model, target.batch, target.seq, target.task, target.tool)
        value = getattr(row, target.field) if row is not None else None
        if target.versus_task:
            versus = _find(rows, target.model, target.batch, target.seq, target.versus_task,
                           target.versus_tool)
            value = (value / versus.seconds if value is not None and versus is not None
                     and versus.seconds else None)
        if value is None:
            reason = row.note if row is not None and row.note else "not in this run"
            lines.append(f"| {target.text} | not measured | {reason} |")
            continue
        if target.versus_task:
            assert row is not None and row.seconds is not None
            lines.append(f"| {target.text} | {_seconds(row.seconds)}, {_ratio(value)} of "
                         f"{target.versus_tool}'s {target.versus_task} | "
                         f"{'met' if value <= target.limit else '**missed**'} |")
            continue
        shown = _seconds(value) if target.field == "seconds" else _ratio(value)
        if target.task == cases.TO_SVG_MODULES:
            drawn = _find(rows, TARGET_MODEL, 2, 9, cases.DRAW_FOLDED, cases.TOOL)
            if drawn is not None and drawn.seconds is not None:
                shown += f" (drawing alone {_seconds(drawn.seconds)})"
        if target.field == "seconds" and row is not None and row.ratio is not None:
            shown += f"; {_ratio(row.ratio)} of {row.baseline}"
        if row is not None and row.note and row.section == STARTUP:
            shown += f" ({row.note})"
        verdict = "met" if value <= target.limit else "**missed**"
        lines.append(f"| {target.text} | {shown} | {verdict} |")
    return "\n".join(lines) + "\n"


def grid_table(rows: Sequence[Measurement]) -> str:
    sizes = list(dict.fromkeys((r.batch, r.seq) for r in rows))
    header = "| task | tool | " + " | ".join(f"{b} x {s}" for b, s in sizes) + " |"
    lines = [header, "| --- | --- |" + " --- |" * len(sizes)]
    model = rows[0].model if rows else ""
    for task, tool in dict.fromkeys((r.task, r.tool) for r in rows):
        cells = [_cell(_find(rows, model, b, s, task, tool)) for b, s in sizes]
        lines.append(f"| {task} | {tool} | " + " | ".join(cells) + " |")
    runs = sorted({(r.warmup, r.runs, r.batch, r.seq) for r in rows
                   if r.status == OK and r.task == cases.FORWARD and r.tool == "HF"})
    policy = "; ".join(f"{b} x {s}: forward {w} warm-up + {n} runs" for w, n, b, s in runs)
    return "\n".join(lines) + f"\n\nRuns per case ({policy}); every task in a case gets the " \
        "case's repetitions, fewer once it has used its time budget (the CSV's warmup and " \
        "runs columns say what each row had).\n"


def comparison_table(rows: Sequence[Measurement]) -> str:
    grid = [r for r in rows if r.section == GRID]
    sizes = list(dict.fromkeys((r.batch, r.seq) for r in grid))
    models = list(dict.fromkeys(r.model for r in grid))
    lines = ["| job | alternative | model | " + " | ".join(f"{b} x {s}" for b, s in sizes) + " |",
             "| --- | --- | --- |" + " --- |" * len(sizes)]
    for question, task, ours, theirs, field in COMPARISONS:
        for model in models:
            cells = []
            for b, s in sizes:
                mine = _find(grid, model, b, s, task, ours)
                other = _find_tool(grid, model, b, s, task, theirs)
                cells.append(_verdict(mine, other, field))
            lines.append(f"| {question} | {theirs} | {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def startup_table(rows: Sequence[Measurement]) -> str:
    lines = ["| command | median | ratio | note |", "| --- | --- | --- | --- |"]
    for r in rows:
        shown = _ratio(r.ratio) + f" of `{r.baseline}`" if r.ratio is not None else ""
        runs = f" ({r.warmup} warm-up + {r.runs} runs)" if r.status == OK else r.status
        lines.append(f"| `{r.task.removeprefix('start-up: ')}` | "
                     f"{_seconds(r.seconds)}{runs} | {shown} | {r.note} |")
    return "\n".join(lines) + "\n"


def growth_table(rows: Sequence[Measurement]) -> str:
    points = list(dict.fromkeys((r.model, r.batch, r.seq) for r in rows))
    columns: list[tuple[str, Callable[[Measurement | None], str]]] = [
        ("forward", lambda r: _seconds(r.seconds) if r and r.seconds is not None else "-"),
        ("trace + shapes", lambda r: _cell(r)),
        ("diff", lambda r: _cell(r)),
        ("peak: forward", lambda r: _memory(r)),
        ("peak: trace + shapes", lambda r: _memory(r)),
        ("peak: diff", lambda r: _memory(r)),
    ]
    keys = [(cases.FORWARD, "HF"), (cases.TRACE_SHAPES, cases.TOOL), (cases.DIFF, cases.TOOL),
            (f"peak memory: {cases.FORWARD}", "HF"),
            (f"peak memory: {cases.TRACE_SHAPES}", cases.TOOL),
            (f"peak memory: {cases.DIFF}", cases.TOOL)]
    lines = ["| model | B x S | " + " | ".join(name for name, _ in columns) + " |",
             "| --- | --- |" + " --- |" * len(columns)]
    for model, b, s in points:
        cells = [show(_find(rows, model, b, s, task, tool))
                 for (_, show), (task, tool) in zip(columns, keys, strict=True)]
        lines.append(f"| {model} | {b} x {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def skipped_list(rows: Sequence[Measurement]) -> str:
    missing = [r for r in rows if r.status != OK]
    if not missing:
        return "Nothing: every measurement ran.\n"
    return "\n".join(f"- {r.model or '-'} {r.batch} x {r.seq}, {r.task} ({r.tool}): "
                     f"{r.status}: {r.note}" for r in missing) + "\n"


def _find(rows: Sequence[Measurement], model: str, batch: int, seq: int, task: str,
          tool: str) -> Measurement | None:
    for r in rows:
        if (r.model, r.batch, r.seq, r.task, r.tool) == (model, batch, seq, task, tool):
            return r
    return None


def _find_tool(rows: Sequence[Measurement], model: str, batch: int, seq: int, task: str,
               tool: str) -> Measurement | None:
    """Like ``_find`` but a tool may carry a suffix (torchlens's rows say "(every op)")."""
    exact = _find(rows, model, batch, seq, task, tool)
    if exact is not None:
        return exact
    for r in rows:
        if (r.model, r.batch, r.seq, r.task) == (model, batch, seq, task) \
                and r.tool.startswith(tool):
            return r
    return None


def _verdict(mine: Measurement | None, other: Measurement | None, field: str) -> str:
    a = getattr(mine, field) if mine is not None else None
    b = getattr(other, field) if other is not None else None
    if a is None or b is None or a <= 0 or b <= 0:
        return "-"
    if a <= b:
        return f"ahead {b / a:.1f}x"
    return f"**behind {a / b:.1f}x**"


def _cell(r: Measurement | None) -> str:
    if r is None:
        return ""
    if r.status != OK:
        return "skipped" if r.status == SKIPPED else r.status
    if r.peak_rss_mib is not None:
        return _memory(r)
    text = _seconds(r.seconds)
    if r.ratio is not None:
        text += f" · {_ratio(r.ratio)}"
    if r.output_bytes is not None:
        text += f" · {r.output_bytes / 1000:.0f} kB"
    return text


def _memory(r: Measurement | None) -> str:
    if r is None or r.peak_rss_mib is None:
        return "-" if r is None else ("skipped" if r.status == SKIPPED else r.status)
    text = f"{r.peak_rss_mib:,.0f} MiB"
    if r.rss_ratio is not None:
        text += f" · {_ratio(r.rss_ratio)}"
    return text


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 0.01:
        return f"{value * 1000:.1f} ms"
    if value < 10:
        return f"{value:.3g} s"
    return f"{value:.1f} s"


def _ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if value < 10 else f"{value:.0f}x"
