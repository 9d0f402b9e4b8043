"""Trace the embedded MiniLM and print the nodes of one encoder layer as a table.

Run:  python examples/trace_to_table.py [OUTPUT.csv]
"""

from __future__ import annotations

import sys

import introspect


def main(argv: list[str]) -> int:
    loaded = introspect.load_model("minilm", head="sequence-classification")
    inputs = introspect.tokenize(loaded.tokenizer, ["I love cats!", "He hates pineapple pizza."])
    graph = introspect.trace(loaded.model, inputs)

    nodes = graph.nodes
    layer0 = nodes[(nodes.layer == "encoder.layer.0") & (nodes.kind == "tensor")]
    print(layer0[["name", "op_type", "shapes", "params", "flops"]].to_string(index=False))
    print()
    layers = graph.layers[["layer", "nodes", "params", "flops", "output_shape"]]
    print(layers.to_string(index=False))
    if argv:
        nodes.to_csv(argv[0], index=False)
        print(f"\nwrote {len(nodes)} nodes to {argv[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
