"""Start N ranks the way ``torchrun`` does, wait for them, and read back what they wrote.

Each rank is a process of its own (spawned as torchrun does, fresh, on CUDA; forked on
the CPU, where it starts in a fraction of a second) with torchrun's environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); the group
meets through a file in the job's folder, gloo on the CPU, NCCL on CUDA. The parent never
waits on a rank blindly: a rank that writes an error, exits, or outlives the deadline ends
the job, every other rank is killed, and the error names the rank. Results come back as
data (safetensors and JSON). Each rank is tied to this process (``lifeline``): it ends when
this process ends, however it ends.
"""

from __future__ import annotations

import json
import multiprocessing
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from introspect.diff.parallel.lifeline import adopt, close_lifeline, kill_rank, open_lifeline
from introspect.diff.parallel.rank import OUTPUT_PREFIX, RankJob, result_path, run_rank
from introspect.errors import InputError

POLL_SECONDS = 0.05
GRACE_SECONDS = 1.0
MESSAGE_CHARS = 200  # a refusal is one line, and this short; the rank's log has the rest
# How a collective fails when another rank is gone: that rank is to blame, not this one.
_PEER_FAILED = ("remote worker", "closed by peer", "reset by peer", "Connection refused",
                "Broken pipe", "Timed out", "timed out")


@dataclass
class RankResult:
    """What one rank sent back."""

    rank: int
    values: dict[str, torch.Tensor]  # node name -> this rank's local value
    nodes: list[dict[str, Any]]  # in graph order: name, module, layer, op, inputs, placements
    # what the port's forward returned on this rank (its first truth run): output name ->
    # local value, and its DTensor placements and whole shape where it was a DTensor
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    output_layouts: dict[str, dict[str, Any]] = field(default_factory=dict)
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
    line = open_lifeline(str(folder), forked=method == "fork")
    # a collective waits a little longer than the run may take: the parent, which knows
    # every rank, speaks first
    job = RankJob(str(folder), nproc, spec, label, backend, timeout + 30, _free_port(), line)
    inherited = reference if method == "fork" else None  # never pickled under fork
    processes = [context.Process(target=run_rank, args=(rank, job, inherited), daemon=True,
                                 name=f"introspect-rank{rank}") for rank in range(nproc)]
    try:
        for process in processes:
            process.start()
            adopt(process.pid)
        _wait(processes, folder, timeout)
        return [_read(folder, rank) for rank in range(nproc)]
    finally:
        for process in processes:
            kill_rank(process)
        for process in processes:
            process.join(5)
        close_lifeline(line)  # the ranks are gone: their end of file means nothing now


def _wait(processes: list[Any], folder: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    n = len(processes)
    while True:
        if any(result_path(folder, r, "error").exists() or p.exitcode not in (None, 0)
               or _ended_unwritten(folder, r, p) for r, p in enumerate(processes)):
            # a rank that died makes its peers fail in their collectives at once: give it
            # a moment to be seen, and blame it before them
            time.sleep(GRACE_SECONDS)
            for rank, process in enumerate(processes):
                if process.exitcode not in (None, 0) and \
                        not result_path(folder, rank, "error").exists():
                    raise InputError(_short(
                        f"rank {rank} of {n} {_exit_words(process.exitcode)} "
                        f"{_stage(folder, rank, 'while ')} before writing its values"
                        f"{_last_line(folder, rank)}"))
            for rank, process in enumerate(processes):  # os._exit(0): as if all went well
                if _ended_unwritten(folder, rank, process):
                    raise InputError(_short(
                        f"rank {rank} of {n} ended its own process with exit code 0 "
                        f"{_stage(folder, rank, 'while ')} before writing its values "
                        "(os._exit in the port?)"))
            errors = []
            for rank in range(len(processes)):
                error = result_path(folder, rank, "error")
                if error.exists():
                    text = error.read_text()
                    errors.append((any(p in text for p in _PEER_FAILED), error.stat().st_mtime_ns,
                                   rank, text))
            if errors:  # the first rank that failed on its own, not because a peer went
                _, _, rank, text = min(errors)
                raise InputError(_short(f"rank {rank} of {n}: {text}"))
        if all(p.exitcode == 0 for p in processes):
            return
        if time.monotonic() > deadline:
            waiting = [f"rank {r} ({_stage(folder, r)})" for r, p in enumerate(processes)
                       if p.exitcode is None]
            shown = ", ".join(waiting[:3]) + (f" and {len(waiting) - 3} more" if
                                              len(waiting) > 3 else "")
            raise InputError(_short(f"{shown} of {n} did not finish within {timeout:g} s (a "
                                    "rank that hangs, or a collective one rank never "
                                    "reached?); the ranks were stopped"))
        time.sleep(POLL_SECONDS)


def _ended_unwritten(folder: Path, rank: int, process: Any) -> bool:
    """Exit code 0 with neither values nor an error: the port ended the process itself."""
    return process.exitcode == 0 and not result_path(folder, rank, "json").exists() \
        and not result_path(folder, rank, "error").exists()


def _exit_words(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    return f"exited with code {code}"


def _short(text: str, limit: int = MESSAGE_CHARS) -> str:
    """One line of at most ``limit`` characters (the rank's log holds the whole): the
    middle gives way, so the rank's name and the error's own end both stay."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} ... {text[-(limit - 5 - half):]}"


def _stage(folder: Path, rank: int, prefix: str = "") -> str:
    stage = result_path(folder, rank, "stage")
    return prefix + (stage.read_text() if stage.exists() else "starting")


def _last_line(folder: Path, rank: int) -> str:
    log = result_path(folder, rank, "log")
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return f" (its last line: {lines[-1][:120]})" if lines else ""


def _read(folder: Path, rank: int) -> RankResult:
    from safetensors.torch import load_file

    described = json.loads(result_path(folder, rank, "json").read_text())
    values = load_file(str(result_path(folder, rank, "safetensors")))
    outputs = {name[len(OUTPUT_PREFIX):]: values.pop(name) for name in list(values)
               if name.startswith(OUTPUT_PREFIX)}
    return RankResult(rank, values, described["nodes"], outputs,
                      described.get("outputs", {}), described["notes"],
                      described["forward_seconds"], described.get("stages", {}),
                      described.get("done", 0.0))


def _free_port() -> int:
    """A port for MASTER_PORT (the group itself meets through a file, never this port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
