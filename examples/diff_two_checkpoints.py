"""Diff two checkpoints of one architecture: the embedded MiniLM against a modified copy.

A "fine-tune" is simulated by saving MiniLM with one layer's feed-forward bias nudged;
the diff names that layer and node as the first divergence. Point ``--candidate`` at a
real checkpoint folder (a fine-tune, a conversion, a quantised copy) to compare your own.

Run:  python examples/diff_two_checkpoints.py [--candidate FOLDER]
"""

from __future__ import annotations

import argparse
import tempfile

import torch

import introspect


def nudged_copy(folder: str) -> str:
    """Save MiniLM with encoder.layer.2's intermediate bias shifted by 1e-3."""
    candidate = introspect.load_model("minilm").model
    with torch.no_grad():
        candidate.encoder.layer[2].intermediate.dense.bias += 1e-3
    candidate.save_pretrained(folder)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--candidate", help="a checkpoint folder (default: a nudged MiniLM)")
    args = parser.parse_args()

    reference = introspect.load_model("minilm")
    inputs = introspect.tokenize(reference.tokenizer, ["I love cats!", "He hates pineapple pizza."])
    with tempfile.TemporaryDirectory() as scratch_folder:
        folder = args.candidate or nudged_copy(scratch_folder)
        candidate = introspect.load_model(folder)
        result = introspect.diff(reference.model, candidate.model, inputs,
                                 reference_label="minilm", candidate_label=folder)
    print(result.summary())
    print(result.layer_table())
    return 0 if result.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
