"""What each rank runs: join the process group, build the port, run it, record it, write.

A rank is a process of its own (forked on the CPU, spawned as ``torchrun`` does on CUDA),
so a port that sets globals, changes the reference, exits or hangs takes nothing of the
parent's with it. It writes its results as
data into the job's folder: ``rank<r>.safetensors`` (the local value of every node that
computes, as this rank holds it) and ``rank<r>.json`` (what each node is: module, op,
inputs, DTensor placements; the forward's time; notes), or ``rank<r>.error`` (one line)
when anything fails. The outputs its forward returned travel in the same files (under
``output:NAME``), so that the parent compares every rank's every output. The parent
(``launch``) reads them; it never trusts a rank's exit. Before anything else, a rank ties
itself to the parent (``lifeline``): it ends, and removes the folder, when the parent ends.

The port's contract: ``build(reference)`` runs after the process group is initialised
(it may read ``get_rank()``/``get_world_size()``) and its forward calls the collectives
itself. Its forward is called plainly twice (the truth runs, timed between barriers,
which must agree), then recorded (``introspect.diff.ops.eager``) with the collectives made
visible (``collectives``) and replayed in step on every rank; a replay that does not give
the truth outputs bit for bit is said, and the parent fails the diff.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from introspect.run.modes import set_mode

# Environment variables torchrun sets for each rank; a port may read them.
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "MASTER_ADDR", "MASTER_PORT")


# DTensor's conversions: the same values as their input, in another wrapping.
CONVERSIONS = frozenset({"from_local", "to_local"})
# The port's outputs in a rank's values file, beside the nodes (fx names hold no colon).
OUTPUT_PREFIX = "output:"


@dataclass(frozen=True)
class RankJob:
    """Everything a rank needs, picklable (the spawn start method sends it)."""

    folder: str  # the job's folder: inputs, reference, rendezvous file, results
    world_size: int
    spec: str  # the port: path/to/port.py:NAME or package.module:NAME
    label: str
    backend: str  # gloo or nccl
    timeout: float  # seconds any collective may wait for the other ranks
    master_port: int  # for ports and libraries that read MASTER_ADDR/MASTER_PORT
    lifeline: Any = None  # a lifeline.Lifeline: how this rank follows its parent


def result_path(folder: str | Path, rank: int, suffix: str) -> Path:
    return Path(folder) / f"rank{rank}.{suffix}"


def run_rank(rank: int, job: RankJob, reference: Any = None) -> None:
    """A rank's whole life; never raises: a failure is written as ``rank<r>.error``."""
    from introspect.diff.parallel.lifeline import follow_parent, leave

    if job.lifeline is not None:
        follow_parent(job.lifeline, rank)
    log = open(result_path(job.folder, rank, "log"), "w")  # noqa: SIM115  # the port's prints
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    try:
        _run(rank, job, reference)
    except BaseException as e:  # the port's code: anything it raises is this rank's error
        message = _one_line(e)
        traceback.print_exc(file=log)
        log.flush()
        _write_text(result_path(job.folder, rank, "error"), message)
        if job.lifeline is not None:  # the parent gone: the folder is this rank's to remove
            leave(job.lifeline, 3)
        os._exit(3)  # no atexit handlers, no process-group teardown that could hang
    log.flush()


def _run(rank: int, job: RankJob, reference: Any) -> None:
    import torch
    import torch.distributed as dist

    from introspect.diff.parallel.collectives import traced_collectives

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(job.world_size),
                       "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(job.world_size),
                       "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(job.master_port)})
    torch.manual_seed(0)
    # as torchrun does: the ranks share the cores instead of each taking them all
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // job.world_size))
    with traced_collectives():
        if job.backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(job.backend, init_method=f"file://{job.folder}/rendezvous",
                                rank=rank, world_size=job.world_size,
                                timeout=datetime.timedelta(seconds=job.timeout))
        _stage(job, rank, "loading the reference")
        if reference is None:  # spawned: the parent wrote it for us
            reference = torch.load(Path(job.folder) / "reference.pt", weights_only=False,
                                   mmap=True)
        inputs = _read_inputs(Path(job.folder) / "inputs.safetensors", job.backend)
        _stage(job, rank, "in build")
        model = _build(job.spec, reference)
        _stage(job, rank, "in its forward")
        seconds, truth = _truth_runs(model, inputs)
        _stage(job, rank, "recording its forward")
        values, nodes, notes = _record(model, inputs, job.label, truth)
        _stage(job, rank, "writing its values")
        _write(job.folder, rank, values, nodes, notes, seconds, truth)
        dist.barrier()
        dist.destroy_process_group()


_STAGES: dict[str, float] = {}  # stage -> wall clock when it began (time.time())


def _stage(job: RankJob, rank: int, stage: str) -> None:
    """Where the rank is, for the parent to say when it stops waiting (and when)."""
    _STAGES[stage] = time.time()
    _write_text(result_path(job.folder, rank, "stage"), stage)


def _read_inputs(path: Path, backend: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    device = "cuda" if backend == "nccl" else "cpu"
    return load_file(str(path), device=device)


def _build(spec: str, reference: Any) -> Any:
    from introspect.models.ports import build_port, resolve_builder

    model = build_port(spec, resolve_builder(spec), reference)
    set_mode(model, False)
    return model


def _truth_runs(model: Any, inputs: dict[str, Any]) -> tuple[float, Any]:
    """The port called plainly, twice; the second call's seconds (between barriers)."""
    import torch
    import torch.distributed as dist

    from introspect.diff.ops.eager import outputs_as_dict

    first = outputs_as_dict(model(**{k: v.clone() for k, v in inputs.items()}))
    dist.barrier()
    _synchronize()
    start = time.perf_counter()
    second = outputs_as_dict(model(**{k: v.clone() for k, v in inputs.items()}))
    _synchronize()
    seconds = time.perf_counter() - start
    dist.barrier()
    for name, value in first.items():
        again = second.get(name)
        if isinstance(value, torch.Tensor) and not (
                isinstance(again, torch.Tensor) and same(_local(again), _local(value))):
            raise RuntimeError(f"the port's output {name} differs between two calls on the same "
                               "inputs (dropout or random numbers left on?)")
    return seconds, first


def same(a: Any, b: Any) -> bool:
    """Bit for bit the same, NaN where NaN (``torch.equal`` calls NaN unequal to itself)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    if not a.is_floating_point():
        return False
    nan = a.isnan()
    return bool(torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan]))


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _record(model: Any, inputs: dict[str, Any], label: str, truth: dict[str, Any]
            ) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """Every computing node's value, as this rank holds it, and what each node is."""
    import torch

    from introspect.diff.ops.explain import record_for_diff
    from introspect.diff.parallel.local_values import record_local_values
    from introspect.dump.capture import select_records

    graph, accepted, _ = record_for_diff(model, inputs, label)
    chosen = select_records(graph.records)
    output = next(n for n in graph.gm.graph.nodes if n.op == "output")
    returned = {k: v.name for k, v in output.args[0].items() if isinstance(v, torch.fx.Node)}
    keep = {r.name for r in chosen} | set(returned.values())
    values, placements = record_local_values(graph.gm, graph.input_names, accepted, keep)
    notes = []
    differing = [name for name, node in returned.items() if name in truth
                 and not (node in values and same(values[node], _local(truth[name])))]
    if differing:
        notes.append(f"its recording did not replay its truth run ({', '.join(differing)} "
                     "differ): a collective the recorder cannot see?")
    kept_records = [r for r in chosen if r.name in values and r.op_type not in CONVERSIONS]
    kept_names = {r.name for r in kept_records}
    by_name = {r.name: r for r in graph.records}
    nodes: list[dict[str, Any]] = [
        {"name": r.name, "module": r.module, "layer": r.layer, "op": r.op_type,
         "sources": _sources(r.name, by_name, kept_names),
         "placements": placements[r.name]} for r in kept_records]
    kept = {r.name: values[r.name] for r in kept_records}
    return kept, nodes, notes


def _sources(name: str, records: dict[str, Any], kept: set[str]) -> list[str]:
    """The kept nodes ``name`` reads, through the layout ops and conversions between."""
    found: list[str] = []
    stack = list(records[name].inputs)
    seen: set[str] = set()
    while stack:
        node = stack.pop(0)
        if node in seen or node not in records:
            continue
        seen.add(node)
        if node in kept:
            found.append(node)
        elif records[node].op not in ("placeholder", "get_attr"):
            stack.extend(records[node].inputs)
    return found


def _local(value: Any) -> Any:
    """A DTensor's local shard; any other tensor as it is."""
    to_local = getattr(value, "to_local", None)
    return to_local() if callable(to_local) else value


def _write(folder: str, rank: int, values: dict[str, Any], nodes: list[dict[str, Any]],
           notes: list[str], seconds: float, outputs: dict[str, Any]) -> None:
    import torch
    from safetensors.torch import save_file

    from introspect.diff.parallel.local_values import local_copy, placements

    tensors = {k: v.detach().cpu().contiguous() for k, v in values.items()}
    returned = {k: v for k, v in outputs.items() if isinstance(v, torch.Tensor)}
    tensors.update({OUTPUT_PREFIX + k: local_copy(v).cpu().contiguous()
                    for k, v in returned.items()})
    layouts = {k: {"placements": placements(v), "shape": list(v.shape)}
               for k, v in returned.items()}
    save_file(tensors, str(result_path(folder, rank, "safetensors.tmp")))
    os.replace(result_path(folder, rank, "safetensors.tmp"),
               result_path(folder, rank, "safetensors"))
    _write_text(result_path(folder, rank, "json"),
                json.dumps({"nodes": nodes, "notes": notes, "forward_seconds": seconds,
                            "outputs": layouts, "stages": _STAGES, "done": time.time()}))


def _write_text(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    os.replace(partial, path)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    if isinstance(error, SystemExit):
        return f"exited (sys.exit({error.code!r}))"
    from introspect.errors import InputError

    if isinstance(error, InputError) and text:  # already says what failed, in one line
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
