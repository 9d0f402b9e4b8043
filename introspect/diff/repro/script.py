"""The repro's two files: ``repro.py``, a script that needs torch and safetensors only, and
``inputs.safetensors``, the values it runs on.

The script is written to be read in a bug report: each side is a short function of
plain torch calls (``introspect.diff.repro.program``), then the comparison exactly as the
diff made it (region, feature order, layout, padding, budget), then four lines of output
and an exit status: 1 when the two sides part by more than the budget, 0 when not.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from introspect.diff.records import Divergence
from introspect.diff.repro.capture import Capture
from introspect.diff.repro.program import Program

SCRIPT = "repro.py"
TENSORS = "inputs.safetensors"


@dataclass(frozen=True)
class Header:
    """What the script's docstring and first line of output say about the diff."""

    divergence: Divergence
    reference_label: str
    candidate_label: str
    reference_module: str  # "GELUActivation" or "torch.nn.functional.gelu"
    candidate_module: str
    candidate_module_path: str  # "blocks.1.act" ("" for a function)
    version: str


def render_script(capture: Capture, reference: Program, candidate: Program,
                  header: Header, devices: tuple[str, str]) -> str:
    """The text of ``repro.py``."""
    d = header.divergence
    hints = "".join(f"\nHint: {h}\n" for h in d.hints)
    detail = f"\n{d.detail}\n" if d.detail else ""
    lines = [
        '"""Reproduce a divergence that `introspect diff` found, with torch alone.',
        "",
        f"Reference: {header.reference_label}",
        f"Candidate: {header.candidate_label}",
        "",
        f"The first divergence is at {d.reference_node} ({header.reference_module}, in "
        f"{d.module or d.layer}) and {d.candidate_node} ({header.candidate_module}"
        + (f", module {header.candidate_module_path}" if header.candidate_module_path else "")
        + "); introspect measured a local max abs error of "
        f"{d.local_max_abs_err!r} over budget {d.budget}.{detail}{hints}",
        f"Each side's op is written out as the torch calls it made; both run on the values "
        f"recorded there, the candidate's on the reference's inputs (its local error). Run "
        f"`python {SCRIPT}` next to {TENSORS}: exit status 1 when the two part by more than "
        "the budget, 0 when not. Written by introspect " + header.version + '.\n"""',
        "",
        "import sys",
        "from pathlib import Path",
        "",
        "import torch",
        "from safetensors.torch import load_file",
        "",
        f"MEASURED = {d.local_max_abs_err!r}  # the local max abs error introspect reported",
        f"ATOL, RTOL = {capture.budget.atol!r}, {capture.budget.rtol!r}",
        f"DEVICES = {json.dumps({'reference': devices[0], 'candidate': devices[1]})}",
        "",
        "",
        _DEVICE_FUNCTION,
        "",
        "",
        "def load():",
        '    """The recorded values, each on the device its side ran on."""',
        f"    tensors = load_file(str(Path(__file__).with_name({TENSORS!r})))",
        "    where = {side: device(name) for side, name in DEVICES.items()}",
        "    return {key: value.to(where.get(key.split('.')[0], where['reference']))",
        "            for key, value in tensors.items()}",
        "",
        "",
        *_function("reference", d.reference_node, header.reference_module, reference),
        "",
        "",
        *_function("candidate", d.candidate_node, header.candidate_module, candidate),
        "",
        "",
        *_comparison(capture),
        "",
        "",
        _MAIN,
    ]
    return "\n".join(lines) + "\n"


def _function(side: str, node: str, what: str, program: Program) -> list[str]:
    doc = f"{node} ({what})" + (", on the reference's values" if side == "candidate" else "")
    lines = [f"def {side}(T):", f'    """{doc}."""']
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
    lines = ["def compare(T, reference, candidate):",
             '    """The largest difference over real tokens, and how many elements are over '
             'budget."""',
             "    candidate = candidate.to(reference.device)"]
    if capture.reference_region is not None:
        r = capture.reference_region
        lines.append(f"    reference = reference.narrow({r.dim}, {r.start}, {r.stop - r.start})"
                     "  # the part the candidate computes")
    if capture.candidate_region is not None:
        r = capture.candidate_region
        lines.append(f"    candidate = candidate.narrow({r.dim}, {r.start}, {r.stop - r.start})"
                     "  # its part of a fused value")
    if capture.feature_order is not None:
        lines.append("    # the candidate's features come in another order (permuted weights)")
        lines.append("    candidate = candidate.index_select(-1, T['compare.inverse_order']"
                     ".to(candidate.device))")
    if capture.layout is not None:
        layout = capture.layout
        lines.append(f"    candidate = candidate.reshape({list(layout.shaped)})"
                     f".permute({list(layout.inverse)})  # the reference's layout")
    lines += [
        "    dtype = torch.promote_types(candidate.dtype, reference.dtype)",
        "    if not dtype.is_floating_point:",
        "        dtype = torch.float64",
        "    a, b = candidate.to(dtype), reference.to(dtype)",
        "    d = (a - b).abs()",
        "    if bool(d.isnan().any()):  # NaN on one side only counts; on both, it does not",
        "        d = d.masked_fill((a == b) | (a.isnan() & b.isnan()), 0.0)"
        ".nan_to_num(nan=float('inf'))",
        "    over = d > ATOL + RTOL * b.abs()",
    ]
    if capture.padding is not None:
        lines += ["    padded = T['compare.padding'].to(d.device)  # padding: not compared",
                  "    d, over = d.masked_fill(padded, 0.0), over & ~padded"]
    lines.append("    return (float(d.max()) if d.numel() else 0.0), int(over.sum())")
    return lines


def bundle_tensors(capture: Capture, reference: Program, candidate: Program
                   ) -> dict[str, torch.Tensor]:
    """Every tensor the script reads, contiguous and on the CPU, by its key."""
    assert capture.reference.output is not None and capture.candidate.output is not None
    tensors = {**reference.inputs, **candidate.inputs,
               "reference.recorded_output": capture.reference.output,
               "candidate.recorded_output": capture.candidate.output}
    if capture.padding is not None:
        tensors["compare.padding"] = capture.padding.to(torch.bool)  # broadcasts
    if capture.feature_order is not None:
        order = capture.feature_order
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        tensors["compare.inverse_order"] = inverse
    return {key: value.detach().to("cpu").contiguous() for key, value in tensors.items()}


def encode_tensors(tensors: dict[str, torch.Tensor], notes: Sequence[str] = ()) -> bytes:
    """``inputs.safetensors`` as bytes (keys sorted: the same values give the same bytes)."""
    from safetensors.torch import save

    metadata = {"written_by": "introspect diff --repro"}
    metadata.update({f"note.{i}": note for i, note in enumerate(notes)})
    return bytes(save({k: tensors[k] for k in sorted(tensors)}, metadata=metadata))


_DEVICE_FUNCTION = '''def device(name):
    """``name``, or the CPU where this machine lacks it (the figures may then differ)."""
    if name.startswith("cuda") and not torch.cuda.is_available():
        print(f"note: recorded on {name}, which this machine lacks; running on the CPU, "
              "so the errors may differ from introspect's")
        return "cpu"
    return name'''

_MAIN = '''def reproduction_error(rerun, recorded):
    """How far a re-run is from the value recorded in the diff ("bit-identical": 0)."""
    if rerun.shape != recorded.shape:
        return f"shape {tuple(rerun.shape)} where {tuple(recorded.shape)} was recorded"
    recorded = recorded.to(rerun.device)
    if torch.equal(rerun, recorded):
        return "0 (bit-identical)"
    return f"{float((rerun.double() - recorded.double()).abs().max()):.6g}"


def main():
    T = load()
    with torch.no_grad():
        ref, cand = reference(T), candidate(T)
    print("reference op, max abs error against its recorded output: "
          + reproduction_error(ref, T["reference.recorded_output"]))
    print("candidate op, max abs error against its recorded output: "
          + reproduction_error(cand, T["candidate.recorded_output"]))
    difference, over = compare(T, ref, cand)
    print(f"candidate vs reference at the divergence: max abs difference {difference:.6g} "
          f"(introspect measured {MEASURED:.6g}); {over} element(s) over budget "
          f"atol {ATOL:.3g} + rtol {RTOL:.3g} * |ref|")
    print("FAIL: the two ops part here" if over else "ok: the two ops agree within budget")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())'''


__all__ = ["SCRIPT", "TENSORS", "Header", "bundle_tensors", "encode_tensors", "render_script"]
