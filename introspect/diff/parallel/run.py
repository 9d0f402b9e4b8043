"""``introspect.diff(..., nproc=N)``: a tensor-parallel port against its one-process reference.

The flow: capture the reference in this process, clean (the port's file is never imported
here); start N ranks (``launch``), each building the port and recording its forward
(``rank``); join the ranks' local values into whole tensors by value (``join``); diff the
joined tensors against the capture as a dump is diffed (``introspect.dump``); and explain
the first divergence with the faults tensor parallelism brings (``hints``).

Example::

    >>> result = diff_parallel(loaded, "megatron_bert.py:build", inputs, nproc=2)
    >>> result.passed, result.parallel.forward_seconds
    (True, [0.012, 0.013])
"""

from __future__ import annotations

import inspect
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from introspect.diff.parallel.hints import parallel_hints, reference_bias
from introspect.diff.parallel.join import PER_RANK, JoinedRanks, join_ranks
from introspect.diff.parallel.launch import run_ranks
from introspect.diff.parallel.lifeline import parent_stops
from introspect.diff.parallel.outputs import rank_output_rows
from introspect.diff.tolerance import Tolerance
from introspect.errors import InputError

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class ParallelRun:
    """What the ranks did, kept on ``DiffResult.parallel``."""

    nproc: int
    backend: str
    forward_seconds: list[float]  # each rank's own forward (its second truth run)
    joins: dict[str, str]  # joined tensor -> how it was made
    # where the wall time went: capture, start (until every rank had loaded its
    # reference), build, run and record (the ranks), join and diff (here)
    seconds: dict[str, float] = field(default_factory=dict)


def check_nproc(nproc: Any, backend: str | None = None) -> int:
    """A number of ranks >= 1 that this machine can run at once: at most one rank per
    core on the CPU (gloo), one per device with NCCL. Checked before anything loads.

    Raises:
        InputError: anything else, in one line.
    """
    count = None
    if isinstance(nproc, str) and re.fullmatch(r"\s*-?[0-9]+\s*", nproc):
        count = int(nproc)  # ASCII digits only: int() reads "²" and "٣" too, or fails
    elif isinstance(nproc, int) and not isinstance(nproc, bool):
        count = nproc
    if count is None:
        shown = repr(nproc) if len(repr(nproc)) <= 40 else repr(nproc)[:37] + "..."
        raise InputError(f"--nproc takes a number of processes, got {shown}")
    if count < 1:
        raise InputError(f"--nproc takes a number of processes >= 1, got {count}")
    limit, unit = rank_limit(backend)
    if count > limit:
        raise InputError(f"--nproc {count} is more ranks than this machine has {unit} "
                         f"({limit}): give at most {limit}")
    return count


def rank_limit(backend: str | None = None) -> tuple[int, str]:
    """How many ranks can run at once, and of what: CUDA devices for NCCL (the default
    where CUDA is present), else the cores this process may run on."""
    if backend == "nccl" or (backend is None and torch.cuda.is_available()):
        return torch.cuda.device_count(), "CUDA devices"
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(cores, 1), "cores"


def port_spec(build: Any) -> str:
    """``path/to/port.py:NAME`` for a build callable (each rank imports it anew).

    Raises:
        InputError: not a spec and not a function a file defines at its top level.
    """
    from introspect.models.ports import is_port_spec

    if isinstance(build, str):
        if not is_port_spec(build):
            raise InputError(f"nproc needs the candidate as a port (path/to/port.py:NAME or "
                             f"package.module:NAME, a build(reference) run on every rank); "
                             f"got {build!r}")
        return build
    if isinstance(build, torch.nn.Module) or not callable(build):
        raise InputError(f"nproc needs the candidate as a build(reference) callable or a "
                         f"port spec (it is built on every rank), not a "
                         f"{type(build).__name__}: a model built here cannot be split")
    name = getattr(build, "__qualname__", "")
    try:
        source = inspect.getsourcefile(build)
    except TypeError:
        source = None
    if not source or "<locals>" in name or "<lambda>" in name:
        raise InputError(f"nproc needs a build function defined at the top level of a file "
                         f"(each rank imports it again); {name or build!r} is not")
    return f"{source}:{name}"


def diff_parallel(reference: Any, build: Any, inputs: Any, nproc: int, *,
                  atol: float | None = None, rtol: float | None = None,
                  backend: str | None = None, timeout: float = 600.0,
                  reference_label: str = "", candidate_label: str = "",
                  allow_nonfinite: bool = False, start_method: str | None = None) -> Any:
    """Diff a tensor-parallel port, run on ``nproc`` ranks, against ``reference``.

    Args:
        reference: the reference model, or the ``LoadedReference`` a port's build takes
            (``introspect.models.ports``; a bare model is wrapped, with its ``config``).
        build: the port, ``path/to/port.py:NAME`` or a top-level function of a file:
            ``build(reference)`` runs on every rank after the process group is up and
            returns the rank's module; its forward calls the collectives itself.
        inputs: ``introspect.tokenize(...)`` output or a mapping of tensors.
        nproc: how many ranks (processes).
        backend: gloo (the default on the CPU) or nccl (the default with CUDA).
        timeout: seconds the whole run on the ranks may take, and any collective may wait.
        start_method: how the ranks start: ``fork`` (the CPU's default: in a fraction of a
            second, the reference shared copy-on-write) or ``spawn`` (fresh interpreters, as
            torchrun starts them; the default with NCCL, as CUDA needs).

    Returns:
        A ``DiffResult`` of the joined tensors against the reference's values, with
        ``parallel`` (a ``ParallelRun``) and the TP hints on the first divergence.

    Raises:
        InputError: bad nproc (more ranks than cores, or CUDA devices with NCCL, included:
            refused before anything runs) or build, or a rank that raised, exited, ended its
            own process or hung (named).

    The ranks end with this process, however it ends, and their folder goes with them
    (``lifeline``); SIGTERM and SIGHUP stop the run as Ctrl-C does, then end the process.
    A rank's outputs that differ from rank 0's in names or shapes, or from the
    reference's, fail the diff with a note naming the rank (``result.outputs`` has a row
    per rank).
    """
    from introspect.dump.capture import capture
    from introspect.models.ports import LoadedReference

    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend not in BACKENDS:
        raise InputError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    nproc = check_nproc(nproc, backend)
    spec = port_spec(build)
    loaded = reference if isinstance(reference, LoadedReference) else LoadedReference(
        reference, getattr(reference, "config", None), None, None, "", "", "")
    tensors = {k: v for k, v in dict(getattr(inputs, "tensors", inputs)).items()}
    reference_label = reference_label or type(loaded.model).__name__
    clock = {"begin": time.time()}
    taken = capture(loaded.model, tensors, label=reference_label)
    expected = _reference_outputs(loaded.model, tensors)
    clock["captured"] = time.time()
    # SIGTERM or SIGHUP here stops the ranks and removes their folder, as Ctrl-C does
    with parent_stops(), tempfile.TemporaryDirectory(prefix="introspect-ranks-") as folder:
        method = start_method or ("spawn" if backend == "nccl" else "fork")
        _write_job(Path(folder), loaded if method == "spawn" else None, tensors)
        clock["written"] = time.time()
        ranks = run_ranks(Path(folder), nproc, spec, candidate_label or spec, backend=backend,
                          timeout=timeout, start_method=method, reference=loaded)
    clock["ranks"] = time.time()
    order = [n["name"] for n in ranks[0].nodes]
    tolerance = Tolerance(atol=atol, rtol=rtol)
    joined = join_ranks([r.values for r in ranks], order, taken.values, tolerance=tolerance,
                        placements={n["name"]: n["placements"] for n in ranks[0].nodes},
                        path=f"{nproc} ranks of {spec}")
    joined.dump.integers = {k: v for k, v in tensors.items() if not v.is_floating_point()}
    joined.sources = {n["name"]: list(n["sources"]) for n in ranks[0].nodes}
    joined.ops = {n["name"]: n["op"] for n in ranks[0].nodes}
    notes = [f"rank {r.rank}'s {note}" for r in ranks for note in r.notes]
    seconds = [r.forward_seconds for r in ranks]
    notes.append(f"{nproc} ranks ({backend}); each rank's own forward took "
                 + ", ".join(f"{s * 1000:.1f} ms" for s in seconds))
    result = diff_joined(taken, joined, atol=atol, rtol=rtol, reference_model=loaded.model,
                         reference_label=reference_label,
                         candidate_label=candidate_label or f"{spec} on {nproc} ranks",
                         allow_nonfinite=allow_nonfinite, notes=notes,
                         unfaithful=any(r.notes for r in ranks))
    result.output_rows, faults = rank_output_rows(
        ranks, expected, tolerance, allow_nonfinite=allow_nonfinite,
        attention_mask=tensors.get("attention_mask"))
    if faults:  # a rank's own outputs: each fault names its rank
        result.notes[:0] = faults
        result.passed = False
    clock["diffed"] = time.time()
    result.parallel = ParallelRun(nproc, backend, seconds,
                                  {k: str(j) for k, j in joined.joins.items()},
                                  _phases(clock, ranks))
    return result


def _reference_outputs(model: Any, tensors: Mapping[str, torch.Tensor]
                       ) -> dict[str, torch.Tensor]:
    """The reference's outputs by name, from one plain call, for each rank's to meet."""
    from introspect.diff.ops.eager import outputs_as_dict

    with torch.no_grad():
        returned = outputs_as_dict(model(**{k: v.clone() for k, v in tensors.items()}))
    return {k: v.detach() for k, v in returned.items() if isinstance(v, torch.Tensor)}


def _phases(clock: Mapping[str, float], ranks: list[Any]) -> dict[str, float]:
    """Seconds per phase; a rank phase is the slowest rank's."""
    def latest(stage: str) -> float:
        return max(r.stages.get(stage, clock["written"]) for r in ranks)

    return {"capture": clock["captured"] - clock["begin"],
            "write job": clock["written"] - clock["captured"],
            "start ranks": latest("in build") - clock["written"],
            "build": latest("in its forward") - latest("in build"),
            "truth runs": latest("recording its forward") - latest("in its forward"),
            "record": latest("writing its values") - latest("recording its forward"),
            "write values": max(r.done for r in ranks) - latest("writing its values"),
            "join and diff": clock["diffed"] - clock["ranks"]}


def _write_job(folder: Path, loaded: Any, tensors: Mapping[str, torch.Tensor]) -> None:
    """The inputs, and the reference for spawned ranks' builds, as files the ranks read."""
    from safetensors.torch import save_file

    if loaded is not None:  # spawned ranks load it; forked ones share the parent's
        torch.save(loaded, folder / "reference.pt")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "inputs.safetensors"))
    os.chmod(folder, 0o700)


def diff_joined(taken: Any, joined: JoinedRanks, *, atol: float | None, rtol: float | None,
                reference_model: Any, reference_label: str, candidate_label: str,
                allow_nonfinite: bool = False, notes: list[str] | None = None,
                unfaithful: bool = False, name_map: Mapping[str, str] | None = None) -> Any:
    """The dump diff of the joined tensors, with each row's join and the TP hints."""
    from introspect.dump.dump_diff import diff_dump

    def compare(names: Mapping[str, str] | None) -> Any:
        return diff_dump(taken, joined.dump, atol=atol, rtol=rtol, name_map=names,
                         reference_model=reference_model, reference_label=reference_label,
                         candidate_label=candidate_label, allow_nonfinite=allow_nonfinite)

    result = compare(name_map)
    # Ranks kept apart hold one quantity: where one rank's value pairs with a reference
    # node, every rank's is measured against that node (an unpaired rank never passes).
    forced = _siblings(result, joined)
    if forced:
        result = compare({**(name_map or {}), **forced})
    result.rows = [replace(row, note=f"{joined.joins[row.candidate_node]}; {row.note}")
                   if row.candidate_node in joined.joins else row for row in result.rows]
    result.notes[:0] = [*joined.notes, *(notes or [])]
    if unfaithful:
        result.notes.append("a rank's recording did not replay its own run: its values "
                            "cannot be trusted, and the diff fails")
        result.passed = False
    divergence = result.first_divergence
    if divergence is not None and divergence.candidate_node in joined.joins:
        hints = _hints(result, taken, joined, divergence, reference_model)
        result.first_divergence = replace(divergence, hints=(*hints, *divergence.hints))
    return result


def _siblings(result: Any, joined: JoinedRanks) -> dict[str, str]:
    """Per-rank tensors of one node not all paired with the node their first paired
    sibling holds: tensor name -> that reference node."""
    paired = {m.name: m.reference for m in result.alignment.matches if m.reference}
    nodes: dict[str, list[str]] = {}
    for name, join in joined.joins.items():
        if join.kind == PER_RANK:
            nodes.setdefault(join.node, []).append(name)
    forced = {}
    for names in nodes.values():
        target = next((paired[n] for n in names if n in paired), "")
        if target and any(paired.get(n) != target for n in names):
            forced.update({n: target for n in names})
    return forced


def _hints(result: Any, taken: Any, joined: JoinedRanks, divergence: Any,
           reference_model: Any) -> list[str]:
    join = joined.joins[divergence.candidate_node]
    match = next(m for m in result.alignment.matches if m.name == divergence.candidate_node)
    row = next(r for r in result.rows if r.candidate_node == divergence.candidate_node)
    target = taken.values[divergence.reference_node]
    layout: Callable[[torch.Tensor], torch.Tensor] = match.layout.apply if match.layout \
        else (lambda t: t)
    value = layout(joined.dump.values[divergence.candidate_node]).reshape(target.shape)
    allowance = (row.atol or 0.0) + (row.rtol or 0.0) * float(target.abs().max())
    try:
        return parallel_hints(join, joined, target, value, allowance,
                              reference_bias(reference_model, divergence.module), layout,
                              taken.values, {m.name for m in result.alignment.pairs})
    except Exception as e:  # a hint must never break the verdict it explains
        return [f"(tensor-parallel hints failed: {type(e).__name__}: {e})"]
