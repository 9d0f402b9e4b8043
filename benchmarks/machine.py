"""What the numbers were taken on: CPU, cores, memory, threads and library versions."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path


@dataclass(frozen=True)
class Machine:
    """The machine and software a benchmark run used; the report's header."""

    cpu: str  # model name from /proc/cpuinfo
    cores: int  # os.cpu_count()
    memory_gib: float  # MemTotal
    threads: int  # torch.get_num_threads() during the run
    python: str
    torch: str
    transformers: str
    graphviz: str  # ``dot -V``
    commit: str  # git HEAD of the working tree, "+dirty" when it has changes
    started: str  # UTC time the run started
    load_average: str  # 1, 5 and 15 minute load when the run started


def describe_machine(threads: int) -> Machine:
    """Read the machine's description; every field degrades to "unknown", never raises."""
    import torch
    import transformers

    return Machine(
        cpu=_cpu_model(),
        cores=os.cpu_count() or 0,
        memory_gib=_memory_gib(),
        threads=threads,
        python=platform.python_version(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        graphviz=_command_line(["dot", "-V"]) or "not installed",
        commit=_commit(),
        started=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        load_average=" / ".join(f"{x:.2f}" for x in os.getloadavg()),
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def _command_line(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if done.returncode == 0 and lines else ""


def _commit() -> str:
    head = _command_line(["git", "rev-parse", "--short", "HEAD"])
    if not head:
        return "unknown"
    dirty = _command_line(["git", "status", "--porcelain", "--untracked-files=no"])
    return f"{head}+dirty" if dirty else head
