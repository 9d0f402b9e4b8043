"""Time the drawings the issue sets targets for (a measurement, not a test).

Targets (issue 3): folded BERT-base drawing, trace included, under 0.5 s; full BERT-large
drawing under 5 s; folded SVG under 100 KB. Model loading is not timed (it is the same
for every command). Each figure is the median of --repeat runs.

Usage:
    .venv/bin/python -m benchmarks.draw_bench [--repeat 3]
"""

from __future__ import annotations

import argparse

from benchmarks.timing import median_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import introspect
    from introspect.render import draw_graph, render_bytes

    for name, options, target in (("bert-base", {}, 0.5), ("bert-large", {"depth": "full"}, 5.0)):
        loaded = introspect.load_model(name, head="sequence-classification")
        inputs = introspect.tokenize(loaded.tokenizer)
        graph = introspect.trace(loaded.model, inputs)
        model = loaded.model
        trace_s, _ = median_time(lambda m=model, i=inputs: introspect.trace(m, i), args.repeat)
        plan_s, digraph = median_time(lambda g=graph, o=options: draw_graph(g, **o), args.repeat)
        svg_s, svg = median_time(lambda d=digraph: render_bytes(d, "svg"), args.repeat)
        total = trace_s + plan_s + svg_s
        view = "full" if options else "folded"
        print(
            f"{name} {view}: trace {trace_s:.3f} s + draw_graph {plan_s:.3f} s + "
            f"dot -Tsvg {svg_s:.3f} s = {total:.3f} s (target {target} s); "
            f"SVG {len(svg) / 1000:.1f} KB, {len(graph.records)} records"
        )


if __name__ == "__main__":
    main()
