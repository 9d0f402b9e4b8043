"""Draw BERT's tensor flow to SVG: the folded overview, and one layer opened up.

Run:  python examples/draw_to_svg.py [OUTPUT_FOLDER]
"""

from __future__ import annotations

import sys
from pathlib import Path

import introspect
from introspect.render import draw_graph, write_drawing


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else Path("reports")
    loaded = introspect.load_model("minilm", head="sequence-classification")
    graph = introspect.trace(loaded.model, introspect.tokenize(loaded.tokenizer))

    overview = draw_graph(graph, depth=1)  # big blocks, the six layers folded as ×6
    first_and_last = draw_graph(graph, expand=[0, -1])  # layers 0 and 5 open, 1-4 folded
    for name, digraph in (("overview", overview), ("layers_0_and_5", first_and_last)):
        path = write_drawing(digraph, folder / f"minilm_{name}.svg")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
