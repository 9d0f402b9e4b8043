"""Gradient dumps: the reference's gradients in a file, and a port's compared with them.

``introspect capture --backward -o ref.safetensors`` also writes ``ref.grads.safetensors``
(``grads_path``): the reference run forward and backward once on the diff's default loss
(``introspect.diff.backward.losses``), with

- ``node.<reference node name>``: the gradient of the loss with respect to that node's
  value (the names of ``ref.index.json``), for every captured node that has one;
- ``param.<reference parameter path>``: each weight's gradient
  (``param.bert.encoder.layer.0.attention.self.query.weight``; a tied weight once, under
  its first name);
- ``loss``: the loss, a scalar.

A port in another framework writes the same keys for what it computed, under the
reference's names (it loaded its weights from them, and ``ref.index.json`` names the
nodes), in ``port.grads.safetensors`` or ``port.grads.npz`` next to its activation dump;
``introspect diff --reference-dump ref.safetensors --candidate-dump port.npz --backward``
then compares them key by key (``compare_gradients``), with the backward diff's budgets
and hints. Keys the port does not write are listed, not failed; a weight it does write
must match.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from introspect.diff.backward.hints import gradient_hints
from introspect.diff.backward.losses import default_loss, loss_kind
from introspect.diff.backward.parity import (
    FLOOR,
    STATUS_FAIL,
    STATUS_OK,
    BackwardDivergence,
    BackwardResult,
    GradientDiff,
    ParameterGradient,
    _budget,
    _errors,
)
from introspect.diff.backward.record import LossFn, record_backward
from introspect.diff.tolerance import Tolerance
from introspect.errors import InputError
from introspect.run.modes import set_mode

NODE, PARAM, LOSS = "node.", "param.", "loss"


def grads_path(dump: str | os.PathLike[str]) -> Path:
    """``ref.safetensors`` -> ``ref.grads.safetensors``; ``port.npz`` -> ``port.grads.npz``."""
    path = Path(dump)
    return path.with_name(f"{path.stem}.grads{path.suffix}")


def capture_gradients(model: torch.nn.Module, inputs: Any, *, nodes: set[str] | None = None,
                      loss: LossFn | None = None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The reference's gradients under the keys above, and the file's metadata."""
    tensors = dict(getattr(inputs, "tensors", inputs))
    kind = "user" if loss is not None else loss_kind(model, tensors)
    loss_fn = loss if loss is not None else default_loss(kind)
    was_training = model.training
    set_mode(model, False)
    try:
        recording = record_backward(model, tensors, loss_fn, keep_graph=False)
    finally:
        set_mode(model, was_training)
    out: dict[str, torch.Tensor] = {}
    for name, grad in recording.grads.items():
        if nodes is None or name in nodes:
            out[NODE + name] = grad.contiguous()
    for name, weight_grad in recording.parameter_grads.items():
        if weight_grad is not None:
            out[PARAM + name] = weight_grad.contiguous()
    out[LOSS] = torch.tensor(recording.loss)
    return out, {"loss": kind, "keys": "node.<reference node>, param.<reference parameter>, loss"}


def read_gradients(path: str | os.PathLike[str]) -> Mapping[str, torch.Tensor]:
    """A gradient file (.safetensors or .npz) as tensors by key, each read when used.

    It is read as any dump is (``read_dump``): a regular file only, every tensor's size
    checked from the file's header before it is read (an archive member's too, before it
    is decompressed).

    Raises:
        InputError: the file is missing, unreadable or too large, or holds no gradient key.
    """
    from introspect.dump.formats import read_dump

    source = Path(path)
    if not source.is_file():
        raise InputError(f"no gradient file {_shown(source)}: write FILE.grads.safetensors "
                         "(or .npz) beside the dump (introspect capture --backward does, for "
                         "the reference)")
    if source.suffix not in (".safetensors", ".npz"):
        raise InputError(f"gradient file {_shown(source)}: expected .safetensors or .npz")
    tensors = read_dump(source, what="gradient file").values
    if not any(k.startswith((NODE, PARAM)) for k in tensors):
        raise InputError(f"{_shown(source)} holds no node.<name> or param.<name> gradient")
    return tensors


CAPTURE_DIGEST = "capture_sha256"  # the gradient file's metadata: which capture it belongs to


def capture_digest(payload: bytes) -> str:
    """What a capture's gradient file records of it: the SHA-256 of the capture's bytes."""
    return hashlib.sha256(payload).hexdigest()


def check_belongs(gradients: str | os.PathLike[str], capture: str | os.PathLike[str]) -> None:
    """Refuse a reference gradient file that another capture wrote (a stale or mixed set).

    ``introspect capture --backward`` writes the SHA-256 of the capture into its gradient
    file; a capture written since (or a set cut short between two renames) no longer
    matches it.

    Raises:
        InputError: the digests differ, or the gradient file records none.
    """
    from safetensors import safe_open

    from introspect.files import open_regular

    grads, source = Path(gradients), Path(capture)
    recorded = None
    if grads.suffix == ".safetensors":
        fd = open_regular(grads, "gradient file")
        try:
            with safe_open(f"/proc/self/fd/{fd}", framework="pt") as handle:
                recorded = (handle.metadata() or {}).get(CAPTURE_DIGEST)
        except Exception as e:
            raise InputError(f"cannot read gradient file {_shown(grads)}: "
                             f"{type(e).__name__}") from e
        finally:
            os.close(fd)
    digest = hashlib.sha256()
    fd = open_regular(source, "capture")
    try:
        while chunk := os.read(fd, 1 << 22):
            digest.update(chunk)
    finally:
        os.close(fd)
    if recorded != digest.hexdigest():
        why = "was written for another capture" if recorded else "does not say which capture " \
            "it belongs to"
        raise InputError(f"gradient file {_shown(grads)} {why} than {_shown(source)}: capture "
                         "again with --backward, so that both are written together")


def _shown(path: Path) -> str:
    from introspect.files import printable_name

    return repr(printable_name(str(path)))


def compare_gradients(reference: Mapping[str, torch.Tensor],
                      candidate: Mapping[str, torch.Tensor],
                      tolerance: Tolerance | None = None,
                      allow_nonfinite: bool = False) -> BackwardResult:
    """Gradients key by key (the keys above); a dump has no local backward.

    NaN or Inf in a loss or a gradient fails (the same Inf in both files too) unless
    ``allow_nonfinite``.

    Raises:
        InputError: the reference's loss is NaN or Inf (nothing to compare against).
    """
    tolerance = tolerance or Tolerance()
    notes: list[str] = []
    losses = {side: float(t.reshape(-1)[0]) for side, t in
              (("reference", reference.get(LOSS)), ("candidate", candidate.get(LOSS)))
              if t is not None and t.numel() == 1}
    if not allow_nonfinite and not math.isfinite(losses.get("reference", 0.0)):
        raise InputError(f"the reference's gradient file holds a loss of {losses['reference']}: "
                         "its gradients compare nothing; capture it again (or pass "
                         "--allow-nonfinite to compare them anyway)")
    bad_loss = not allow_nonfinite and not math.isfinite(losses.get("candidate", 0.0))
    if bad_loss:
        notes.append(f"the candidate's loss is {losses['candidate']}: the backward diff fails")
    rows: list[GradientDiff] = []
    params: list[ParameterGradient] = []
    largest = {prefix: max((float(t.abs().max()) for k, t in reference.items()
                            if k.startswith(prefix) and t.numel()), default=0.0)
               for prefix in (NODE, PARAM)}
    missing = [k for k in reference if k.startswith((NODE, PARAM)) and k not in candidate]
    if missing:
        notes.append(f"the candidate's gradients lack {len(missing)} of the reference's keys "
                     f"(first: {', '.join(missing[:3])}); they are not compared")
    for index, (key, ref) in enumerate(reference.items()):
        cand = candidate.get(key)
        if cand is None or not key.startswith((NODE, PARAM)):
            continue
        name = key.split(".", 1)[1]
        if tuple(cand.shape) != tuple(ref.shape):
            if cand.numel() != ref.numel():
                raise InputError(f"gradient {key}: shape {tuple(cand.shape)} in the candidate, "
                                 f"{tuple(ref.shape)} in the reference")
            cand = cand.reshape(ref.shape)
        prefix = key[:len(NODE)] if key.startswith(NODE) else PARAM
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        budget = _budget(tolerance, cand.dtype if cand.is_floating_point() else ref.dtype,
                         max(scale, FLOOR * largest[prefix]), None)
        err, rel, over, _ = _errors(cand.to(ref.dtype), ref, budget,
                                    allow_nonfinite=allow_nonfinite)
        hint = "; ".join(gradient_hints(cand.to(ref.dtype), ref, None,
                                        weight=prefix == PARAM)) if over else ""
        status = STATUS_FAIL if over else STATUS_OK
        if prefix == PARAM:
            params.append(ParameterGradient(name, name, "by name", str(tuple(ref.shape)), err,
                                            rel, scale, None, status, hint))
        else:
            rows.append(GradientDiff(name, name, "", "", "", str(tuple(ref.shape)), err, rel,
                                     scale, None, None, budget.atol, budget.rtol, status, hint,
                                     index))
    failing_nodes = [r for r in rows if r.status == STATUS_FAIL]
    failing_params = [p for p in params if p.status == STATUS_FAIL]
    divergence = None
    if failing_nodes:  # a dump has no local backward: the failing node nearest the outputs
        r = failing_nodes[-1]
        divergence = BackwardDivergence(r.reference_node, r.candidate_node, "", "", "",
                                        r.max_abs_err or 0.0, f"atol {r.atol:.3g} + rtol "
                                        f"{r.rtol:.3g} * |ref|", tuple(filter(None,
                                                                            r.hint.split("; "))))
    elif failing_params:
        p = failing_params[-1]
        divergence = BackwardDivergence("", p.candidate, "", "", "parameter",
                                        p.max_abs_err or 0.0, "", tuple(filter(
                                            None, p.hint.split("; "))), parameter=p.reference)
    return BackwardResult(divergence is None and not bad_loss, "from the dumps",
                          losses.get("reference", 0.0), losses.get("candidate", float("nan")),
                          rows, params, divergence, 0.0, notes)


__all__ = ["capture_gradients", "compare_gradients", "grads_path", "read_gradients"]
