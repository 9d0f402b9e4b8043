"""Where each model of a diff runs, and where their values meet.

The usual split is the reference in float32 on the CPU, the golden run, and the candidate
in bfloat16 on ``cuda``. Each model runs on its own device, on its own copy of the inputs;
every aligned value is moved to the *comparison device* (the reference's) just before it
is measured, one pair at a time (``introspect.diff.ops.compare``), so the GPU never holds a
second copy of the graph.

Models are moved the way ``Module.to`` moves them (a parameter keeps its identity, its
``.data`` changes; a buffer is replaced) and put back afterwards, as the diff puts back
training modes. A parameter the candidate shares with the reference (a port that reuses
the reference's ``nn.Parameter`` objects) cannot be on two devices: the candidate gets its
own moved copy of it, and its own object back afterwards.

Budgets know the device: on CUDA, float32 matmuls may run in TF32 (10-bit mantissa, unit
roundoff 2**-11); ``rounding_dtypes`` then names the pseudo-dtype ``tfloat32``, whose
budget ``introspect.diff.tolerance`` holds.

Example::

    >>> placement = place(reference, candidate, None, "cuda")
    >>> placement.candidate_device, placement.comparison_device
    (device(type='cuda', index=0), device(type='cpu'))
    >>> placement.restore()
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from introspect.errors import InputError

TF32 = "tfloat32"  # the pseudo-dtype of a float32 matmul run in TF32 (tolerance.py)


def parse_device(value: str | torch.device | None, option: str) -> torch.device | None:
    """A device this machine has, or None; ``cuda`` means the current CUDA device.

    Raises:
        InputError: a name torch does not know, or a device this machine lacks, in one line
            that names ``option`` (``--device``, ``candidate_device=``).
    """
    if value is None:
        return None
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError) as e:
        raise InputError(f"{option} {_shown(value)}: not a device torch knows (cpu, cuda, "
                         "cuda:1, mps)") from e
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "meta":
        raise InputError(f"{option} meta: a diff needs values, and the meta device holds none")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise InputError(f"{option} {value}: no CUDA device is available here (torch "
                             f"{torch.__version__}, {build}); use cpu")
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise InputError(f"{option} {value}: this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s), cuda:0 to "
                             f"cuda:{torch.cuda.device_count() - 1}")
        return torch.device("cuda", index)
    try:  # mps, xpu, a backend of its own: usable if it holds a tensor
        torch.empty(1, device=device)
    except Exception as e:  # noqa: BLE001 - each backend fails its own way
        raise InputError(f"{option} {value}: this machine cannot use it (torch "
                         f"{torch.__version__}: {_cause(e)}); use cpu") from e
    return device


def _cause(error: BaseException) -> str:
    """A backend's error in a few words: torch's run to 1,250 characters on one line.

    (``Could not run 'aten::empty.memory_format' with arguments from the 'MPS' backend.
    This could be because ...``: the first sentence, at most 80 characters.)
    """
    text = " ".join(str(error).split()) or type(error).__name__
    sentence = text.split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= 80 else sentence[:79] + "…"


def _shown(value: object) -> str:
    """A user's value quoted, at most 40 characters of it, so the refusal stays one line."""
    text = str(value)
    return repr(text) if len(text) <= 40 else repr(text[:39]) + "…"


def model_device(model: torch.nn.Module) -> torch.device:
    """Where a model's first weight lives (the CPU for a model without any)."""
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")


def describe(device: torch.device) -> str:
    """``cuda:0 (NVIDIA H100 80GB HBM3)``; ``cpu``."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def to_device(tensors: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """The inputs on ``device`` (tensors already there are passed as they are)."""
    return {name: t.to(device) if isinstance(t, torch.Tensor) else t
            for name, t in tensors.items()}


# ---------------------------------------------------------------------------------------
# Moving models, and putting them back


@dataclass
class Placement:
    """Where the two models run and where their values are compared; ``restore`` undoes it."""

    reference_device: torch.device
    candidate_device: torch.device
    notes: list[str] = field(default_factory=list)
    _undo: list[Any] = field(default_factory=list, repr=False)

    @property
    def comparison_device(self) -> torch.device:
        """Values meet on the reference's device: the golden run is not moved."""
        return self.reference_device

    @property
    def split(self) -> bool:
        return self.reference_device != self.candidate_device

    def restore(self) -> None:
        """Every moved weight back where it was (the same objects, no copy)."""
        while self._undo:
            self._undo.pop()()


def place(reference: torch.nn.Module, candidate: torch.nn.Module,
          device: str | torch.device | None = None,
          candidate_device: str | torch.device | None = None) -> Placement:
    """Move the models for a diff: ``device`` both, ``candidate_device`` the candidate.

    With neither, nothing moves: each model runs where its weights are, and the inputs
    follow it.

    Raises:
        InputError: a device that is unknown or absent (see ``parse_device``).
    """
    both = parse_device(device, "device=")
    alone = parse_device(candidate_device, "candidate_device=")
    placement = Placement(both or model_device(reference),
                          alone or both or model_device(candidate))
    if candidate is reference and placement.split:
        raise InputError("the candidate is the reference itself, which cannot run on two "
                         "devices: pass a copy (copy.deepcopy(model)) as the candidate")
    try:
        if both is not None:
            _move(reference, both, placement, shared=set())
        if alone or both:
            keep = {id(p) for p in reference.parameters()} if placement.split else set()
            _move(candidate, placement.candidate_device, placement, shared=keep)
    except BaseException:
        placement.restore()
        raise
    if placement.split or placement.reference_device.type != "cpu":
        placement.notes.append(
            f"the reference ran on {describe(placement.reference_device)}, the candidate on "
            f"{describe(placement.candidate_device)}; values were compared on "
            f"{placement.comparison_device}, moved there one pair at a time")
    return placement


def _move(model: torch.nn.Module, device: torch.device, placement: Placement,
          shared: set[int]) -> None:
    """``model.to(device)``, undoable; parameters in ``shared`` (ids) get a copy instead."""
    moved: dict[int, Any] = {}  # tied weights stay tied
    copies = 0
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None or p.device == device:
                continue
            if id(p) not in moved:
                data = p.data.to(device)
                # as Module.to: the same Parameter, new data, where the tensor types allow
                # it (CPU and CUDA do); a new Parameter otherwise (meta), and for one the
                # reference owns, which is not ours to move
                in_place = id(p) not in shared and torch._has_compatible_shallow_copy_type(
                    p.data, data)
                if in_place:
                    placement._undo.append(_setter(p, "data", p.data))
                    p.data = data
                moved[id(p)] = p if in_place else torch.nn.Parameter(data, p.requires_grad)
                copies += id(p) in shared
            if moved[id(p)] is not p:
                module._parameters[name] = moved[id(p)]
                placement._undo.append(_setter(module._parameters, name, p))
        for name, b in list(module._buffers.items()):
            if b is None or b.device == device:
                continue
            if id(b) not in moved:
                moved[id(b)] = b.to(device)
            placement._undo.append(_setter(module._buffers, name, b))
            module._buffers[name] = moved[id(b)]
    if copies:
        placement.notes.append(f"the candidate shares {copies} parameter(s) with the reference; "
                               f"it ran on copies of them on {device}")


def _setter(target: Any, key: str, value: Any) -> Any:
    if isinstance(target, dict):
        return lambda: target.__setitem__(key, value)
    return lambda: setattr(target, key, value)


# ---------------------------------------------------------------------------------------
# Budgets that know the device


def tf32_matmuls() -> tuple[bool, str]:
    """Whether CUDA float32 matmuls run in TF32 now, and the setting that says so.

    Newer torch has a per-backend precision (``torch.backends.cuda.matmul.fp32_precision``,
    "none" inheriting ``torch.backends.fp32_precision``); the legacy getters
    (``allow_tf32``, ``torch.get_float32_matmul_precision()``) raise once the two APIs
    have been mixed, so each is asked in turn.
    """
    matmul = getattr(getattr(torch.backends.cuda, "matmul", None), "fp32_precision", None)
    if matmul in ("tf32", "ieee"):
        return matmul == "tf32", f"torch.backends.cuda.matmul.fp32_precision is {matmul!r}"
    whole = getattr(torch.backends, "fp32_precision", None)
    if whole in ("tf32", "ieee"):
        return whole == "tf32", f"torch.backends.fp32_precision is {whole!r}"
    try:
        allowed = bool(torch.backends.cuda.matmul.allow_tf32)
        return allowed, f"torch.backends.cuda.matmul.allow_tf32 is {allowed}"
    except (RuntimeError, AttributeError):
        pass
    try:
        precision = torch.get_float32_matmul_precision()
        return precision != "highest", f"torch.get_float32_matmul_precision() is {precision!r}"
    except RuntimeError:  # both APIs mixed and neither answers: the cautious budget
        return True, "the matmul precision could not be read (legacy and new APIs mixed)"


def rounding_dtypes(placement: Placement, *models: torch.nn.Module) -> list[str]:
    """``["tfloat32"]`` when a model computing in float32 runs on CUDA under TF32, else []."""
    devices = (placement.reference_device, placement.candidate_device)
    on_cuda = [m for m, d in zip(models, devices, strict=False) if d.type == "cuda"]
    if not any(_holds_float32(m) for m in on_cuda):
        return []
    return [TF32] if tf32_matmuls()[0] else []


def budget_note(placement: Placement, rounding: list[str], budget: Any) -> str | None:
    """Which budget the device set: TF32's, or float32's with TF32 off (None on the CPU)."""
    if placement.reference_device.type != "cuda" and placement.candidate_device.type != "cuda":
        return None
    on, why = tf32_matmuls()
    if TF32 in rounding:
        return (f"CUDA float32 matmuls ran in TF32 ({why}): float32 nodes got the tfloat32 "
                f"budget ({budget}), TF32's rounding (unit roundoff 2^-11)")
    return (f"CUDA float32 matmuls ran in full float32 ({why}): float32 nodes kept the "
            "float32 budget" if not on else "no float32 weights on CUDA: TF32 did not apply")


# The ops whose float32 work cuBLAS/cuDNN may do in TF32: a node computing one of these
# gets TF32's budget; every other node (GELU, LayerNorm, softmax, an add) is fed the
# reference's values in local mode and computes in full float32, so keeps float32's.
MATMUL_OPS = frozenset({
    "Linear", "linear", "matmul", "__matmul__", "mm", "bmm", "addmm", "baddbmm", "addbmm",
    "einsum", "tensordot", "scaled_dot_product_attention", "Conv1d", "Conv2d", "conv1d",
    "conv2d", "Conv1D", "MultiheadAttention", "multi_head_attention_forward"})


def device_budgets(budgets: list[Any], pairs: Any, reference: Any, candidate: Any,
                   tolerance: Any, rounding: list[str], noise: bool) -> list[Any]:
    """Each pair's budget, TF32's where a matmul ran under TF32 in float32.

    With a noise budget nothing changes: the rounded copy of the reference ran on the
    candidate's device, so each node's measured noise already holds TF32's rounding.
    """
    if TF32 not in rounding or noise:
        return budgets
    float32 = tolerance.node_budget("float32")
    ref_ops = {r.name: r.op_type for r in reference.records}
    cand_ops = {r.name: r.op_type for r in candidate.records}
    return [tolerance.node_budget(TF32) if budget == float32 and (
        ref_ops.get(pair.reference) in MATMUL_OPS or cand_ops.get(pair.candidate) in MATMUL_OPS)
        else budget for pair, budget in zip(pairs, budgets, strict=True)]


def sdpa_note(placement: Placement) -> str | None:
    """Which CUDA attention kernels sdpa may pick: each its own path, with its own noise."""
    if placement.candidate_device.type != "cuda" and placement.reference_device.type != "cuda":
        return None
    backends = torch.backends.cuda
    kernels = [name for name, on in (
        ("flash", backends.flash_sdp_enabled()),
        ("memory-efficient", backends.mem_efficient_sdp_enabled()),
        ("cuDNN", getattr(backends, "cudnn_sdp_enabled", lambda: False)()),
        ("math", backends.math_sdp_enabled())) if on]
    return (f"on CUDA, scaled_dot_product_attention picks one of its kernels ({', '.join(kernels)} "
            "enabled) by dtype and shape: its values are compared as any other node's, and "
            "with --noise-budget its noise is measured on the candidate's device, the same "
            "kernel")


def device_notes(placement: Placement, rounding: list[str], tolerance: Any) -> list[str]:
    """What the diff's notes say about devices: where each side ran, which budget applied."""
    budget = budget_note(placement, rounding, tolerance.node_budget(TF32))
    return [*placement.notes, *(n for n in (budget, sdpa_note(placement)) if n)]


def check_modes(device: Any, candidate_device: Any, generate: int, backward: bool) -> None:
    """Refuse the modes that do not run across devices yet, before anything moves."""
    if device is None and candidate_device is None:
        return
    if generate:
        raise InputError("device= and candidate_device= (--device, --candidate-device) do not "
                         "mix with generate yet: move both models yourself to one device")
    if backward and candidate_device is not None and \
            parse_device(candidate_device, "candidate_device=") != parse_device(
                device or "cpu", "device="):
        raise InputError("backward does not run across two devices yet: use device= "
                         "(--device) alone, both models on one device")


def _holds_float32(model: torch.nn.Module) -> bool:
    return any(t.dtype == torch.float32 for t in (*model.parameters(), *model.buffers()))


__all__ = ["MATMUL_OPS", "TF32", "Placement", "budget_note", "check_modes", "describe",
           "device_budgets", "device_notes",
           "model_device", "parse_device", "place", "rounding_dtypes", "sdpa_note",
           "tf32_matmuls", "to_device"]
