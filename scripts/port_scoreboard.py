"""Score ``introspect.diff`` on independent BERT ports: every style, correct and faulty.

Run:  python scripts/port_scoreboard.py [--quick] [--csv FILE] [--style S]... [--fault F]...

Each case (style x {correct, each fault} x model {bert-tiny, minilm}) goes through
``introspect.diff(reference, port, inputs)`` on the ports' batch (the tutorial's padded
pair and a two-segment pair) and is judged as ``tests/diff/test_independent_ports.py``
judges it: verdict, first divergence in the right layer, blamed on a computing op where
the fault lives (never a layout op), FAIL rows only in the fault's layer, the right hint.
The totals are the figures issue 10's closing note asks for. ``--quick``: bert-tiny only.
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.diff.test_independent_ports import (  # noqa: E402
    CRITERIA,
    MINILM_LAYER,
    STYLES,
    TINY_LAYER,
    Case,
    all_faults,
    expectation,
    judge,
    run_case,
)

COLUMNS = ("case", "exp_layer", "exp_module", "exp_hint", "verdict", "got_layer", "got_op",
           "layout_op", "got_module", "candidate_node", "fail_layers", "hints", "coverage",
           *(f"ok_{c}" for c in CRITERIA), "seconds")


def score(case: Case) -> dict[str, object]:
    """One row of the scoreboard (errors raised by diff are rows too)."""
    want = expectation(case)
    row: dict[str, object] = {
        "case": case.id,
        "exp_layer": want.layer if want else "-",
        "exp_module": want.module if want else "-",
        "exp_hint": want.hint if want else "-",
    }
    start = time.perf_counter()
    try:
        j = judge(case, run_case(case))
    except Exception as e:  # a diff that cannot run at all is a result to report
        row.update(verdict=f"ERROR {type(e).__name__}: {str(e)[:80]}", seconds=0.0)
        row.update({f"ok_{c}": False for c in CRITERIA if want or c == "verdict"})
        return row
    row.update(
        verdict="pass" if j.passed else "FAIL", got_layer=j.layer, got_op=j.op,
        layout_op="yes" if j.layout else "", got_module=j.module,
        candidate_node=j.candidate_node, fail_layers=" ".join(j.failing_layers),
        hints=" | ".join(j.hints), coverage=j.coverage,
        seconds=round(time.perf_counter() - start, 1),
    )
    row.update({f"ok_{c}": v for c, v in j.ok.items()})
    return row


def totals(rows: list[dict[str, object]]) -> list[str]:
    """The closing note's figures: false failures, localised faults, hints, coverage."""
    correct = [r for r in rows if r["exp_layer"] == "-"]
    faults = [r for r in rows if r["exp_layer"] != "-"]

    def count(rs, *keys):
        return sum(all(r.get(f"ok_{k}") for k in keys) for r in rs)

    wrong_hints = sum(1 for r in faults if r.get("hints") and not r.get("ok_hint"))
    wrong_hints += sum(1 for r in correct if r.get("hints"))
    lines = [
        f"false failures (correct ports failing): {len(correct) - count(correct, 'verdict')}"
        f" of {len(correct)}  (goal 0)",
        f"faults detected (parity fails): {count(faults, 'verdict')} of {len(faults)}",
        f"faults localised to the right layer: {count(faults, 'layer')} of {len(faults)}",
        f"faults localised to the right layer and op (computing, not layout): "
        f"{count(faults, 'layer', 'op')} of {len(faults)}",
        f"faults blamed on a layout op: {sum(1 for r in faults if r.get('layout_op'))}",
        f"faults whose FAIL rows stay in their layer: {count(faults, 'local')} of {len(faults)}",
        f"hints right: {count(faults, 'hint')} of {len(faults)}",
        f"hints wrong (a hint, none right; or any hint on a correct port): {wrong_hints}"
        "  (goal 0)",
        f"all criteria right: {count(faults, *CRITERIA)} of {len(faults)} faults",
    ]
    for style in sorted({str(r["case"]).split("-")[0] for r in rows}):
        for model in ("bert-tiny", "minilm"):
            mine = [r for r in rows if str(r["case"]).startswith(f"{style}-")
                    and str(r["case"]).endswith(model)]
            cov = [float(r["coverage"]) for r in mine if r.get("coverage") is not None]
            ok = [float(r["coverage"]) for r in mine if r["exp_layer"] == "-"
                  and r.get("coverage") is not None]
            if mine:
                lines.append(f"alignment coverage {style} on {model}: correct port "
                             f"{ok[0] if ok else float('nan'):.0%}, over all its cases "
                             f"{statistics.mean(cov) if cov else float('nan'):.0%}")
    return lines


def table(rows: list[dict[str, object]]) -> str:
    shown = ("case", "exp_layer", "verdict", "got_layer", "got_op", "layout_op",
             "got_module", "fail_layers", "coverage", *(f"ok_{c}" for c in CRITERIA), "hints")

    def cell(r, k):
        v = r.get(k, "")
        if k.startswith("ok_"):
            return "" if v == "" or v is None else ("OK" if v else "WRONG")
        if k == "coverage" and isinstance(v, float):
            return f"{v:.0%}"
        return "" if v is None else str(v)

    cells = [[cell(r, k) for k in shown] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(shown[:-1])]
    out = ["  ".join(k.ljust(w) for k, w in zip(shown[:-1], widths, strict=True)) + "  hints"]
    for c in cells:
        padded = (v.ljust(w) for v, w in zip(c[:-1], widths, strict=True))
        out.append("  ".join(padded) + "  " + c[-1])
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="bert-tiny only")
    parser.add_argument("--csv", help="also write the rows to this CSV file")
    parser.add_argument("--style", action="append", choices=STYLES, help="only this style")
    parser.add_argument("--fault", action="append", help="only this fault ('correct' too)")
    args = parser.parse_args(argv)
    models = ("bert-tiny",) if args.quick else ("bert-tiny", "minilm")
    rows = []
    for model in models:
        for style in args.style or STYLES:
            for fault in (None, *all_faults(style)):
                if args.fault and (fault or "correct") not in args.fault:
                    continue
                rows.append(score(Case(style, fault, model)))
                print(f"{rows[-1]['case']}: {rows[-1]['verdict']}", file=sys.stderr)
    print(f"faults in encoder layer {TINY_LAYER} on bert-tiny, {MINILM_LAYER} on minilm")
    print(table(rows))
    print()
    print("\n".join(totals(rows)))
    if args.csv:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        Path(args.csv).write_text(buffer.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
