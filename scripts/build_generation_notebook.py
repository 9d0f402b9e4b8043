"""Build examples/generation/parity_through_generation.ipynb from the cells below and run it.

Run:  python scripts/build_generation_notebook.py

Stored with its outputs; tests/generate/test_notebook.py checks them and (slow) runs it
again. Edit the cells here, not in the .ipynb.
"""

from __future__ import annotations

import sys
from pathlib import Path

FOLDER = Path(__file__).resolve().parents[1] / "examples" / "generation"
NOTEBOOK = FOLDER / "parity_through_generation.ipynb"

CELLS: list[tuple[str, str]] = [
    ("markdown", """\
# Parity through generation: a GPT-2 port with its own cache

A port of a decoder can agree with HuggingFace on every prompt and still generate
something else: the bugs live on the cached path (positions, rotary offsets, the cache
itself, the mask of a one-token query). `introspect.diff(..., generate=N)` decodes N
tokens greedily on both sides, each with its own cache, and compares the prefill and every
one-token step node by node, and every layer's cached keys and values after each step.

The reference is a small GPT-2 built the usual way (its cache on by default). The port is
[`gpt2_cached.py`](gpt2_cached.py), written by hand in the style of nanoGPT, with its own
cache: a tuple of `(k, v)` per layer, grown by concatenation."""),
    ("code", """\
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import introspect
import gpt2_cached  # examples/generation/gpt2_cached.py, next to this notebook

torch.manual_seed(0)
hf = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=1000,
                                n_positions=128, bos_token_id=0, eos_token_id=0)).eval()
with torch.no_grad():  # random init leaves LayerNorms at (1, 0) and biases at 0: perturb
    for name, p in hf.named_parameters():
        if "ln" in name or name.endswith("bias"):
            p.add_(0.1 * torch.randn_like(p))
prompt = {"input_ids": torch.tensor([[17, 301, 42, 7, 555, 90]])}
port = gpt2_cached.build(hf)
result = introspect.diff(hf, port, prompt, generate=8)
print(result.summary())"""),
    ("code", """\
result.steps[["step", "position", "reference_token", "candidate_token",
              "logits_max_abs_err", "first_node", "cache", "passed"]]"""),
    ("markdown", """\
Each layer's cache is read by value: the port keeps `(B, nh, S, hd)` as HF does, so every
layout is the same here; a `(B, S, nh, hd)` or pre-allocated cache would be read just as
well, and the table would say how."""),
    ("code", """\
result.caches.head(4)"""),
    ("markdown", """\
## The classic bug: positions not advanced with the cache

`build_positions_not_advanced` is the same port with `start = 0` where the positions
should start at the cache's length: the prompt (all positions from 0) is right, every
token after it is looked up at position 0."""),
    ("code", """\
broken = gpt2_cached.build_positions_not_advanced(hf)
result = introspect.diff(hf, broken, prompt, generate=8)
print(result.summary())"""),
    ("code", """\
result.steps[["step", "position", "reference_token", "candidate_token",
              "logits_max_abs_err", "first_node", "module", "cache", "passed"]]"""),
    ("markdown", """\
The prefill passes; step 1 is the first divergent step, at the node that makes the
positions, blamed on `transformer.wpe` where they are used; the keys cached at that step
differ from the reference's; and the hint was tested on the values: the reference's step,
run again from its own cache at position 0, gives the port's logits."""),
]


def build() -> None:
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell(text) if kind == "markdown"
                      else nbformat.v4.new_code_cell(text) for kind, text in CELLS]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(FOLDER)}}).execute()
    nbformat.write(notebook, NOTEBOOK)


if __name__ == "__main__":
    sys.exit(build())
