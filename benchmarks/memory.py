"""Fresh processes: the peak resident set of one job, and a clean interpreter for torchlens.

Each job runs in a new process forked from a server that has imported torch,
transformers and introspect but never built a model or run one (multiprocessing's
"forkserver"). So every job starts from the same state a fresh ``python`` would reach
after its imports, without paying the imports' seconds again, and its peak resident
set (VmHWM in /proc/self/status) counts the imports, the model it loads and the job.

torchlens refuses to capture in a multiprocessing child, and wraps torch's functions for
the rest of the process once it has; ``run_interpreter`` gives it a new interpreter.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Imported once by the fork server; a module that fails to import is simply not preloaded.
# transformers loads BERT's modules lazily, on first use: name them so the server has them.
PRELOAD = ["torch", "transformers", "transformers.models.bert.modeling_bert",
           "transformers.models.bert.tokenization_bert",
           "transformers.tokenization_utils_tokenizers",
           "introspect.graph", "introspect.diff.api", "introspect.scratch", "introspect.render",
           "benchmarks.cases", "benchmarks.alternatives", "benchmarks.jobs"]


class FreshProcessError(RuntimeError):
    """A job in a fresh process raised or died (killed for memory, for instance)."""


@dataclass(frozen=True)
class FreshResult:
    """What a fresh process returned, and its memory: after loading, and at its peak."""

    value: Any
    loaded_rss_mib: float
    peak_rss_mib: float


def start_server() -> None:
    """Start the fork server now, so its imports overlap with work in this process."""
    _context()
    from multiprocessing import forkserver

    forkserver.ensure_running()


def run_fresh(job: Callable[..., Any], *args: Any, threads: int) -> FreshResult:
    """Run ``job(mark_loaded, *args)`` in a fresh process and return its value and memory.

    ``job`` calls ``mark_loaded()`` once its model and inputs are ready, so the report
    can say what the task itself added on top of them.

    Raises:
        FreshProcessError: the job raised (its message is kept) or the process died.
    """
    context = _context()
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(job, args, threads, sender), daemon=True)
    process.start()  # daemon: ended with this process, never left running on Ctrl-C
    sender.close()
    try:
        status, payload = receiver.recv()
    except EOFError:
        process.join()
        raise FreshProcessError(
            f"the process running {job.__name__} died with exit code {process.exitcode}"
            " (killed for memory?)"
        ) from None
    finally:
        receiver.close()
    process.join()
    if status != "ok":
        raise FreshProcessError(f"{job.__name__} failed: {payload}")
    return payload


def run_interpreter(module: str, *args: str, threads: int, timeout: float) -> Any:
    """Run ``python -m module args`` in a new interpreter; return its last stdout line as JSON.

    Raises:
        FreshProcessError: it exited with an error, timed out, or printed no JSON.
    """
    import json
    import subprocess
    import sys

    environment = {**os.environ, "OMP_NUM_THREADS": str(threads),
                   "BENCH_THREADS": str(threads)}
    try:
        done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                              text=True, timeout=timeout, env=environment, check=False)
    except subprocess.TimeoutExpired as e:
        raise FreshProcessError(f"python -m {module} ran past {timeout:.0f} s") from e
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        errors = done.stderr.strip().splitlines()
        raise FreshProcessError(f"python -m {module} exited with {done.returncode}: "
                                f"{errors[-1] if errors else 'no output'}")
    try:
        return json.loads(lines[-1])
    except ValueError as e:
        raise FreshProcessError(f"python -m {module} printed no JSON: {lines[-1][:80]}") from e


def _context() -> Any:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def _child(job: Callable[..., Any], args: tuple[Any, ...], threads: int,
           sender: multiprocessing.connection.Connection) -> None:
    import torch

    torch.set_num_threads(threads)
    loaded: list[float] = []
    try:
        value = job(lambda: loaded.append(resident_mib()), *args)
        peak = peak_resident_mib()
        sender.send(("ok", FreshResult(value, loaded[0] if loaded else 0.0, peak)))
    except Exception as e:  # the parent reports it; the child must not die silently
        sender.send(("error", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
    finally:
        sender.close()


def resident_mib() -> float:
    """This process's resident set now (VmRSS), in MiB."""
    return _status_kib("VmRSS") / 1024


def peak_resident_mib() -> float:
    """This process's peak resident set so far (VmHWM; getrusage where /proc is missing)."""
    peak = _status_kib("VmHWM")
    if peak == 0:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return peak / 1024


def _status_kib(field: str) -> int:
    try:
        for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0
