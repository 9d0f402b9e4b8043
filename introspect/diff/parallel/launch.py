"""Start N ranks the way ``torchrun`` does, wait for them, and read back what they wrote.

Each rank is a process of its own (spawned as torchrun does, fresh, on CUDA; forked on
the CPU, where it starts in a fraction of a second) with torchrun's environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); the group
meets through a file in the job's folder, gloo on the CPU, NCCL on CUDA. The parent never
waits on a rank blindly: a rank that writes an error, exits, or outlives the deadline ends
the job, every other rank is killed, and the error names the rank. Results come back as
data (safetensors and JSON).
"""

from __future__ import annotations

import json
import multiprocessing
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from introspect.diff.parallel.rank import RankJob, result_path, run_rank
from introspect.errors import InputError

POLL_SECONDS = 0.05
GRACE_SECONDS = 1.0
# How a collective fails when another rank is gone: that rank is to blame, not this one.
_PEER_FAILED = ("remote worker", "closed by peer", "reset by peer", "Connection refused",
                "Broken pipe", "Timed out", "timed out")


@dataclass
class RankResult:
    """What one rank sent back."""

    rank: int
    values: dict[str, torch.Tensor]  # node name -> this rank's local value
    nodes: list[dict[str, Any]]  # in graph order: name, module, layer, op, inputs, placements
    notes: list[str] = field(default_factory=list)
    forward_seconds: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)  # stage -> when it began (epoch s)
    done: float = 0.0  # when the rank had written its values (epoch s)


def run_ranks(folder: Path, nproc: int, spec: str, label: str, *, backend: str = "gloo",
              timeout: float = 600.0, start_method: str | None = None,
              reference: Any = None) -> list[RankResult]:
    """Run the port on ``nproc`` ranks; every rank's results, in rank order.

    ``start_method``: ``spawn`` (fresh interpreters, as torchrun starts them; the default
    with NCCL, as CUDA needs) or ``fork`` (the default on the CPU: the ranks start in a
    fraction of a second instead of importing torch and transformers again, and read the
    parent's ``reference`` copy-on-write, with no second copy of the weights; under
    ``spawn`` they load ``reference.pt`` from ``folder``, memory-mapped).

    Raises:
        InputError: a rank raised (its one-line error, its rank), exited, or did not
            finish within ``timeout`` seconds; the other ranks are killed first.
    """
    method = start_method or ("spawn" if backend == "nccl" else "fork")
    if method not in ("spawn", "fork"):
        raise InputError(f"start method {method!r}: expected spawn or fork")
    context: Any = multiprocessing.get_context(method)
    # a collective waits a little longer than the run may take: the parent, which knows
    # every rank, speaks first
    job = RankJob(str(folder), nproc, spec, label, backend, timeout + 30, _free_port())
    inherited = reference if method == "fork" else None  # never pickled under fork
    processes = [context.Process(target=run_rank, args=(rank, job, inherited), daemon=True,
                                 name=f"introspect-rank{rank}") for rank in range(nproc)]
    try:
        for process in processes:
            process.start()
        _wait(processes, folder, timeout)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
        for process in processes:
            process.join(5)
    return [_read(folder, rank) for rank in range(nproc)]


def _wait(processes: list[Any], folder: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if any(result_path(folder, r, "error").exists() or p.exitcode not in (None, 0)
               for r, p in enumerate(processes)):
            # a rank that died makes its peers fail in their collectives at once: give it
            # a moment to be seen, and blame it before them
            time.sleep(GRACE_SECONDS)
            for rank, process in enumerate(processes):
                if process.exitcode not in (None, 0) and \
                        not result_path(folder, rank, "error").exists():
                    raise InputError(f"rank {rank} of {len(processes)} exited with code "
                                     f"{process.exitcode} before writing its values"
                                     f"{_last_line(folder, rank)}")
            errors = []
            for rank in range(len(processes)):
                error = result_path(folder, rank, "error")
                if error.exists():
                    text = error.read_text()
                    errors.append((any(p in text for p in _PEER_FAILED), error.stat().st_mtime_ns,
                                   rank, text))
            if errors:  # the first rank that failed on its own, not because a peer went
                _, _, rank, text = min(errors)
                raise InputError(f"rank {rank} of {len(processes)}: {text}")
        if all(p.exitcode == 0 for p in processes):
            missing = [r for r in range(len(processes))
                       if not result_path(folder, r, "json").exists()]
            if missing:
                raise InputError(f"rank {missing[0]} of {len(processes)} exited (code 0) "
                                 "before writing its values: the port ended its process")
            return
        if time.monotonic() > deadline:
            waiting = [f"rank {r} ({_stage(folder, r)})" for r, p in enumerate(processes)
                       if p.exitcode is None]
            raise InputError(f"{', '.join(waiting)} of {len(processes)} did not finish within "
                             f"{timeout:g} s (a rank that hangs, or a collective one rank "
                             "never reached?); the ranks were stopped")
        time.sleep(POLL_SECONDS)


def _stage(folder: Path, rank: int) -> str:
    stage = result_path(folder, rank, "stage")
    return stage.read_text() if stage.exists() else "starting"


def _last_line(folder: Path, rank: int) -> str:
    log = result_path(folder, rank, "log")
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return f" (its last line: {lines[-1][:200]})" if lines else ""


def _read(folder: Path, rank: int) -> RankResult:
    from safetensors.torch import load_file

    described = json.loads(result_path(folder, rank, "json").read_text())
    values = load_file(str(result_path(folder, rank, "safetensors")))
    return RankResult(rank, values, described["nodes"], described["notes"],
                      described["forward_seconds"], described.get("stages", {}),
                      described.get("done", 0.0))


def _free_port() -> int:
    """A port for MASTER_PORT (the group itself meets through a file, never this port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
