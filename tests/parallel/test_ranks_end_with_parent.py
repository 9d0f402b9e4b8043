"""Ranks end with their parent, whatever ends it, and leave no folder behind.

The port (written into the test's folder: it imports nothing from introspect) keeps rank 1
asleep in its build while rank 0 goes on to wait for it in a collective; each rank writes
its pid once it is there. The parent is then stopped (SIGTERM, SIGHUP), killed (SIGKILL)
or crashes (``os.abort`` in a thread of a script calling ``introspect.diff``). Within a few
seconds no rank may be left (``/proc``, a zombie counts as gone: its reaper is PID 1's
business) and no ``introspect-ranks-*`` folder either.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

PORT = '''
import os, sys, time
from pathlib import Path
import torch.distributed as dist

MARKS = Path(os.environ["RANK_MARKS"])


def build(reference):
    rank = dist.get_rank()
    (MARKS / f"rank{rank}.tmp").write_text(str(os.getpid()))
    os.replace(MARKS / f"rank{rank}.tmp", MARKS / f"rank{rank}")
    if rank == 1:
        time.sleep(3600)  # a build that takes its time; rank 0 waits in a collective
    return reference.model
'''

CRASHING_PARENT = '''
import os, sys, threading, time
from pathlib import Path

import introspect
from introspect.models.load import load_model, tokenize

marks = Path(os.environ["RANK_MARKS"])


def crash():
    while len([m for m in marks.iterdir() if not m.name.endswith(".tmp")]) < 2:
        time.sleep(0.1)
    time.sleep(1.0)
    os.abort()  # the parent crashes: no handler, no finally


threading.Thread(target=crash, daemon=True).start()
loaded = load_model("bert-tiny")
introspect.diff(loaded.model, sys.argv[1], tokenize(loaded.tokenizer), nproc=2)
'''


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def _hang_up_as_a_terminal_does() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.parametrize("ending", ["SIGTERM", "SIGHUP", "SIGKILL", "crash"])
def test_ranks_and_their_folder_end_with_the_parent(tmp_path, ending):
    marks, temp = tmp_path / "marks", tmp_path / "tmp"
    marks.mkdir()
    temp.mkdir()
    port = tmp_path / "sleepy_port.py"
    port.write_text(PORT)
    env = {**os.environ, "RANK_MARKS": str(marks), "TMPDIR": str(temp),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if ending == "crash":
        script = tmp_path / "parent.py"
        script.write_text(CRASHING_PARENT)
        argv = [sys.executable, str(script), f"{port}:build"]
    else:
        argv = [sys.executable, "-m", "introspect", "diff", "--model", "bert-tiny",
                "--candidate", f"{port}:build", "--nproc", "2", "-q"]
    # (a run under nohup ignores SIGHUP, and so would the parent: a nohup'ed run is meant
    # to outlive a hang-up, and its handler is rightly not installed. The parent here is
    # one a terminal started.)
    parent = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True,
                              preexec_fn=_hang_up_as_a_terminal_does)
    pids: list[int] = []
    try:
        assert _wait_for(lambda: (marks / "rank0").exists() and (marks / "rank1").exists(),
                         180), parent.stderr.read().decode()[-2000:] if parent.poll() else ""
        pids = [int((marks / f"rank{r}").read_text()) for r in range(2)]
        assert all(_alive(pid) for pid in pids)
        # named for ps: introspect-r0, introspect-r1
        assert [Path(f"/proc/{pid}/comm").read_text().strip() for pid in pids] == \
            ["introspect-r0", "introspect-r1"]
        assert list(temp.glob("introspect-ranks-*"))
        time.sleep(1.0)  # rank 0 is in its collective by now
        if ending != "crash":
            parent.send_signal(getattr(signal, ending))
        parent.wait(60)
        assert _wait_for(lambda: not any(_alive(pid) for pid in pids), 10), \
            f"ranks still running after the parent's {ending}: {pids}"
        assert _wait_for(lambda: not list(temp.glob("introspect-ranks-*")), 10), \
            f"the ranks' folder is left after the parent's {ending}: " \
            f"{[p.name for p in temp.glob('introspect-ranks-*/*')]} " \
            f"{[p.read_text()[-800:] for p in temp.glob('introspect-ranks-*/*.log')]}; " \
            f"the parent's last words: {parent.stderr.read().decode()[-1500:]!r}"
        if ending in ("SIGTERM", "SIGHUP"):  # the signal delivered again once cleaned up
            assert parent.returncode == -getattr(signal, ending)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
