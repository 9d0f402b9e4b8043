"""The repro's two files: ``repro.py``, a script that needs torch and safetensors only, and
``inputs.safetensors``, the values it runs on and, in its metadata, what they are.

The script is written to be read in a bug report, and run by whoever receives it: each
side is a short function of plain torch calls (``introspect.diff.repro.program``), then
the comparison exactly as the diff made it (region, feature order, layout, padding,
budget), then its output and an exit status: 1 when the two sides part by more than the
budget, 0 when not.

Its text depends only on the ops it replays. Every name (the models' labels, a port's
file, node and module names, a class's ``__qualname__``), every figure (what introspect
measured, NaN and inf included) and every device is data: JSON in the safetensors
metadata, read when the script runs and printed with unprintable characters escaped. A
name is never pasted into source, so no name can end a string and run what follows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

from introspect.diff.ops.compare.layouts import inverse_order
from introspect.diff.records import Divergence
from introspect.diff.repro.capture import Capture
from introspect.diff.repro.program import Program

SCRIPT = "repro.py"
TENSORS = "inputs.safetensors"
ABOUT = "introspect.repro"  # the metadata key of the script's data (JSON)


@dataclass(frozen=True)
class Header:
    """What the script prints about the diff (data, never source)."""

    divergence: Divergence
    reference_label: str
    candidate_label: str
    reference_module: str  # "GELUActivation" or "torch.nn.functional.gelu"
    candidate_module: str
    candidate_module_path: str  # "blocks.1.act" ("" for a function)
    version: str


def render_script(capture: Capture, reference: Program, candidate: Program) -> str:
    """The text of ``repro.py``: the same for the same ops, whatever the models are named."""
    lines = [
        _DOCSTRING,
        "",
        "import json",
        "import sys",
        "from pathlib import Path",
        "",
        "import torch",
        "from safetensors import safe_open",
        "",
        "",
        _LOAD_FUNCTIONS,
        "",
        "",
        *_function("reference", reference),
        "",
        "",
        *_function("candidate", candidate),
        "",
        "",
        *_comparison(capture),
        "",
        "",
        _MAIN,
    ]
    return "\n".join(lines) + "\n"


def about(capture: Capture, reference: Program, candidate: Program, header: Header,
          devices: tuple[str, str], aliases: dict[str, str]) -> str:
    """The script's data: JSON of plain strings, numbers and lists (NaN and inf as JSON's
    own ``NaN`` and ``Infinity``, which ``json.loads`` reads back as floats)."""
    d = header.divergence
    data = {
        "reference": {"label": _text(header.reference_label), "node": _text(d.reference_node),
                      "what": _text(header.reference_module), "in": _text(d.module or d.layer)},
        "candidate": {"label": _text(header.candidate_label), "node": _text(d.candidate_node),
                      "what": _text(header.candidate_module),
                      "module": _text(header.candidate_module_path)},
        "measured": _number(d.local_max_abs_err),
        "atol": _number(capture.budget.atol),
        "rtol": _number(capture.budget.rtol),
        "budget": _text(d.budget),
        "detail": _text(d.detail),
        "hints": [_text(h) for h in d.hints],
        "devices": {"reference": _text(devices[0]), "candidate": _text(devices[1])},
        "inputs": {k: _text(v) for k, v in {**reference.described,
                                            **candidate.described}.items()},
        "aliases": dict(aliases),
        "written_by": "introspect " + _text(header.version),
    }
    return json.dumps(data, sort_keys=True, ensure_ascii=True, allow_nan=True)


def _text(value: Any) -> str:
    """A plain ``str``: a subclass's own methods are never called."""
    if value is None:
        return ""
    return str.__str__(value) if isinstance(value, str) else type(value).__name__


def _number(value: Any) -> float:
    return float.__float__(value) if isinstance(value, float) else float(int.__index__(value)) \
        if isinstance(value, int) else float("nan")


def _function(side: str, program: Program) -> list[str]:
    doc = ("The reference's op at the divergence, as the torch calls it made."
           if side == "reference" else
           "The candidate's op at the divergence, on the reference's values.")
    lines = [f"def {side}(T):", f'    """{doc}"""']
    for call in program.calls:
        if call.function.startswith("{0}."):
            source = call.function.format(call.arguments[0])
        else:
            source = f"{call.function}({', '.join(call.arguments)})"
        lines.append(f"    {call.target} = {source}")
    lines.append(f"    return {program.output}")
    return lines


def _comparison(capture: Capture) -> list[str]:
    """``compare``: the two outputs brought together as the diff compared them."""
    lines = ["def compare(T, about, reference, candidate):",
             '    """The largest difference over real tokens, and how many elements are over '
             'budget."""',
             "    candidate = candidate.to(reference.device)"]
    if capture.reference_region is not None:
        r = capture.reference_region
        lines.append(f"    reference = reference.narrow({int(r.dim)}, {int(r.start)}, "
                     f"{int(r.stop) - int(r.start)})  # the part the candidate computes")
    if capture.candidate_region is not None:
        r = capture.candidate_region
        lines.append(f"    candidate = candidate.narrow({int(r.dim)}, {int(r.start)}, "
                     f"{int(r.stop) - int(r.start)})  # its part of a fused value")
    if capture.feature_order is not None:
        lines.append("    # the candidate's features come in another order (permuted weights)")
        lines.append("    candidate = candidate.index_select(-1, T['compare.inverse_order']"
                     ".to(candidate.device))")
    if capture.layout is not None:
        layout = capture.layout
        lines.append(f"    candidate = candidate.reshape({[int(v) for v in layout.shaped]})"
                     f".permute({[int(v) for v in layout.inverse]})  # the reference's layout")
    if capture.axis_order is not None:
        what = capture.axis_order.kind
        lines.append(f"    # the candidate's {what} come in another order: put back in the "
                     "reference's")
        lines += [f"    candidate = candidate.index_select({int(axis)}, "
                  "T['compare.inverse_axis_order'].to(candidate.device))"
                  for axis in capture.axis_order.axes]
    lines += [
        "    atol, rtol = about['atol'], about['rtol']",
        "    dtype = torch.promote_types(candidate.dtype, reference.dtype)",
        "    if not dtype.is_floating_point:",
        "        dtype = torch.float64",
        "    a, b = candidate.to(dtype), reference.to(dtype)",
        "    d = (a - b).abs()",
        "    if bool(d.isnan().any()):  # NaN on one side only counts; on both, it does not",
        "        d = d.masked_fill((a == b) | (a.isnan() & b.isnan()), 0.0)"
        ".nan_to_num(nan=float('inf'))",
        "    over = d > atol + rtol * b.abs()",
    ]
    if capture.padding is not None:
        lines += ["    padded = T['compare.padding'].to(d.device)  # padding: not compared",
                  "    d, over = d.masked_fill(padded, 0.0), over & ~padded"]
    lines.append("    return (float(d.max()) if d.numel() else 0.0), int(over.sum())")
    return lines


def bundle_tensors(capture: Capture, reference: Program, candidate: Program
                   ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor the script reads, contiguous and on the CPU, each value stored once.

    Returns:
        The tensors to store by key, and the keys left out because an equal tensor is
        stored (``key -> stored key``): the two sides of a port usually share weights.
    """
    assert capture.reference.output is not None and capture.candidate.output is not None
    tensors = {**reference.inputs, **candidate.inputs,
               "reference.recorded_output": capture.reference.output,
               "candidate.recorded_output": capture.candidate.output}
    if capture.padding is not None:
        tensors["compare.padding"] = capture.padding.to(torch.bool)  # broadcasts
    if capture.feature_order is not None:
        tensors["compare.inverse_order"] = inverse_order(capture.feature_order)
    if capture.axis_order is not None:
        tensors["compare.inverse_axis_order"] = inverse_order(capture.axis_order.order)
    tensors = {key: value.detach().to("cpu").contiguous() for key, value in tensors.items()}
    stored: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for key in sorted(tensors):
        value = tensors[key]
        same = next((k for k, v in stored.items() if v.dtype == value.dtype
                     and v.shape == value.shape and v.numel() > 1
                     and torch.equal(v, value)), None)
        if same is None:
            stored[key] = value
        else:
            aliases[key] = same
    return stored, aliases


def encode_tensors(tensors: dict[str, torch.Tensor], about: str) -> bytes:
    """``inputs.safetensors`` as bytes, with the script's data (``about``, JSON) as its one
    metadata entry (keys sorted, one entry: the same values give the same bytes)."""
    from safetensors.torch import save

    return bytes(save({k: tensors[k] for k in sorted(tensors)}, metadata={ABOUT: about}))


_DOCSTRING = f'''"""Reproduce a divergence that `introspect diff` found, with torch alone.

Each side's op at the first divergence is written out below as the torch calls it made;
both run on the values recorded there, the candidate's on the reference's inputs (its
local error). What they are (the two models, the nodes and modules, what introspect
measured, the budget, the devices) is data, in the metadata of {TENSORS}: this
program holds no name from either model, and prints them escaped.

Run `python {SCRIPT}` next to {TENSORS}: exit status 1 when the two ops part by more
than the budget, 0 when not.
"""'''

_LOAD_FUNCTIONS = f'''def device(name):
    """``name``, or the CPU where this machine lacks it (the figures may then differ)."""
    if name.startswith("cuda") and not torch.cuda.is_available():
        print("note: recorded on " + shown(name) + ", which this machine lacks; running on "
              "the CPU, so the errors may differ from introspect's")
        return "cpu"
    return name


def shown(text):
    """``text`` with every unprintable character escaped: a name prints as one line."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text))


def load():
    """The recorded values, each on the device its side ran on, and what they are."""
    path = Path(__file__).resolve().with_name({TENSORS!r})
    with safe_open(str(path), framework="pt") as stored:
        about = json.loads(stored.metadata()[{ABOUT!r}])
        tensors = {{key: stored.get_tensor(key) for key in stored.keys()}}
    for key, same in about["aliases"].items():  # an equal value, stored once
        tensors[key] = tensors[same].clone()
    where = {{side: device(name) for side, name in about["devices"].items()}}
    return {{key: value.to(where.get(key.split(".")[0], where["reference"]))
            for key, value in tensors.items()}}, about'''

_MAIN = '''def reproduction_error(rerun, recorded):
    """How far a re-run is from the value recorded in the diff ("bit-identical": 0)."""
    if rerun.shape != recorded.shape:
        return f"shape {tuple(rerun.shape)} where {tuple(recorded.shape)} was recorded"
    recorded = recorded.to(rerun.device)
    if torch.equal(rerun, recorded):
        return "0 (bit-identical)"
    return f"{float((rerun.double() - recorded.double()).abs().max()):.6g}"


def describe(about):
    """Which models and ops these are: two lines of the data, escaped."""
    ref, cand = about["reference"], about["candidate"]
    where = f", in {ref['in']}" if ref["in"] else ""
    module = f", module {cand['module']}" if cand["module"] else ""
    print(shown(f"reference: {ref['label']}, node {ref['node']} ({ref['what']}{where})"))
    print(shown(f"candidate: {cand['label']}, node {cand['node']} ({cand['what']}{module})"))


def main():
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    T, about = load()
    describe(about)
    with torch.no_grad():
        ref, cand = reference(T), candidate(T)
    print("reference op, max abs error against its recorded output: "
          + reproduction_error(ref, T["reference.recorded_output"]))
    print("candidate op, max abs error against its recorded output: "
          + reproduction_error(cand, T["candidate.recorded_output"]))
    difference, over = compare(T, about, ref, cand)
    print(f"candidate vs reference at the divergence: max abs difference {difference:.6g} "
          f"(introspect measured {about['measured']:.6g}); {over} element(s) over budget "
          f"atol {about['atol']:.3g} + rtol {about['rtol']:.3g} * |ref|")
    print("FAIL: the two ops part here" if over else "ok: the two ops agree within budget")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())'''


__all__ = ["ABOUT", "SCRIPT", "TENSORS", "Header", "about", "bundle_tensors", "encode_tensors",
           "render_script"]
